"""The gradgradcheck, layouts, determinism and devices contracts catch the known-buggy Functions in
tests/zoo/derivative_layout_determinism_bugs.py with messages that say why, and pass the correct but unusual ones in
tests/zoo/unusual_correct_derivatives.py. (The bundled reference ops are checked by `pytest conformance`
itself: loading reference_ops, with its Triton kernels, in a second in-process run of one session
breaks the Triton interpreter.)"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import conformance
from conformance import Tensor
from conformance.engine.verdict import Outcome
from tests.conftest import ZOO
from tests.zoo_runs import CORE, DERIVATIVE_BEHAVIOUR

BEHAVIOUR = DERIVATIVE_BEHAVIOUR


@pytest.fixture
def bugs(zoo_run):  # type: ignore[no-untyped-def]
    return zoo_run("derivative_layout_determinism_bugs")


def test_unusual_correct_functions_pass(conformance_run) -> None:  # type: ignore[no-untyped-def]
    run = conformance_run(ZOO / "unusual_correct_derivatives.py", contracts=BEHAVIOUR + CORE)
    assert {"once_differentiable_softplus", "sign_ste_hardtanh", "gumbel_softmax_b", "cube", "refuses_graph_in_backward"} <= run.names()
    for (contract, name, device), verdict in run.verdicts.items():
        if contract == "devices" or device == "cuda":
            continue  # no CUDA here: see test_devices_skips_with_reasons
        assert verdict.outcome == "passed", f"{contract}[{name}-{device}]:\n{verdict.text}"


def test_devices_skips_with_reasons(conformance_run) -> None:  # type: ignore[no-untyped-def]
    run = conformance_run(ZOO / "unusual_correct_derivatives.py", "--device=auto", contracts=("devices",))
    cpu = run.verdict("devices", "cube", "cpu")
    assert cpu.outcome == "skipped" and "devices compares cpu against cuda" in cpu.text
    cuda = run.verdict("devices", "cube", "cuda")
    if not torch.cuda.is_available():
        assert cuda.outcome == "skipped" and "CUDA is not available" in cuda.text
        # Its verdict carries the command that reruns it on a GPU.
        recorded = cuda.recorded
        assert recorded.outcome.value == "not_run_here" and "--device=cuda" in recorded.rerun, recorded
    else:
        assert cuda.outcome == "passed", cuda.text


# ----------------------------------------------------------------------------- gradgradcheck


def test_saved_intermediate_fails_gradgradcheck_but_gradcheck_passes(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("gradgradcheck", "saved_intermediate_silu")
    assert "d(grad['x'])/d('x') analytical != numerical: d grad['x'][" in text and "entries differ" in text, text
    assert "numerical:tensor(" not in text, text  # the worst entry, not both Jacobians
    assert "saved_tensors[1]" in text and "carries no graph back to the inputs" in text
    assert "Recompute it in backward" in text
    assert "at every differing entry" not in text  # the first-derivative pattern line gives way to the named cause
    bugs.passed("gradcheck", "saved_intermediate_silu")


def test_detach_in_backward_fails_gradgradcheck(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("gradgradcheck", "detach_in_backward")
    assert "analytical second derivative is None" in text
    assert "does not depend on 'x' through the autograd graph" in text
    bugs.passed("gradcheck", "detach_in_backward")


def test_no_grad_backward_fails_gradgradcheck(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("gradgradcheck", "no_grad_backward")
    assert "grad['x'] is not attached to the autograd graph" in text and "torch.no_grad()" in text
    bugs.passed("gradcheck", "no_grad_backward")


def test_declared_once_differentiable_that_runs_double_backward_fails(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("gradgradcheck", "silent_once_differentiable")
    assert "double backward runs and is silently WRONG, but the spec declares double_backward=False" in text
    assert "once_differentiable" in text and "gradgradcheck" in text


def test_declared_once_differentiable_that_detaches_fails(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("gradgradcheck", "silent_no_grad_once_differentiable")
    assert "requires_grad=False under create_graph=True, but double backward should raise" in text
    assert "gradient penalty" in text



def test_backward_that_cannot_be_differentiated_fails_with_its_cause(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("gradgradcheck", "inplace_in_backward")
    assert "gradgradcheck raised RuntimeError, but the spec declares double_backward=True" in text, text
    assert "modified by an inplace operation" in text  # torch's own error, in full
    assert "backward is not twice differentiable" in text and "@torch.autograd.function.once_differentiable" in text
    bugs.passed("gradcheck", "inplace_in_backward")
    bugs.passed("gradgradcheck", "inplace_in_backward_once")  # the same backward, declared

# ----------------------------------------------------------------------------- layouts


def test_storage_read_as_contiguous_fails_layouts(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("layouts", "storage_read_scale")
    assert "with non-contiguous layouts != " in text and "with contiguous layouts and the same values" in text
    assert "layouts: x: " in text and "stride" in text
    assert "Mismatched elements" in text
    bugs.passed("determinism", "storage_read_scale")
    bugs.passed("gradcheck", "storage_read_scale")  # gradcheck only feeds contiguous tensors


def test_contiguous_grad_output_assumed_fails_layouts(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("layouts", "contiguous_grad_output_assumed")
    # Found as wrong values or as a crash, depending on the grad_output layout drawn first.
    assert ("grad['x']" in text or "backward raised RuntimeError" in text) and "grad_output[0]: stride" in text
    bugs.passed("gradcheck", "contiguous_grad_output_assumed")
    bugs.passed("gradgradcheck", "contiguous_grad_output_assumed")


# ----------------------------------------------------------------------------- determinism


def test_undeclared_noise_fails_determinism(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("determinism", "undeclared_noise")
    assert "outputs[0] differs between two calls with identical inputs" in text
    assert "declare nondeterministic=True" in text and "Mismatched elements" in text


def test_noisy_backward_fails_determinism(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("determinism", "noisy_backward")
    assert "grad['x'] differs between two calls with identical inputs" in text


@pytest.mark.parametrize("name", ["undeclared_noise", "noisy_backward"])
def test_undeclared_noise_fails_determinism_alone_and_blocks_what_compares_values(bugs, name: str) -> None:  # type: ignore[no-untyped-def]
    """One defect, one failure: gradcheck (finite differences, or two backward calls on one graph),
    layouts and gradgradcheck meet the noise as values that differ from what they are compared with."""
    row = {c: v.recorded for (c, fn, _), v in bugs.verdicts.items() if fn == name}
    assert [c for c, r in row.items() if r.outcome is Outcome.FAILED] == ["determinism"], row
    blocked = {c for c, r in row.items() if r.outcome is Outcome.BLOCKED}
    assert "gradcheck" in blocked, row  # failed before: not reentrant, or analytical != numerical
    for contract in blocked:
        assert row[contract].owner == "determinism", (contract, row[contract])
        assert "differs between two calls with identical inputs" in row[contract].reason, row[contract]


class _NoisyWrongIndex(torch.autograd.Function):
    """Two defects: undeclared noise in forward, and x's gradient gated on needs_input_grad[1]."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return x * w + 1e-3 * torch.randn_like(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, w = ctx.saved_tensors
        return (grad * w if ctx.needs_input_grad[1] else None), (grad * x if ctx.needs_input_grad[1] else None)


