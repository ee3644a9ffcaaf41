"""The core contracts catch the known-buggy Functions in tests/zoo/core_bugs.py, with messages
that say why, and pass the correct reference ops."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import ZOO
from tests.zoo_runs import CORE


@pytest.fixture
def core_bugs(zoo_run):  # type: ignore[no-untyped-def]
    return zoo_run("core_bugs")


def test_reference_ops_pass_core_contracts(conformance_run) -> None:  # type: ignore[no-untyped-def]
    run = conformance_run("reference_ops", contracts=CORE)
    assert {"square", "sigmoid", "linear", "logsumexp", "swish"} <= run.names()
    for (contract, name, device), verdict in run.verdicts.items():
        assert verdict.outcome == "passed", f"{contract}[{name}-{device}]:\n{verdict.text}"


def test_too_few_grads_fails_return_count(core_bugs) -> None:  # type: ignore[no-untyped-def]
    text = core_bugs.failed("return_count", "too_few_grads")
    assert "len(backward return)=1, but should be 2" in text
    assert "['scale'] is missing" in text


def test_extra_grad_fails_return_count(core_bugs) -> None:  # type: ignore[no-untyped-def]
    text = core_bugs.failed("return_count", "extra_grad")
    assert "len(backward return)=2, but should be 1" in text
    assert "not None" in text


def test_unreduced_bias_fails_grad_meta_but_gradcheck_passes(core_bugs) -> None:  # type: ignore[no-untyped-def]
    text = core_bugs.failed("grad_meta", "unreduced_bias_grad")
    assert "grad['bias'].shape=(" in text and "not reduced over the broadcast dims" in text
    core_bugs.passed("gradcheck", "unreduced_bias_grad")  # it judges the gradient the engine repaired: right values


def test_wrong_dtype_fails_grad_meta_but_gradcheck_passes(core_bugs) -> None:  # type: ignore[no-untyped-def]
    text = core_bugs.failed("grad_meta", "wrong_dtype_grad")
    assert "grad['x'].dtype=torch.float32, but should be torch.float64" in text
    core_bugs.passed("gradcheck", "wrong_dtype_grad")  # the engine casts it back: right values


def test_plain_gradcheck_misses_what_grad_meta_finds() -> None:
    """Why grad_meta exists: torch.autograd.gradcheck itself passes these Functions."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("core_bugs_direct", ZOO / "core_bugs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(module.WrongDtypeGrad.apply, (x,))


def test_missing_transpose_fails_gradcheck(core_bugs) -> None:  # type: ignore[no-untyped-def]
    text = core_bugs.failed("gradcheck", "missing_transpose")
    assert "analytical grad['weight'] != numerical: d output[0][" in text and "entries differ" in text, text
    # The worst entry and its row, not both Jacobians in full (torch's message: one line per row).
    assert "The worst entry's row:" in text and "numerical:tensor(" not in text, text
    core_bugs.passed("grad_meta", "missing_transpose")
    core_bugs.passed("return_count", "missing_transpose")


def test_failure_report_carries_repro_and_rerun(core_bugs) -> None:  # type: ignore[no-untyped-def]
    text = core_bugs.failed("grad_meta", "wrong_dtype_grad")
    assert "[grad_meta] WrongDtypeGrad ('wrong_dtype_grad')" in text
    assert "repro script: python " in text and "grad_meta-wrong_dtype_grad-cpu.py" in text
    assert "rerun: python -m pytest " in text and "--seed=0" in text and "--device=cpu" in text
    assert "case: torch.float64 on cpu; x: tensor(" in text
    # The report alone: no frames of the suite's internals, no second copy of the case from Hypothesis.
    assert "runner.py" not in text and "Draw 1 (case)" not in text and len(text.splitlines()) <= 12, text


def test_unreduced_broadcast_gradient_fails_grad_meta_only(core_bugs) -> None:  # type: ignore[no-untyped-def]
    # The strategies give broadcastable inputs size-1 and missing dims; the engine would sum the
    # unreduced gradients silently, so gradcheck passes while grad_meta sees the raw shape.
    text = core_bugs.failed("grad_meta", "unreduced_broadcast_mul")
    assert "not reduced over the broadcast dims" in text
    core_bugs.passed("gradcheck", "unreduced_broadcast_mul")  # the engine sums it: right values, so grad_meta only
    core_bugs.passed("return_count", "unreduced_broadcast_mul")
