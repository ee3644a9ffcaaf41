"""The memory contracts: unwritten_memory (poisoned allocations), out_of_bounds (canaries) and
saved_memory (the saves= promise), on kernel-style zoo Functions and their correct twins."""

from __future__ import annotations

import os

import pytest
import torch

import conformance
from conformance import Tensor
from conformance.engine.memory import AllocationPolicy, Allocations, padded_copy, saved_storages, unwritten_elements
from conformance.engine.probe import guarded
from conformance.engine.verdict import Outcome
from tests.conftest import ZOO

MEMORY_CONTRACTS = ("unwritten_memory", "out_of_bounds", "saved_memory")


@pytest.fixture
def memory_zoo(zoo_run):  # type: ignore[no-untyped-def]
    return zoo_run("memory_bugs")


def _only_failure(run, name: str) -> list[str]:  # type: ignore[no-untyped-def]
    """Contracts ``name`` failed; every other verdict is passed, n/a or "blocked by" the failure."""
    failed = sorted(c for (c, fn, d), v in run.verdicts.items() if fn == name and d == "cpu" and v.outcome == "failed")
    for (contract, fn, device), verdict in run.verdicts.items():
        if fn == name and device == "cpu" and verdict.outcome == "skipped" and "blocked by" in verdict.text:
            assert any(f"blocked by {owner}" in verdict.text for owner in failed), (contract, verdict.text)
    return failed


OWNERS = {
    "tail_unwritten_grad": "TailUnwrittenGrad",
    "tail_unwritten_grad_aliased": "TailUnwrittenGradAliased",
    "tail_unwritten_grad_by_argument": "TailUnwrittenGradByArgument",
}


@pytest.mark.parametrize("name", sorted(OWNERS))
def test_unwritten_tail_of_a_gradient_fails_unwritten_memory_only(memory_zoo, name: str) -> None:  # type: ignore[no-untyped-def]
    """Also through a module-level ``from torch import empty_like as ...`` (the allocation policy
    watches torch calls, a TorchFunctionMode, not the attribute a call site looks up), and through
    a launcher passed as an argument (the Function's own code names no allocation, so only the
    argument says the mode must be entered)."""
    assert _only_failure(memory_zoo, name) == ["unwritten_memory"]
    text = memory_zoo.failed("unwritten_memory", name)
    owner = OWNERS[name]
    assert f"=NaN from a poisoned allocation, but should be written by {owner}.backward" in text
    assert "elements never written" in text and "numel // BLOCK instead of cdiv(numel, BLOCK)" in text
    # The numerical contracts would have seen NaN; they say which finding blocks them instead.
    for contract in ("gradcheck", "reference", "stability"):
        assert "blocked by unwritten_memory" in memory_zoo.verdict(contract, name).text


def test_correct_blocked_kernel_is_checked_and_passes(memory_zoo) -> None:  # type: ignore[no-untyped-def]
    assert _only_failure(memory_zoo, "blocked_scale") == []
    memory_zoo.passed("unwritten_memory", "blocked_scale")  # checked: it allocates with empty_like
    memory_zoo.passed("out_of_bounds", "blocked_scale")
    assert memory_zoo.outcome("saved_memory", "blocked_scale") == "skipped"  # n/a: no saves= promise


def test_attention_saving_probabilities_breaks_its_saves_promise(memory_zoo) -> None:  # type: ignore[no-untyped-def]
    assert _only_failure(memory_zoo, "attention_saves_probs") == ["saved_memory"]
    text = memory_zoo.failed("saved_memory", "attention_saves_probs")
    assert "saved_bytes=" in text and "but should be <= " in text and "[AttentionSavesProbs.forward]" in text
    assert "save_for_backward[4]:" in text  # the probabilities, named with their shape and size
    assert "saves=<callable> allows the inputs, the outputs and" in text


def test_attention_keeping_only_the_log_sum_exp_keeps_its_promise(memory_zoo) -> None:  # type: ignore[no-untyped-def]
    assert _only_failure(memory_zoo, "attention_lse") == []
    memory_zoo.passed("saved_memory", "attention_lse")
    # Pure torch ops write everything they return: nothing to poison, said so.
    verdict = memory_zoo.verdict("unwritten_memory", "attention_lse")
    assert verdict.outcome == "skipped" and "made no uninitialised allocation" in verdict.text


def _blocked_scale_grad(fill: str) -> torch.Tensor:
    from tests.zoo.memory_bugs import _blocked_scale

    with Allocations(AllocationPolicy(fill, 16)):  # type: ignore[arg-type]
        return _blocked_scale(torch.ones(2, 13, dtype=torch.float64), 3.0, drop_tail=True)


