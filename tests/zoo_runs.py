"""The suite runs on zoo files that several tests read: one definition each, so a module's checks
and the repro-script test read the very same run (made once per session: tests/conftest.py caches
runs by their arguments, across xdist workers too)."""

from __future__ import annotations

from dataclasses import dataclass

CORE = ("return_count", "grad_meta", "gradcheck")
DERIVATIVE_BEHAVIOUR = ("gradgradcheck", "layouts", "determinism", "devices")
MEMORY_BEHAVIOUR = ("needs_input_grad", "unneeded_grads", "inplace", "saved_tensors", "undefined_grads")
NUMERIC = ("reference", "stability")
CORNER_OWNERS = ("return_count", "reference", "gradcheck", "unwritten_memory", "func")
TRITON_BUG_CONTRACTS = ("return_count", "grad_meta", "inplace", "gradcheck", "reference")
# return_count: the forward runs under the interpreter; inplace and unneeded_grads: the twins.
TRITON_SCALAR_NORM_CONTRACTS = ("return_count", "reference", "gradcheck", "inplace", "unneeded_grads")


@dataclass(frozen=True)
class ZooRun:
    file: str  # in tests/zoo/
    contracts: tuple[str, ...] = ()  # empty: every contract
    max_examples: int | None = 5  # None: the profile's count, corners included
    extra: tuple[str, ...] = ()  # more command-line options


ZOO_RUNS = {
    "beyond_eager_bugs": ZooRun("beyond_eager_bugs.py", (), 10),
    "core_bugs": ZooRun("core_bugs.py", CORE),
    # issue "Search power": each corner bug's owner and its twin, under the dev profile (its corners)
    "corner_bugs": ZooRun("corner_bugs.py", CORNER_OWNERS, None, ("--profile=dev",)),
    # gradgradcheck: a save of x.data loses the second derivative too (blocked by saved_tensors)
    "ctx_hygiene": ZooRun("ctx_hygiene.py", ("saved_tensors", "gradcheck", "gradgradcheck", "reference"), 3),
    "derivative_layout_determinism_bugs": ZooRun(
        "derivative_layout_determinism_bugs.py",
        (*DERIVATIVE_BEHAVIOUR, "gradcheck"),
        10,
    ),
    # complex_gate: f even and f <= n (issue 28); the contracts whose sizes differ: compile grows
    # them, stability's "single" family shrinks every dim to its smallest legal size.
    "dim_relations": ZooRun("dim_relations.py", (*CORE, "reference", "stability", "compile", "needs_input_grad"), 5),
    # issue 28: every contract on the correct code; the twins' owners (and the ones they block)
    "everyones_code_bugs": ZooRun(
        # compile runs as many examples as the run asks (10 here): its twin has its own one-example run
        "everyones_code_bugs.py", ("stability", "inplace", "layouts", "forward_ad", "func", "reference", "gradcheck", "autocast"),
        10,  # the float16 overflow that stability must meet is drawn at 10 examples on seed 0, not 5
    ),
    "everyones_code_correct": ZooRun("everyones_code_correct.py"),
    "grad_and_memory_bugs": ZooRun("grad_and_memory_bugs.py", (*MEMORY_BEHAVIOUR, "gradcheck"), 4),
    "global_state_bugs": ZooRun("global_state_bugs.py", (), 4),
    "gradcheck_bugs": ZooRun("gradcheck_bugs.py", ("gradcheck",), 3),
    "half_accumulation": ZooRun("half_accumulation.py", NUMERIC, None),
    "float32_output": ZooRun("float32_output.py", ("gradcheck", "gradgradcheck", "reference"), 3),
    "memory_bugs": ZooRun("memory_bugs.py", (), 8),
    "numeric_bugs": ZooRun("numeric_bugs.py", NUMERIC, 4),
    # a per-row count differs from the total only with several rows: the many-rows corner is the 6th example
    "non_tensor_outputs": ZooRun("non_tensor_outputs.py", ("reference", "gradcheck", "layouts", "determinism"), 8),
    "real_world_bugs": ZooRun("real_world_bugs.py", (), 8),
    "real_world_correct": ZooRun("real_world_correct.py", (), 8),
    "spec_language_bugs": ZooRun("spec_language_bugs.py", (), 12),
    # the expanded grad_output, which crash_on_expanded_grad needs, is the 6th example of the memory contracts
    "tiers_bugs": ZooRun("tiers_bugs.py", (), 7),
    "tiers_correct": ZooRun("tiers_correct.py"),
    "transposed_grad_output_bugs": ZooRun("transposed_grad_output_bugs.py", ("inplace", "reference"), 3),
    "triton_bugs": ZooRun("triton_bugs.py", TRITON_BUG_CONTRACTS, 4, ("--device=cpu",)),
    "triton_scalar_norms": ZooRun("triton_scalar_norms.py", TRITON_SCALAR_NORM_CONTRACTS, 4, ("--device=cpu",)),
    "vacuous": ZooRun("vacuous.py", (), 5),
}
