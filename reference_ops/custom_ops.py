"""``torch.library`` custom ops: the same contracts as a Function, through the dispatcher.

Pattern shown: an op defined with ``@torch.library.custom_op`` (namespace ``conformance_ref``),
a fake (meta) kernel from ``register_fake`` so FakeTensor, ``torch.compile`` and ``opcheck`` can
trace it without running it, and autograd from ``register_autograd(backward,
setup_context=setup_context)``, where ``backward`` returns one gradient per op argument (None
for the float arguments).

* ``custom_softplus`` -- ``conformance_ref::softplus(x, beta)``: ``log(1 + exp(beta x)) / beta``,
  stably; the fused backward ``g * sigmoid(beta x)`` is plain torch ops on the saved input, so
  it is itself differentiable (double backward works).
* ``custom_rms_norm`` -- ``conformance_ref::rms_norm(x, weight, eps)``; its backward is a second
  custom op, ``conformance_ref::rms_norm_backward``, that computes both gradients in one pass
  the way a fused backward kernel does. That op has no autograd formula, so ``rms_norm`` is
  once differentiable: double backward raises (declared ``double_backward=False``).
* ``custom_swiglu`` -- ``conformance_ref::swiglu(a, b)``: ``silu(a) * b`` with separate gate and
  up tensors; fused backward ``d a = g * b * s * (1 + a (1 - s))``, ``d b = g * a * s`` with
  ``s = sigmoid(a)``, recomputed from the saved inputs in torch ops: differentiable.

A custom op's outputs must be fresh tensors (no aliases of its inputs), so every op returns a
new tensor even where a cast would be a no-op. Computation is in float32 for float16/bfloat16
(rounded once at the end, as a kernel accumulates) and in the input dtype for float32/float64.

Transforms: ``torch.compile`` (fullgraph), ``opcheck`` and ``vmap`` of the forward work.
``torch.func.grad`` / ``jacrev`` / ``vmap(grad)`` do not: the autograd.Function that
``register_autograd`` generates has no ``setup_context`` staticmethod, which torch.func requires
(torch 2.13; pytorch/pytorch#168393, #170834, #179652, open). No ``jvp`` can be registered on a
custom op, so forward-mode AD is unsupported too.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st

from conformance import Scalar, Tensor, register
from reference_ops._common import ALL_FLOATS, HALF_FLOATS

__all__ = ["rms_norm", "rms_norm_backward", "softplus", "swiglu"]


def _compute(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor in the compute dtype: float16/bfloat16 -> float32, else unchanged."""
    t = t.contiguous()
    return t.float() if t.dtype in HALF_FLOATS else t


# --- softplus ----------------------------------------------------------------------------------


@torch.library.custom_op("conformance_ref::softplus", mutates_args=())
def softplus(x: torch.Tensor, beta: float) -> torch.Tensor:
    """y = log(1 + exp(beta * x)) / beta (no linear threshold: exact at every x)."""
    z = _compute(x) * beta
    # max(z, 0) + log1p(exp(-|z|)): exp of a non-positive number only, no overflow.
    return ((torch.clamp(z, min=0) + torch.log1p(torch.exp(-z.abs()))) / beta).to(x.dtype)


@softplus.register_fake
def _(x: torch.Tensor, beta: float) -> torch.Tensor:
    return torch.empty_like(x)


def _softplus_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, beta = inputs
    ctx.save_for_backward(x)
    ctx.beta = beta  # a Python float: non-tensor state may live on ctx


def _softplus_backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None]:
    # Differentiable: torch ops on the saved input (not a saved sigmoid, which would be a
    # constant to double backward), so create_graph=True sees its dependence on x.
    (x,) = ctx.saved_tensors
    if not ctx.needs_input_grad[0]:
        return None, None
    slope = torch.sigmoid(_compute(x) * ctx.beta)
    return (_compute(grad_output) * slope).to(x.dtype), None


softplus.register_autograd(_softplus_backward, setup_context=_softplus_setup_context)

register(
    softplus,
    name="custom_softplus",
    inputs=[Tensor("x", "*batch n"), Scalar("beta", st.sampled_from([0.5, 1.0, 2.0]))],
    reference=lambda x, beta: torch.logaddexp(beta * x, torch.zeros_like(x)) / beta,
    dtypes=ALL_FLOATS,
)