def test_poison_finds_the_tail_a_zero_filled_buffer_hides(clean_registry) -> None:  # type: ignore[no-untyped-def]
    zeroed = _blocked_scale_grad("zeros")
    assert torch.isfinite(zeroed).all() and (zeroed[-1, -2:] == 0).all()  # plausible-looking zeros
    poisoned = _blocked_scale_grad("poison")
    found = unwritten_elements([("grad['x']", poisoned)], {"grad['x']": zeroed})
    assert len(found) == 1 and found[0].count == 26 % 8 and found[0].index == (1, 11), found


def test_a_nan_the_function_computes_is_not_unwritten() -> None:
    computed = torch.tensor([float("nan"), 1.0])
    assert unwritten_elements([("output[0]", computed)], {"output[0]": computed.clone()}) == []


def test_canaries_report_writes_past_the_end_and_before_the_start() -> None:
    x = torch.arange(6.0).reshape(2, 3)
    copy, canaries = padded_copy(x, 8, "input 'x'")
    assert canaries is not None and copy._base is None  # its own tensor, not a view
    assert torch.equal(copy, x) and copy.stride() == x.stride() and canaries.damage() is None
    canaries.buffer[8 + 6 + 2] = 0.0  # three past the last element
    canaries.buffer[7] = -1.0  # one before the first
    report = canaries.damage()
    assert report is not None
    assert "wrote 1 element(s) past the end of input 'x' (element offsets after its last element: +2)" in report
    assert "wrote 1 element(s) before the start of input 'x' (element offsets before its first element: -1)" in report


def test_saved_bytes_count_whole_storages_once_and_skip_free_ones() -> None:
    base = torch.zeros(10, 10)
    x = torch.zeros(4)
    kept = [("save_for_backward[0]", x), ("save_for_backward[1]", base[0]), ("ctx.again", base[1:3])]
    storages = list(saved_storages(kept, free=[x]))
    assert [(s.where, s.nbytes) for s in storages] == [("save_for_backward[1]", 400)]


def test_saves_promise_is_validated(clean_registry) -> None:  # type: ignore[no-untyped-def]
    from conformance import SpecError, Tensor, register
    from tests.zoo.memory_bugs import BlockedScale

    with pytest.raises(SpecError, match="saves"):
        register(BlockedScale, name="bad_saves", inputs=[Tensor("x", "n")], reference=lambda x: 3 * x, saves="everything")


def test_waiving_unwritten_memory_turns_poisoning_off(clean_registry) -> None:  # type: ignore[no-untyped-def]
    from conformance import Tensor, register
    from conformance.engine.harness import allocation_policy
    from conformance.spec import registered
    from tests.zoo.memory_bugs import BlockedScale

    register(BlockedScale, name="padding_kept", inputs=[Tensor("x", "n")], reference=lambda x: 3 * x,
             waivers={"unwritten_memory": "returns uninitialised padding by design"})
    spec = next(s for s in registered() if s.name == "padding_kept")
    policy = allocation_policy(spec)
    assert policy.fill is None and policy.margin > 0  # canary margins stay: they keep the heap safe


triton = pytest.importorskip("triton", reason="Triton is not installed (pip install 'autograd-conformance[triton]')")


