"""Per-call choices that are not values: dtypes and which inputs require grad."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from conformance.spec import Spec
from strategies.reuse import sampled

__all__ = ["device_supports", "dtypes_for", "requires_grad_classes", "requires_grad_subsets"]


def device_supports(device: str, dtype: torch.dtype) -> bool:
    """Whether ``device`` can compute in ``dtype`` here (bfloat16 needs sm80+ on CUDA)."""
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return False
        if dtype == torch.bfloat16:
            return bool(torch.cuda.is_bf16_supported())
    return True


def dtypes_for(
    spec: Spec, device: str = "cpu", *, dtypes: Sequence[torch.dtype] | None = None
) -> st.SearchStrategy[torch.dtype]:
    """The dtypes ``spec`` declares that ``device`` supports, optionally narrowed to ``dtypes``.

    spec: a registered spec (its ``dtypes`` field, e.g. float64/float32/float16/bfloat16).
    device: ``"cpu"`` or ``"cuda"``; CUDA without bfloat16 support drops bfloat16.
    dtypes: only these (e.g. from ``--dtypes``); None for all of the spec's.
    Shrinks towards the spec's first dtype. Example: ``dtypes_for(spec, "cpu").example() -> torch.float32``.
    """
    if not isinstance(device, str) or not device:
        raise InvalidArgument(f"device={device!r} must be a device string such as 'cpu' or 'cuda'")
    chosen = [d for d in spec.dtypes if device_supports(device, d)]
    if dtypes is not None:
        chosen = [d for d in chosen if d in tuple(dtypes)]
    if not chosen:
        raise InvalidArgument(
            f"no dtype left for spec {spec.name!r} on device={device!r}: spec dtypes {spec.dtypes}, dtypes={dtypes!r}"
        )
    return sampled(tuple(chosen))


def requires_grad_classes(names: Sequence[str], *, min_size: int = 0) -> tuple[frozenset[str], ...]:
    """One subset of each class the coverage phase runs: every name, each name alone, and (with
    ``min_size=0``) none; the bugs of a backward that assumes all of its inputs require grad.
    Example: ``requires_grad_classes(["q", "k"]) -> (frozenset({'q', 'k'}), frozenset({'q'}), frozenset({'k'}), frozenset())``.
    """
    classes = [frozenset(names), *(frozenset({name}) for name in names if len(names) > 1)]
    if min_size == 0:
        classes.append(frozenset())
    return tuple(dict.fromkeys(classes))


def requires_grad_subsets(names: Sequence[str], *, min_size: int = 0) -> st.SearchStrategy[frozenset[str]]:
    """Subsets of ``names`` (the differentiable inputs) that require grad: every subset can
    occur, including single inputs and, with ``min_size=0``, none at all.

    names: the differentiable input names.
    min_size: the smallest subset size (1 excludes the empty set).
    Shrinks towards the empty set (or the first ``min_size`` names).
    Example: ``requires_grad_subsets(["q", "k", "v"]).example() -> frozenset({'k'})``.
    """
    if isinstance(names, str) or len(set(names)) != len(list(names)):
        raise InvalidArgument(f"names={names!r} must be a sequence of distinct input names")
    if isinstance(min_size, bool) or not isinstance(min_size, int) or not 0 <= min_size <= len(names):
        raise InvalidArgument(f"min_size={min_size!r} must be an int in [0, len(names)={len(names)}]")
    if not names:
        return st.just(frozenset())
    return _subsets(tuple(names), min_size)


@functools.lru_cache(maxsize=1024)
def _subsets(names: tuple[str, ...], min_size: int) -> st.SearchStrategy[frozenset[str]]:
    """One strategy object per (names, min_size): Hypothesis validates a new one on its first draw."""
    # One boolean per name: every subset is equally reachable and each input shrinks
    # independently towards "no grad" (a list of sampled names would favour small subsets).
    flags = st.tuples(*(st.booleans() for _ in names))
    ordered = tuple(names)

    def subset(bits: tuple[bool, ...]) -> frozenset[str]:
        chosen = [n for n, bit in zip(ordered, bits, strict=True) if bit]
        # Top up with the first unchosen names (deterministic, no filtering) to reach min_size.
        chosen += [n for n in ordered if n not in chosen][: max(0, min_size - len(chosen))]
        return frozenset(chosen)

    return flags.map(subset)