# --- rms_norm ----------------------------------------------------------------------------------


def _rstd(xf: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)


@torch.library.custom_op("conformance_ref::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """y = x * rsqrt(mean(x**2, -1) + eps) * weight, over the last dim."""
    xf = _compute(x)
    return (xf * _rstd(xf, eps) * _compute(weight)).to(x.dtype)


@rms_norm.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("conformance_ref::rms_norm_backward", mutates_args=())
def rms_norm_backward(
    grad_output: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x, grad_weight) in one pass over the rows, rstd recomputed (not saved)."""
    d = x.shape[-1]
    xf = _compute(x).reshape(-1, d)
    g = _compute(grad_output).reshape(-1, d)
    rstd = _rstd(xf, eps)
    gw = g * _compute(weight)
    # d/dx [x * r] with r = (mean(x^2) + eps)^-1/2:  r * gw - x * r^3 * mean(gw * x)
    grad_x = rstd * gw - xf * (rstd * rstd * rstd) * (gw * xf).mean(dim=-1, keepdim=True)
    grad_weight = (g * (xf * rstd)).sum(0)  # sums over every row, so no batch dims remain
    return grad_x.reshape(x.shape).to(x.dtype), grad_weight.to(weight.dtype)


@rms_norm_backward.register_fake
def _(grad_output: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(weight)


def _rms_norm_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _rms_norm_backward_formula(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
    # Not differentiable: rms_norm_backward is an opaque op with no autograd formula of its own,
    # as a fused backward kernel would be; double backward raises (double_backward=False).
    x, weight = ctx.saved_tensors
    grad_x, grad_weight = rms_norm_backward(grad_output, x, weight, ctx.eps)
    # One fused op computes both; return only what autograd asked for.
    return (
        grad_x if ctx.needs_input_grad[0] else None,
        grad_weight if ctx.needs_input_grad[1] else None,
        None,
    )


rms_norm.register_autograd(_rms_norm_backward_formula, setup_context=_rms_norm_setup_context)

register(
    rms_norm,
    name="custom_rms_norm",
    inputs=[Tensor("x", "*batch d"), Tensor("weight", "d"), Scalar("eps", 1e-6)],
    reference=lambda x, weight, eps: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight,
    dtypes=ALL_FLOATS,
    double_backward=False,
    saves="inputs",  # backward recomputes rstd
)


# --- swiglu ------------------------------------------------------------------------------------


@torch.library.custom_op("conformance_ref::swiglu", mutates_args=())
def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """out = silu(a) * b = a * sigmoid(a) * b (a: gate, b: up), same shapes."""
    af = _compute(a)
    return (af * torch.sigmoid(af) * _compute(b)).to(a.dtype)


@swiglu.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.shape != b.shape:
        raise ValueError(f"swiglu: a.shape={tuple(a.shape)} and b.shape={tuple(b.shape)} must match")
    return torch.empty_like(a)


def _swiglu_setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    a, b = inputs
    ctx.save_for_backward(a, b)


def _swiglu_backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    # Differentiable: torch ops on the saved inputs, the sigmoid recomputed (not saved).
    a, b = ctx.saved_tensors
    af, g = _compute(a), _compute(grad_output)
    s = torch.sigmoid(af)
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        # silu'(a) = s * (1 + a * (1 - s)); a * (1 - s) -> 0 (not nan) as a -> +inf.
        grad_a = (g * _compute(b) * (s * (1 + af * (1 - s)))).to(a.dtype)
    if ctx.needs_input_grad[1]:
        grad_b = (g * (af * s)).to(b.dtype)
    return grad_a, grad_b


swiglu.register_autograd(_swiglu_backward, setup_context=_swiglu_setup_context)

register(
    swiglu,
    name="custom_swiglu",
    inputs=[Tensor("a", "*batch f"), Tensor("b", "*batch f")],
    reference=lambda a, b: torch.nn.functional.silu(a) * b,
    dtypes=ALL_FLOATS,
    saves="inputs",
)