def test_a_missing_gradient_of_a_random_function_is_not_blocked_by_its_randomness() -> None:
    """Randomness explains values that differ from what they are compared with, not a needed
    gradient that is None: needs_input_grad fails for it beside determinism (it was blocked by it)."""
    with pytest.raises(conformance.ConformanceFailure) as raised:
        conformance.check(_NoisyWrongIndex, inputs=[Tensor("x", "n"), Tensor("w", "n")], reference=lambda x, w: x * w,
                          device="cpu", contracts=["determinism", "needs_input_grad"], max_examples=5)
    verdicts = {r.contract: r.verdict for r in raised.value.result.results}
    assert verdicts["determinism"].outcome is Outcome.FAILED, verdicts
    needs = verdicts["needs_input_grad"]
    assert needs.outcome is Outcome.FAILED and needs.reason.startswith("grad['x']=None, but should be a Tensor"), needs


class _SometimesNoisy(torch.autograd.Function):
    """Undeclared randomness on about half the calls (a rarely taken random branch); it never
    looks at strides."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2 + (1e-3 if float(torch.rand(())) < 0.5 else 0.0)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2


class _NoisyTwoOutputs(torch.autograd.Function):
    """Undeclared noise on output 0, and a backward that raises when output 1 is unused."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)
        return x * 2 + 1e-3 * torch.randn_like(x), x * 3

    @staticmethod
    def backward(ctx: Any, ga: torch.Tensor, gb: torch.Tensor) -> torch.Tensor:
        return ga * 2 + gb * 3


