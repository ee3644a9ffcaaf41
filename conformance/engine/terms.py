"""How large the terms are that a result is computed from: a running error bound of the truth.

A result can be far smaller than the numbers it is computed from: a LayerNorm output on a
constant row is ``(x - mean(x)) * rsqrt(var + eps)``, zero made of terms of size ``|x| * 300``;
attention's dK with a single key is exactly zero, made of ``P * (dP - D)`` terms of size
``|dO| * |V| * |Q|``. Any correct implementation that evaluates those terms in another order
(blockwise, fused, another layout) leaves rounding noise of *their* size, not of the result's.

:class:`TermMagnitudes` measures that size on the case. It is a ``TorchDispatchMode`` that
follows every aten op of the float64 truth's forward and backward and carries, next to each
floating tensor, a *shadow*: an elementwise bound on the sum of absolute values of the terms that
formed it (classic running error analysis). Linear ops are evaluated on the shadows with every
subtraction turned into an addition (``a - b`` -> ``S(a) + S(b)``, ``A @ B`` -> ``S(A) @ S(B)``,
softmax's backward ``P * (g - sum(g * P))`` -> ``P * (S(g) + sum(S(g) * P))``); any other op
(``exp``, ``rsqrt``, a fused kernel the suite does not know) starts afresh from ``|result|``,
which is what its own rounding is relative to. The shadow of a result never falls below
``|result|``.

The comparison layer uses the largest shadow of a result as the scale of its rounding-step floor
(:func:`conformance.engine.numerics.compare_budget`). A wrong kernel is off by O(1) of the result's
terms, a correct one by a few rounding steps of them.

The shadow charges a sum one rounding of its terms, as a pairwise or blocked sum nearly leaves it.
A kernel that adds n terms one after the other in float32 (a loop over row blocks) leaves up to
``(n - 1)`` float32 rounding steps of them, and shows it where the terms do not cancel (a constant
grad_output). :attr:`TermMagnitudes.accumulation` is the longest chain of float32 additions any
summation order may take on the way to a result: the reduction lengths along the way, added.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._decomp import decomposition_table
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["TermMagnitudes"]

aten = torch.ops.aten

def _is_float(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


# Probe step (relative to an input's error bound) for the derivative of an op with no rule.
_PROBE = 2.0**-30


class TermMagnitudes(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch does not annotate it
    """First-order running error bounds, in units of the rounding unit, for every floating
    tensor computed under it; :meth:`of` returns one for a result (``|result|`` if unseen).

    Inputs are exact (error 0). Each op adds its own rounding, measured on the *terms* it
    combines (``|a| + |b|`` for ``a - b``, ``|A| @ |B|`` for ``A @ B``), and carries its inputs'
    bounds through its linear part (``E(a*b) = E(a)|b| + |a|E(b)``). Elementwise ops with one
    input and no rule (``exp``, ``rsqrt``) carry it through their derivative, measured by a
    central difference; any other op starts afresh from ``|result|``.
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        # id -> (tensor, bound); the tensor is kept alive so the id stays its own.
        self._bounds: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._chains: dict[int, int] = {}  # id -> additions in sequence behind it (ids of _bounds' tensors)
        self.accumulation = 0  # the longest such chain of any result

    def _chain(self, value: Any) -> int:
        entry = self._bounds.get(id(value)) if isinstance(value, torch.Tensor) else None
        return self._chains.get(id(value), 0) if entry is not None and entry[0] is value else 0

    def of(self, tensor: torch.Tensor) -> torch.Tensor:
        entry = self._bounds.get(id(tensor))
        if entry is not None and entry[0] is tensor:
            return entry[1]
        return tensor.detach().abs()

    def _error(self, value: Any) -> Any:
        """The bound of a value computed under the mode: 0 for inputs (exact) and numbers."""
        if not isinstance(value, torch.Tensor):
            return 0.0
        entry = self._bounds.get(id(value))
        if entry is not None and entry[0] is value:
            return entry[1]
        return torch.zeros_like(value.detach(), dtype=value.dtype if value.is_floating_point() else torch.float64)

    def _moved(self, value: Any) -> Any:
        """For ops that move values: floating tensors become their bounds, the rest stays."""
        return self._error(value) if _is_float(value) else value

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        decomposition = _decomposition(func)
        if decomposition is not None:
            # A fused op (layer_norm, its backward, softmax, var): follow its decomposition, so
            # the terms it combines internally are measured like any others.
            try:
                with self:
                    return decomposition(*args, **kwargs)
            except Exception:
                pass
        out = func(*args, **kwargs)
        try:
            bound = self._propagate(func, args, kwargs, out)
        except Exception:  # an op the rules cannot replay: it starts afresh from |result|
            bound = None
        outs, _ = tree_flatten(out)
        bounds, _ = tree_flatten(bound) if bound is not None else ([None] * len(outs), None)
        if len(bounds) != len(outs):
            bounds = [None] * len(outs)
        inputs = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        chain = max((self._chain(a) for a in inputs), default=0) + _additions(func, args, out)
        self.accumulation = max(self.accumulation, chain)
        for result, carried in zip(outs, bounds):
            if not _is_float(result):
                continue
            fresh = result.detach().abs()
            if isinstance(carried, torch.Tensor) and carried.shape == result.shape:
                carried = carried.to(result.dtype).abs()
                fresh = torch.where(torch.isfinite(carried), torch.maximum(carried, fresh), fresh)
            self._bounds[id(result)] = (result, fresh)
            self._chains[id(result)] = chain
        return out

    def _propagate(self, func: Any, args: Any, kwargs: Any, out: Any) -> Any:
        name = func.overloadpacket.__name__
        if name.endswith("_") and not name.endswith("__"):
            # In-place: the functional op's bound becomes the mutated tensor's.
            functional = getattr(aten, name[:-1], None)
            if functional is None:
                return None
            func = getattr(functional, func._overloadname, None) or functional.default
            name = name[:-1]
        error, magnitude = self._error, _magnitude
        if name in _MOVES:
            return func(*tree_map(self._moved, args), **kwargs)
        if name in _LINEAR_REDUCTIONS:
            rest = args[1:]
            return func(error(args[0]), *rest, **kwargs) + func(magnitude(args[0]), *rest, **kwargs)
        if name in ("index_add", "scatter_add"):  # (self, dim, index, source)
            self_, dim, index, source = args[:4]
            return func(error(self_), dim, index, error(source), **kwargs) + func(
                magnitude(self_), dim, index, magnitude(source), **kwargs
            )
        if name == "neg":
            return error(args[0])
        if name in ("add", "sub", "rsub"):  # the new rounding is relative to the terms |a| + |b|
            a, b = args[0], args[1]
            alpha = abs(kwargs.get("alpha", 1))
            return error(a) + alpha * error(b) + magnitude(a) + alpha * magnitude(b)
        if name == "mul":
            a, b = args[0], args[1]
            return error(a) * magnitude(b) + magnitude(a) * error(b) + magnitude(out)
        if name == "div" and not kwargs.get("rounding_mode"):
            a, b = args[0], args[1]
            return error(a) / magnitude(b) + magnitude(a) * error(b) / (magnitude(b) ** 2) + magnitude(out)
        if name in _PRODUCTS:  # A @ B: E(A) @ |B| + |A| @ E(B) + |A| @ |B|
            a, b = args[-2], args[-1]
            bound = func(error(a), magnitude(b)) + func(magnitude(a), error(b)) + func(magnitude(a), magnitude(b))
            if name in ("addmm", "baddbmm", "addbmm", "addmv"):
                bound = bound * abs(kwargs.get("alpha", 1)) + abs(kwargs.get("beta", 1)) * (error(args[0]) + magnitude(args[0]))
            return bound
        if name == "where":  # either branch may be a number (torch.where(mask, x, 0))
            return torch.where(args[0], error(args[1]), error(args[2]))
        if name == "masked_fill":
            return aten.masked_fill.Scalar(error(args[0]), args[1], 0.0)
        if name == "_softmax_backward_data":  # P * (g - sum(g * P)): the terms are |g| and sum|g * P|
            grad, output, dim = args[0], args[1].detach(), args[2]
            carried = error(grad) + magnitude(grad)
            return output * (carried + (carried * output).sum(dim, keepdim=True))
        if name == "_log_softmax_backward_data":  # g - exp(out) * sum(g)
            grad, output, dim = args[0], args[1].detach(), args[2]
            carried = error(grad) + magnitude(grad)
            return carried + output.exp() * carried.sum(dim, keepdim=True)
        if name in _LINEAR_IN_FIRST:  # grad * f'(x)
            return magnitude(func(error(args[0]), *args[1:], **kwargs)) + magnitude(out)
        return self._through_derivative(func, args, kwargs, out)

    def _through_derivative(self, func: Any, args: Any, kwargs: Any, out: Any) -> Any:
        """|f'(a)| E(a) + |f(a)| for an elementwise op of one floating tensor, else None."""
        tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        if len(tensors) != 1 or not isinstance(args[0], torch.Tensor) or not isinstance(out, torch.Tensor):
            return None
        a = args[0]
        if not a.is_floating_point() or out.shape != a.shape:
            return None
        step = self._error(a) * _PROBE
        if not bool(step.any()):
            return None
        up = func(a.detach() + step, *args[1:], **kwargs)
        down = func(a.detach() - step, *args[1:], **kwargs)
        return (up - down).abs() / (2 * _PROBE) + out.detach().abs()


