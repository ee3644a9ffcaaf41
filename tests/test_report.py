"""Meta-tests of the failure-report helpers and the probe."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import torch
from hypothesis import find

from conformance.engine.probe import probe
from conformance.engine.report import ContractFailure, describe_value, fail, finiteness_report, mismatch_report
from conformance.spec import registered
from strategies.cases import cases
from tests.conftest import REPO


def test_mismatch_report_counts_and_locates_the_greatest_difference() -> None:
    expected = torch.zeros(2, 3, dtype=torch.float64)
    actual = expected.clone()
    actual[1, 2] = 0.5
    actual[0, 0] = 0.01
    text = mismatch_report(actual, expected, allowed=0.1, baseline=0.02)
    assert "Mismatched elements: 1 / 6 (16.7%)" in text
    assert "Greatest absolute difference: 0.5 at index (1, 2)" in text
    assert "Baseline error (reference in the same dtype): 0.02" in text
    assert "Allowed: 0.1" in text


def test_mismatch_report_flags_non_finite_positions() -> None:
    expected = torch.tensor([1.0, float("nan"), float("inf")])
    same = mismatch_report(expected.clone(), expected, allowed=0.0)
    assert "Mismatched elements: 0 / 3" in same
    actual = torch.tensor([1.0, 2.0, float("inf")])
    text = mismatch_report(actual, expected, allowed=1.0)
    assert "Mismatched elements: 1 / 3" in text and "Non-finite mismatch at index (1,)" in text


def test_finiteness_report_lists_only_the_positions_that_differ() -> None:
    expected = torch.tensor([[1.0, -2.0, 3.0], [float("inf"), 5.0, 6.0]], dtype=torch.float64)
    actual = torch.tensor([[1.0 + 1e-3, float("inf"), 3.0], [float("inf"), float("nan"), 6.5]], dtype=torch.float64)
    differs = torch.isfinite(actual) != torch.isfinite(expected)
    text = finiteness_report(actual, expected, differs)
    assert "finiteness differs from the float64 reference: 2 / 6 (33.3%)" in text
    assert "at (0, 1): actual inf, float64 reference -2" in text and "at (1, 1): actual nan, float64 reference 5" in text
    # Finite differences (1e-3 at (0, 0), 0.5 at (1, 2)) are the reference contract's: not listed.
    assert "(0, 0)" not in text and "(1, 2)" not in text and "Allowed" not in text
    many = finiteness_report(torch.full((8,), float("inf")), torch.zeros(8), torch.ones(8, dtype=torch.bool), shown=3)
    assert many.count("  at (") == 3 and "... and 5 more" in many


def test_describe_value() -> None:
    assert describe_value(None) == "None"
    assert describe_value(torch.zeros(2, 3, dtype=torch.float16)) == "Tensor((2, 3), torch.float16, cpu)"


def test_fail_raises_one_report_with_the_contract_and_function() -> None:
    import reference_ops  # noqa: F401  (registers the reference ops)

    spec = next(s for s in registered() if s.name == "square")
    with pytest.raises(ContractFailure) as excinfo:
        fail("x=1, but should be 2 [f()]", "detail line", contract="demo", spec=spec)
    assert str(excinfo.value).splitlines()[:2] == ["[demo] Square ('square'): x=1, but should be 2 [f()]", "  detail line"]


def test_repro_snippet_runs_and_rebuilds_the_same_inputs() -> None:
    import reference_ops  # noqa: F401

    spec = next(s for s in registered() if s.name == "linear")
    case = find(cases(spec, device="cpu", dtypes=(torch.float64,)), lambda c: c.sizes.get("d_in", 0) >= 3)
    snippet = case.repro() + "\nprint(float(x.sum()), float(weight.sum()))"
    completed = subprocess.run([sys.executable, "-c", snippet], cwd=REPO, capture_output=True, text=True, check=False)
    assert completed.returncode == 0, completed.stderr
    x, weight = (t.detach() for t in case.args()[:2])
    assert completed.stdout.split() == [str(float(x.sum())), str(float(weight.sum()))]


class _Twice(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, k: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.stash = x  # a tensor kept on ctx: the probe must see it
        return x * k

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> Any:
        return grad_output.expand(2, *grad_output.shape), None


def test_probe_sees_raw_returns_before_the_engine_reduces_them() -> None:
    probed, recorder = probe(_Twice)
    assert probed.__name__ == "_Twice" and issubclass(probed, _Twice)
    x = torch.ones(3, requires_grad=True)
    out = probed.apply(x, 2.0)
    assert type(out.grad_fn).__name__ == "_TwiceBackward"
    (grad,) = torch.autograd.grad(out, x, torch.ones(3))
    call = recorder.last
    assert tuple(call.raw[0].shape) == (2, 3)  # what backward returned ...
    assert tuple(grad.shape) == (3,)  # ... and what the engine silently made of it
    assert call.needs_input_grad == (True, False)
    assert [held.path for held in call.ctx_held] == ["ctx.stash"]
    assert len(call.saved_tensors) == 1 and torch.equal(call.saved_before[0], x.detach())
