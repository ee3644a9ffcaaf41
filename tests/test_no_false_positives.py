"""Correct-but-unusual Functions pass every contract: the suite's guard against false positives.

The zoo files hold legal patterns where a conformance suite is most tempted to complain:
trailing None returns, once_differentiable ops declared double_backward=False, setup_context,
set_materialize_grads(False) with None handling, non-differentiable index outputs, mark_dirty
declared in ``mutates``, saving the output, returning (an expanded view of) grad_output, a
straight-through estimator with ``surrogate``, declared nondeterminism, and results that cancel to
rounding noise (BatchNorm on constant rows).
"""

from __future__ import annotations

import pytest

from tests.conftest import ZOO

CORRECT_ZOO = (
    "unusual_correct_grads_and_memory.py", "unusual_correct_derivatives.py", "cancelling_correct.py", "correct_module.py",
    "spec_language_correct.py",
)


@pytest.mark.parametrize("zoo_file", CORRECT_ZOO)
def test_correct_functions_pass_every_contract(conformance_run, zoo_file: str) -> None:  # type: ignore[no-untyped-def]
    run = conformance_run(ZOO / zoo_file, max_examples=8)
    assert run.verdicts, "nothing was collected"
    failures = {key: verdict.text for key, verdict in run.verdicts.items() if verdict.outcome == "failed"}
    assert not failures, "\n\n".join(f"{k}:\n{text}" for k, text in failures.items())
    ran = {contract for (contract, _, _), verdict in run.verdicts.items() if verdict.outcome == "passed"}
    # Every contract that can run on CPU ran at least once (devices compares against CUDA).
    assert ran >= {
        "return_count", "grad_meta", "gradcheck", "needs_input_grad", "inplace", "saved_tensors",
        "layouts", "determinism", "reference", "stability",
    }, sorted(ran)