def _additions(func: Any, args: Any, out: Any) -> int:
    """How many additions one result of ``func`` may take in sequence: ``n - 1`` for a sum of n
    terms (a reduction, a product's inner dim, a convolution's window), else 0."""
    try:
        return max(_terms_per_result(func.overloadpacket.__name__.rstrip("_"), args, out) - 1, 0)
    except (AttributeError, IndexError, TypeError):
        return 0


def _terms_per_result(name: str, args: Any, out: Any) -> int:
    first = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if name == "cumsum" or name.endswith("softmax_backward_data"):  # along args[1] / args[2]
        dim = args[1] if name == "cumsum" else args[2]
        return int(first.shape[dim]) if first is not None and first.dim() else 1
    if name in _LINEAR_REDUCTIONS:
        results = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        return int(first.numel()) // max(int(results[0].numel()), 1) if first is not None and results else 1
    if name in _PRODUCTS and name != "outer":
        a = args[-2]
        return int(a.shape[-1]) if isinstance(a, torch.Tensor) and a.dim() else 1
    if name == "convolution":  # (input, weight, ...): a window of in_channels / groups * kernel
        return int(args[1].numel()) // max(int(args[1].shape[0]), 1)
    if name == "convolution_backward":  # (grad_output, input, weight, ...): also over batch and positions
        grad, weight = args[0], args[2]
        return max(int(grad.numel()) // max(int(grad.shape[1]), 1), int(weight.numel()) // max(int(weight.shape[1]), 1))
    if name in ("index_add", "scatter_add"):  # (self, dim, index, source): any number of sources may meet
        return int(args[3].numel())
    return 1


def _decomposition(func: Any) -> Any:
    """A Python decomposition of a fused op the rules do not cover, or None."""
    name = func.overloadpacket.__name__
    if name.endswith("_") or name in _FUSED_SKIP or name in _MOVES or name in _LINEAR_REDUCTIONS or name in _PRODUCTS:
        return None
    if name not in _FUSED:
        return None
    return decomposition_table.get(func)


def _magnitude(value: Any) -> Any:
    if isinstance(value, torch.Tensor):  # a bool or integer tensor (a mask, a count) is exact: its |value|
        value = value.detach()
        return value.abs() if value.is_floating_point() or value.is_complex() else value.to(torch.float64).abs()
    return abs(value) if isinstance(value, (int, float)) else value


# Ops that only move, select or copy values: bounds move with them.
_MOVES = {
    "view", "_unsafe_view", "reshape", "expand", "transpose", "t", "permute", "clone", "contiguous",
    "slice", "select", "unsqueeze", "squeeze", "cat", "stack", "index_select", "gather", "narrow",
    "flip", "roll", "repeat", "alias", "as_strided", "diagonal", "tril", "triu", "constant_pad_nd",
    "_to_copy", "unfold", "split", "split_with_sizes", "chunk", "unbind", "select_backward",
    "slice_backward", "index", "detach", "lift_fresh", "movedim", "expand_copy", "permute_copy",
    "view_copy", "transpose_copy", "squeeze_copy", "unsqueeze_copy", "_reshape_alias", "diag_embed",
    "copy", "expand_as", "index_put", "scatter", "masked_scatter", "diagonal_backward", "as_strided_scatter",
    "select_scatter", "slice_scatter", "new_empty_strided",
}
# Sums of terms: the carried bound is summed, and the new rounding is the sum of |terms|.
_LINEAR_REDUCTIONS = {"sum", "mean", "cumsum", "nansum", "sum_to_size"}
_PRODUCTS = {"mm", "bmm", "matmul", "mv", "dot", "outer", "addmm", "baddbmm", "addbmm", "addmv"}
# Fused ops followed through their decomposition (torch._decomp).
_FUSED = {
    "native_layer_norm", "native_layer_norm_backward", "native_batch_norm", "native_batch_norm_backward",
    "_native_batch_norm_legit", "_native_batch_norm_legit_no_training", "native_group_norm",
    "native_group_norm_backward", "_softmax", "_log_softmax", "var", "var_mean", "std", "std_mean",
    "logsumexp", "_fused_rms_norm", "_fused_rms_norm_backward", "linalg_vector_norm", "_euclidean_dist",
    "cdist", "_cdist_forward", "_cdist_backward", "binary_cross_entropy", "binary_cross_entropy_backward",
    "nll_loss_forward", "nll_loss_backward", "mse_loss", "mse_loss_backward", "huber_loss", "huber_loss_backward",
}
_FUSED_SKIP: set[str] = set()
# Elementwise backward ops that are ``grad * (a derivative)``: linear in their first argument.
_LINEAR_IN_FIRST = {
    "threshold_backward", "tanh_backward", "sigmoid_backward", "silu_backward", "gelu_backward",
    "hardtanh_backward", "leaky_relu_backward", "elu_backward", "softplus_backward", "hardsigmoid_backward",
    "hardswish_backward", "mish_backward", "logit_backward",
}