@pytest.mark.skipif(torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1", reason="CPU interpreter run")
def test_triton_kernel_storing_past_the_end_fails_out_of_bounds(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Own process, as tests/test_triton_kernels.py explains (interpreted kernels under pytester).
    import json
    import subprocess
    import sys

    from tests.conftest import CONFORMANCE_DIR

    report = tmp_path / "memory"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(CONFORMANCE_DIR), f"--impl={ZOO / 'triton_memory_bugs.py'}", "--device=cpu",
         "--profile=ci", "-p", "no:cacheprovider", "-q", f"--conformance-report={report}"],
        capture_output=True, text=True, timeout=900, check=False,
    )
    assert report.with_suffix(".json").exists(), f"the run wrote no report (exit {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}"
    cells = {(c["contract"], c["function"]): c for c in json.loads(report.with_suffix(".json").read_text())["results"]}
    failed = sorted((c, f) for (c, f), cell in cells.items() if cell["outcome"] == "failed")
    assert failed == [
        ("layouts", "triton_strided_grad_read"), ("out_of_bounds", "triton_row_sum_load_past_end"), ("out_of_bounds", "triton_store_past_end"),
        ("unwritten_memory", "triton_unwritten_tail"),
    ], failed
    # An unmasked load reads past the end of the input: the results change with the memory around
    # it (a trial's kernel was reported as "never written", and under other owners from run to run).
    # Outside the margins it reads the heap, whatever it holds: the others pass or are blocked by it.
    text = cells[("out_of_bounds", "triton_row_sum_load_past_end")]["message"]
    assert "output[0] changes with the memory around the Function's tensors, but should depend only on what is inside them" in text, text
    assert "a load without a mask" in text, text
    blockers = {cell["owner"] for (c, f), cell in cells.items() if f == "triton_row_sum_load_past_end" and cell["outcome"] == "blocked"}
    assert blockers <= {"out_of_bounds"}, blockers
    outcomes = {c: cell["outcome"] for (c, f), cell in cells.items() if f == "triton_row_sum"}
    assert outcomes.pop("compile") == "not_run_here" and set(outcomes.values()) <= {"passed", "not_applicable"}, outcomes
    # A kernel reading a strided grad_output as contiguous reads past its end: values that change
    # between calls, but only in strided layouts, are layouts' own finding, not undeclared
    # randomness (it was "blocked by determinism", which passed, and reported as such).
    layouts = cells[("layouts", "triton_strided_grad_read")]
    assert "with non-contiguous layouts != grad['x'] with contiguous layouts" in layouts["reason"], layouts["reason"]
    blockers = {cell["owner"] for (c, f), cell in cells.items() if f == "triton_strided_grad_read" and cell["outcome"] == "blocked"}
    assert blockers <= {"layouts"}, blockers
    text = cells[("out_of_bounds", "triton_store_past_end")]["message"]
    assert "wrote 1 element(s) past the end of a buffer from torch.empty_like" in text
    assert "but should write only inside it [StorePastEnd.forward]" in text
    # Every other contract of the twin and of the out-of-bounds kernel ran to a verdict: the
    # margins kept the stray store away from the allocator, so nothing crashed.
    # (compile is not run on interpreted kernels; the contracts that call the Function as users
    # do -- forward_ad, func -- run it under the same margins, so they reach a verdict too.)
    outcomes = {c: cell["outcome"] for (c, f), cell in cells.items() if f == "triton_scale"}
    assert outcomes.pop("compile") == "not_run_here"
    assert set(outcomes.values()) <= {"passed", "not_applicable"}, outcomes
    assert outcomes["forward_ad"] == outcomes["func"] == "passed"
    assert cells[("unwritten_memory", "triton_scale")]["outcome"] == "passed"
    assert cells[("gradcheck", "triton_store_past_end")]["outcome"] == "passed"
    assert cells[("forward_ad", "triton_store_past_end")]["outcome"] == "passed"  # forward-mode calls land in margins too


def test_allocation_checks_leave_an_out_buffer_alone() -> None:
    buffer = torch.zeros(3)
    with Allocations(AllocationPolicy("poison", 4)) as mode:
        returned = torch.empty(3, out=buffer)
    assert returned is buffer and torch.equal(buffer, torch.zeros(3)) and mode.allocations == 0


def test_allocations_behave_like_fresh_ones_for_code_that_relies_on_it() -> None:
    """Correct kernel-style code that must not be flagged: carving a workspace with absolute
    as_strided offsets, growing torch.empty(0) through out=, modifying an allocation in place
    after it became a Function output, freeing a workspace's storage early."""
    x, y = torch.arange(4.0), torch.arange(4.0, 8.0)
    mode = Allocations(AllocationPolicy("poison", 64))
    with mode:
        workspace = torch.empty(8)
        workspace.as_strided((4,), (1,), 0).copy_(x)
        workspace.as_strided((4,), (1,), 4).copy_(y)
        grown = torch.empty(0)
        torch.add(torch.ones(8), 1, out=grown)
        scratch = torch.empty(16)
        scratch.untyped_storage().resize_(0)
    assert torch.equal(workspace, torch.cat([x, y])) and workspace.storage_offset() == 0 and workspace._base is None
    assert torch.equal(grown, torch.full((8,), 2.0))
    assert [c.damage() for c in mode.canaries] == [None, None]  # workspace, scratch (empty(0) is left alone)