def test_randomness_that_shows_on_some_calls_is_determinisms_not_layouts() -> None:
    """A review: the check that tells a strided read (layouts') from randomness ran each case
    once, so a Function random on some calls only looked stable in contiguous layouts and layouts
    failed it. Strided calls from the same RNG state agree for it: determinism's, layouts blocked."""
    with pytest.raises(conformance.ConformanceFailure) as raised:
        conformance.check(_SometimesNoisy, inputs=[Tensor("x", "m n")], reference=lambda x: x * 2, dtypes=(torch.float32,),
                          device="cpu", contracts=["determinism", "layouts"], profile="ci")
    verdicts = {r.contract: r.verdict for r in raised.value.result.results}
    assert verdicts["determinism"].outcome is Outcome.FAILED, verdicts
    assert verdicts["layouts"].outcome is Outcome.BLOCKED and verdicts["layouts"].owner == "determinism", verdicts


def test_a_crash_of_a_random_function_with_an_unused_output_is_undefined_grads_own() -> None:
    with pytest.raises(conformance.ConformanceFailure) as raised:
        conformance.check(_NoisyTwoOutputs, inputs=[Tensor("x", "n")], reference=lambda x: (x * 2, x * 3), dtypes=(torch.float64,),
                          device="cpu", contracts=["determinism", "undefined_grads"], profile="ci")
    verdicts = {r.contract: r.verdict for r in raised.value.result.results}
    assert verdicts["determinism"].outcome is Outcome.FAILED, verdicts
    undefined = verdicts["undefined_grads"]
    assert undefined.outcome is Outcome.FAILED and "when output[1] was unused" in undefined.reason, undefined


def test_a_random_backward_that_draws_its_own_sample_is_inplaces_alone(conformance_run) -> None:  # type: ignore[no-untyped-def]
    """Declared random: forward's draws are replayed for the reference, so a backward that draws a
    new mask is wrong on one call and differs from itself on two. inplace (second backward through
    one graph) owns it; gradcheck, reference and autocast, which met it, are blocked by it (they
    failed alongside it, autocast only on a case where the float64 check drew alike by chance)."""
    name = "dropout_fresh_mask_in_backward"
    contracts = ("inplace", "gradcheck", "reference", "autocast", "determinism")
    run = conformance_run(ZOO / "derivative_layout_determinism_bugs.py", "-k", name, contracts=contracts)
    text = run.failed("inplace", name)
    assert "on the second backward != first backward" in text and "draws its own numbers" in text, text
    row = {c: v.recorded for (c, fn, _), v in run.verdicts.items() if fn == name}
    assert [c for c, r in row.items() if r.outcome is Outcome.FAILED] == ["inplace"], row
    for contract in ("gradcheck", "reference", "autocast"):
        assert row[contract].outcome is Outcome.BLOCKED and row[contract].owner == "inplace", (contract, row[contract])


def test_a_backward_that_changes_its_state_is_inplaces_and_blocks_gradchecks_reentrancy(conformance_run) -> None:  # type: ignore[no-untyped-def]
    run = conformance_run(ZOO / "gradcheck_bugs.py", "-k", "counting_scale", contracts=("gradcheck", "inplace", "determinism"))
    assert "on the second backward != first backward" in run.failed("inplace", "counting_scale")
    run.passed("determinism", "counting_scale")  # the same from fresh calls: no randomness
    blocked = run.verdict("gradcheck", "counting_scale").recorded
    assert blocked.outcome is Outcome.BLOCKED and blocked.owner == "inplace", blocked
    assert "backward is not reentrant" in blocked.reason, blocked


def test_correct_functions_in_bug_zoo_pass_determinism(bugs) -> None:  # type: ignore[no-untyped-def]
    for name in ("saved_intermediate_silu", "detach_in_backward", "contiguous_grad_output_assumed"):
        bugs.passed("determinism", name)
