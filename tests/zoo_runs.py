"""The suite runs on zoo files that several test modules read: one definition each, so a module's
checks and the repro-script test read the very same run (made once per worker: tests/conftest.py
caches runs by their arguments and groups their readers on one xdist worker)."""

from __future__ import annotations

from dataclasses import dataclass

CORE = ("return_count", "grad_meta", "gradcheck")
DERIVATIVE_BEHAVIOUR = ("gradgradcheck", "layouts", "determinism", "devices")
MEMORY_BEHAVIOUR = ("needs_input_grad", "unneeded_grads", "inplace", "saved_tensors", "undefined_grads")
NUMERIC = ("reference", "stability")
TRITON_BUG_CONTRACTS = ("return_count", "grad_meta", "inplace", "gradcheck", "reference")


@dataclass(frozen=True)
class ZooRun:
    file: str  # in tests/zoo/
    group: str  # the test module that reads it; other readers join that module's xdist group
    contracts: tuple[str, ...] = ()  # empty: every contract
    max_examples: int = 5
    extra: tuple[str, ...] = ()  # more command-line options


ZOO_RUNS = {
    "beyond_eager_bugs": ZooRun("beyond_eager_bugs.py", "test_beyond_eager", (), 10),
    "core_bugs": ZooRun("core_bugs.py", "test_core_contracts", CORE),
    "derivative_layout_determinism_bugs": ZooRun(
        "derivative_layout_determinism_bugs.py", "test_derivative_layout_determinism_device_contracts",
        (*DERIVATIVE_BEHAVIOUR, "gradcheck"), 10,
    ),
    "grad_and_memory_bugs": ZooRun(
        "grad_and_memory_bugs.py", "test_grad_and_memory_contracts", (*MEMORY_BEHAVIOUR, "gradcheck"), 4
    ),
    "global_state_bugs": ZooRun("global_state_bugs.py", "test_global_state", (), 4),
    "gradcheck_bugs": ZooRun("gradcheck_bugs.py", "test_gradcheck_tolerance", ("gradcheck",), 3),
    "memory_bugs": ZooRun("memory_bugs.py", "test_memory_contracts", (), 8),
    "numeric_bugs": ZooRun("numeric_bugs.py", "test_numerical_contracts", NUMERIC, 4),
    "real_world_bugs": ZooRun("real_world_bugs.py", "test_trust", (), 8),
    "real_world_correct": ZooRun("real_world_correct.py", "test_trust", (), 8),
    "spec_language_bugs": ZooRun("spec_language_bugs.py", "test_spec_language_kernels", (), 12),
    "transposed_grad_output_bugs": ZooRun(
        "transposed_grad_output_bugs.py", "test_trust", ("inplace", "reference"), 3
    ),
    "triton_bugs": ZooRun("triton_bugs.py", "test_triton_kernels", TRITON_BUG_CONTRACTS, 4, ("--device=cpu",)),
    "vacuous": ZooRun("vacuous.py", "test_vacuous_passes", (), 5),
}