class _Doubles(torch.autograd.Function):
    @staticmethod
    def forward(x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:  # setup_context style, a default
        out = torch.empty_like(x)
        out.copy_(x * scale)
        return out

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # type: ignore[no-untyped-def]
        ctx.scale = inputs[1]

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return grad * ctx.scale, None


def test_probed_forward_keeps_the_users_signature_and_outputs_are_not_views() -> None:
    from conformance.engine.probe import probe

    probed, recorder = probe(_Doubles, allocations=AllocationPolicy())
    x = torch.ones(3, requires_grad=True)
    y = probed.apply(x)  # the default `scale` is filled in from the user's signature
    assert torch.equal(y, torch.full((3,), 2.0)) and recorder.uninitialised_allocations == 1
    with torch.enable_grad():
        z = probed.apply(x)
        z.mul_(1.0)  # a view output of a custom Function could not be modified in place


_POISONED: list[bool] = []  # per forward call of _DoublesGradInPlace: whether torch.empty came poisoned


class _DoublesGradInPlace(torch.autograd.Function):
    """Allocates uninitialised in forward; backward doubles its grad_output in place and returns it."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        _POISONED.append(bool(torch.empty(4).isnan().all()))
        return x * 2

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return grad.mul_(2)


@pytest.mark.parametrize("shield", [True, False])
def test_guarded_shield_keeps_the_callers_grad_output_and_allocations_stay_poisoned(shield: bool) -> None:
    """gradcheck's calls go through guarded(..., shield=True): a backward that writes into its
    grad_output must not change the tensor gradcheck passes again. Without the shield it does,
    so the comparison can fail."""
    _POISONED.clear()
    function = guarded(_DoublesGradInPlace, AllocationPolicy(), shield=shield)
    x = torch.ones(3, requires_grad=True)
    grad_output = torch.ones(3)
    (grad,) = torch.autograd.grad(function.apply(x), x, grad_output)
    assert torch.equal(grad, torch.full((3,), 2.0))
    kept = torch.equal(grad_output, torch.ones(3))
    assert kept == shield, f"grad_output={grad_output.tolist()}, but should be {'unchanged' if shield else 'doubled'} [shield={shield}]"
    assert _POISONED == [True], f"poisoned={_POISONED}, but should be [True] [torch.empty in forward]"


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8, torch.bool, torch.complex64])
def test_every_dtype_gets_a_canary_it_can_hold(dtype: torch.dtype) -> None:
    mode = Allocations(AllocationPolicy("poison", 8))
    with mode:
        made = torch.empty(5, dtype=dtype)
    assert made.shape == (5,) and made.dtype == dtype
    assert mode.canaries and mode.canaries[0].damage() is None


def test_a_stride_0_tensor_is_left_unpadded() -> None:
    expanded = torch.ones(1, 3).expand(4, 3)
    copy, canaries = padded_copy(expanded, 8, "grad_output[0]")
    assert copy is expanded and canaries is None


def test_a_store_past_the_end_of_an_allocation_lands_in_its_margin_and_is_reported() -> None:
    mode = Allocations(AllocationPolicy("poison", 8), phase="forward")
    with mode:
        out = torch.empty(3)
    torch.empty(0).set_(out.untyped_storage(), 0, (5,), (1,)).fill_(1.0)  # a kernel storing 2 too many
    assert mode.canaries[0].damage() == (
        "wrote 2 element(s) past the end of a buffer from torch.empty(3,) in forward "
        "(element offsets after its last element: +0, +1)"
    )


class _TailEverywhere(torch.autograd.Function):
    """Leaves the last element of its output unwritten, in every layout."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        out.view(-1)[:-1] = (x * 2).reshape(-1)[:-1]
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return grad * 2


class _TailOnlyStrided(_TailEverywhere):
    """A path for strided inputs that forgets the last element."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        end = None if x.is_contiguous() else -1
        out.view(-1)[:end] = (x * 2).reshape(-1)[:end]
        return out


@pytest.mark.parametrize(("fn", "owner"), [(_TailEverywhere, "unwritten_memory"), (_TailOnlyStrided, "layouts")])
def test_memory_left_unwritten_only_with_strided_inputs_is_layouts_and_says_so_plainly(fn, owner) -> None:  # type: ignore[no-untyped-def]
    """Unwritten elements the same case in contiguous layouts does not have are layouts' finding;
    the message names both causes (a strided-only path, a read from outside a strided tensor)
    instead of claiming the read. Unwritten in every layout: unwritten_memory's."""
    with pytest.raises(conformance.ConformanceFailure) as raised:
        conformance.check(fn, inputs=[Tensor("x", "m n")], reference=lambda x: x * 2, dtypes=(torch.float32,), device="cpu",
                          contracts=["layouts", "out_of_bounds", "unwritten_memory"], profile="ci")
    verdicts = {r.contract: r.verdict for r in raised.value.result.results}
    assert [c for c, v in verdicts.items() if v.outcome is Outcome.FAILED] == [owner], verdicts
    if owner == "layouts":
        blocked = verdicts["unwritten_memory"]
        assert blocked.outcome is Outcome.BLOCKED and blocked.owner == "layouts", blocked
        assert "with strided inputs or grad_outputs, but not with contiguous ones" in blocked.reason, blocked.reason
