"""Specs for the strategy meta-tests, built without registering them (the registry is global)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.spec import InputSpec, Spec


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, *args: Any) -> Any:
        return args[0].clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return grad


def make_spec(
    inputs: Sequence[InputSpec], *, dtypes: Sequence[torch.dtype] = (torch.float64, torch.float32), name: str = "meta"
) -> Spec:
    return Spec(
        fn=_Identity,
        name=name,
        inputs=tuple(inputs),
        reference=lambda *args: args[0],
        dtypes=tuple(dtypes),
        devices=("cpu",),
        double_backward=True,
        surrogate=None,
        mutates=(),
        nondeterministic=False,
    )


def collect_examples(strategy: st.SearchStrategy[Any], count: int) -> list[Any]:
    """Every value ``strategy`` generates in ``count`` derandomized examples (deterministic:
    coverage claims made on them cannot flake, unlike a stateful predicate passed to ``find``)."""
    seen: list[Any] = []

    @settings(max_examples=count, database=None, deadline=None, derandomize=True)
    @given(strategy)
    def collect(value: Any) -> None:
        seen.append(value)

    collect()
    return seen


def checked_spec(
    inputs: Sequence[InputSpec],
    *,
    dims: Sequence[Any] = (),
    dtypes: Sequence[torch.dtype] = (torch.float64, torch.float32),
    name: str = "meta",
    **fields: Any,
) -> Spec:
    """A spec validated and compiled as ``register`` does (dim rules, budgets), not registered."""
    from conformance.spec import _build_spec

    return _build_spec(
        _Identity, spec_name=name, inputs=inputs, reference=lambda *args: args[0], dtypes=dtypes, devices=("cpu",),
        double_backward=True, surrogate=None, mutates=(), nondeterministic=False, tolerances=fields.pop("tolerances", {}),
        origin=__name__, dims=dims, **fields,
    )
