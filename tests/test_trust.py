"""Verdicts on code written the way third-party kernel libraries write it.

tests/zoo/real_world_correct.py holds correct Functions that used to draw false failures (a
Function compared after it could have clobbered its inputs, a float32 LayerNorm on constant rows,
a float32 blockwise attention with one key, an op whose output is a transposed view); each passes
every contract. tests/zoo/real_world_bugs.py holds their buggy twins and three "one defect" bugs:
each defect fails the contract that owns it, and every other contract passes or says in one
labelled line which contract's finding blocks it.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import CONFORMANCE_DIR, ZOO

CORRECT = ("mutating_double", "layer_norm_f32", "blockwise_attention_f32", "rotary_transposed_output", "center_upcast",
           "relu_masks_grad_output", "square_own_scratch")

# bug -> the one contract that must fail; every other contract passes, skips for a stated
# reason that is not a failure, or is "blocked by" the owner.
ONE_DEFECT = {
    "mutating_double_bug": "inplace",  # numbers exact: reference and gradcheck must not fail
    "rotary_transposed_output_bug": "inplace",  # writes into a transposed-view grad_output
    "clobbers_input_in_forward": "inplace",  # forward zeroes its input after computing
    "center_in_place_upcast": "inplace",  # on an expanded x the same write raises: not layouts' crash
    "relu_masks_grad_output_bug": "inplace",
    "square_scratches_saved_input_bug": "inplace",  # gradcheck's repeated backward raises: blocked, not failed  # on a stride-0 grad_output the write goes through: not layouts' mismatch
    "bias_grad_wrong_shape": "grad_meta",  # the engine silently sums the unreduced gradient
    "wrong_dtype_grad_kernel": "grad_meta",  # the engine silently casts float32 -> float64
    "bias_grad_summed_to_scalar": "grad_meta",  # the engine refuses the gradient outright
}


@pytest.fixture
def correct(zoo_run):  # type: ignore[no-untyped-def]
    return zoo_run("real_world_correct")


@pytest.fixture
def bugs(zoo_run):  # type: ignore[no-untyped-def]
    return zoo_run("real_world_bugs")


@pytest.mark.parametrize("name", CORRECT)
def test_correct_real_world_function_passes_every_contract(correct, name: str) -> None:  # type: ignore[no-untyped-def]
    ran = set()
    for (contract, fn, device), verdict in correct.verdicts.items():
        if fn != name or device != "cpu":
            continue
        assert verdict.outcome != "failed", f"{contract}[{fn}]:\n{verdict.text}"
        if verdict.outcome == "passed":
            ran.add(contract)
    assert {"reference", "layouts", "inplace", "gradcheck", "needs_input_grad", "stability"} <= ran, sorted(ran)


@pytest.mark.parametrize("name", sorted(ONE_DEFECT))
def test_one_defect_fails_one_contract_and_blocks_the_rest_with_a_labelled_line(bugs, name: str) -> None:  # type: ignore[no-untyped-def]
    owner = ONE_DEFECT[name]
    failed = sorted(c for (c, fn, d), v in bugs.verdicts.items() if fn == name and v.outcome == "failed")
    assert failed == [owner], f"{name}: failed {failed}, but only {owner} should"
    for (_, fn, device), verdict in bugs.verdicts.items():
        if fn != name or verdict.outcome != "skipped" or device != "cpu":
            continue
        text = verdict.text
        if "blocked by" in text:
            assert f"blocked by {owner}: " in text and "case: " in text and "rerun: python -m pytest " in text, text
            assert "Traceback" not in text and "\n" not in text.strip().splitlines()[-1], text


def test_a_write_through_a_stride_0_grad_output_blocks_layouts_instead_of_failing_it(conformance_run) -> None:  # type: ignore[no-untyped-def]
    # masked_fill_ on an expanded grad_output only warns: every element becomes the last one
    # written, so the gradient is wrong on that layout alone. inplace owns the write. The
    # profile's own budget: the zoo run's 8 examples rarely draw a stride-0 grad_output.
    name = "relu_masks_grad_output_bug"
    run = conformance_run(ZOO / "real_world_bugs.py", "-k", name, contracts=("inplace", "layouts"), max_examples=None)
    assert "grad_output[0] was modified in place by backward" in run.failed("inplace", name)
    blocked = run.verdict("layouts", name)
    assert blocked.outcome == "skipped", blocked.outcome
    assert "blocked by inplace: ReluMasksGradOutput wrote into grad_output[0] in place" in blocked.text, blocked.text


def test_engine_error_is_explained_not_dumped(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("grad_meta", "bias_grad_summed_to_scalar")
    assert "grad['b'].shape=(), but should be (" in text
    # b (1,) reduced to (): summing would not help, and the message says what happened instead.
    assert "fewer elements or dims than 'b'" in text and "sum_to_size" not in text and "order" not in text, text
    assert "invalid gradient" not in text
    blocked = bugs.verdict("reference", "bias_grad_summed_to_scalar").text
    assert "blocked by grad_meta: grad['b'].shape=()" in blocked


def test_broadcast_hint_only_when_the_input_was_broadcast(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("grad_meta", "bias_grad_wrong_shape")
    assert "'b' (" in text and ") broadcasts to (" in text and "sum_to_size" in text


def test_grad_output_written_through_a_transposed_view_is_caught(bugs, zoo_run) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("inplace", "rotary_transposed_output_bug")
    assert "grad_output[0] was modified in place by backward" in text
    # Every dim > 1: the write reaches the caller only for one grad_output layout.
    run = zoo_run("transposed_grad_output_bugs")
    for name, layout in (("transposed_output_in_place_grad", "like_output"), ("contiguous_output_in_place_grad", "swapped")):
        text = run.failed("inplace", name)
        assert "grad_output[0] was modified in place by backward" in text and f"layout={layout}" in text
        run.passed("reference", name)


def test_mutating_grad_output_does_not_poison_the_numerical_contracts(bugs) -> None:  # type: ignore[no-untyped-def]
    bugs.failed("inplace", "mutating_double_bug")
    for contract in ("reference", "gradcheck", "layouts", "determinism", "needs_input_grad", "stability"):
        bugs.passed(contract, "mutating_double_bug")
    bugs.failed("inplace", "clobbers_input_in_forward")
    for contract in ("reference", "gradcheck", "layouts", "stability"):
        bugs.passed(contract, "clobbers_input_in_forward")


@pytest.mark.parametrize(
    "name, contracts",
    [
        ("layer_norm_f32_bug", ("stability",)),
        ("blockwise_attention_f32_bug", ("gradcheck",)),  # reference: blocked by gradcheck
    ],
)
def test_numerical_twins_are_still_caught(bugs, name: str, contracts: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    for contract in contracts:
        bugs.failed(contract, name)


def test_waiver_is_a_labelled_skip_and_shows_in_the_report(pytester: pytest.Pytester) -> None:
    report = pytester.path / "matrix"
    result = pytester.runpytest_inprocess(
        str(CONFORMANCE_DIR), f"--impl={ZOO / 'real_world_correct.py'}", "--device=cpu", "--max-examples=2",
        "--contracts=unneeded_grads", "-p", "no:cacheprovider", "-rs", f"--conformance-report={report}",
    )
    text = result.stdout.str()
    assert "waived by spec 'blockwise_attention_f32': dq, dk and dv come from one fused backward kernel" in text
    matrix = json.loads((pytester.path / "matrix.json").read_text())["matrix"]
    assert matrix["blockwise_attention_f32-cpu"]["unneeded_grads"] == "waived"
    assert matrix["layer_norm_f32-cpu"]["unneeded_grads"] == "passed"
    assert "| waived |" in (pytester.path / "matrix.md").read_text()


def test_blocked_tests_show_their_owner_in_the_report(pytester: pytest.Pytester) -> None:
    report = pytester.path / "matrix"
    pytester.runpytest_inprocess(
        str(CONFORMANCE_DIR), f"--impl={ZOO / 'real_world_bugs.py'}", "--device=cpu", "--max-examples=2",
        "--contracts=grad_meta,reference", "-p", "no:cacheprovider", f"--conformance-report={report}",
    )
    data = json.loads((pytester.path / "matrix.json").read_text())
    assert data["matrix"]["bias_grad_summed_to_scalar-cpu"] == {"grad_meta": "failed", "reference": "blocked"}
    blocked = next(c for c in data["results"] if c["function"] == "bias_grad_summed_to_scalar" and c["contract"] == "reference")
    assert blocked["reason"].startswith("blocked by grad_meta: grad['b'].shape=(), but should be (1,)")
    assert "blocked by grad_meta" in (pytester.path / "matrix.md").read_text()


AUTOCAST_SPECS = """
import torch
from conformance import Tensor, register

class Matmul(torch.autograd.Function):
    # A textbook matmul without torch.amp.custom_fwd: under autocast, backward gets a bfloat16
    # grad_output and the float32 tensors forward saved.
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return a @ b

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return g @ b.mT, a.mT @ g

for name, waivers in (("textbook_matmul", None), ("textbook_matmul_never_autocast", {"autocast": "never run under autocast"})):
    register(Matmul, name=name, inputs=[Tensor("a", "m k"), Tensor("b", "k n")], reference=lambda a, b: a @ b,
             dtypes=(torch.float32,), waivers=waivers)
"""


def test_a_function_never_run_under_autocast_waives_that_contract(pytester: pytest.Pytester) -> None:
    """autocast checks a way of using the Function: a textbook matmul without custom_fwd fails it
    (backward mixes bfloat16 and float32), and its message names the waiver for an author whose
    models never use autocast (found by a trial: waivers refused autocast)."""
    specs = pytester.makepyfile(autocast_specs=AUTOCAST_SPECS)
    report = pytester.path / "matrix"
    pytester.runpytest_inprocess(
        str(CONFORMANCE_DIR), f"--impl={specs}", "--device=cpu", "--max-examples=2", "--contracts=autocast",
        "-p", "no:cacheprovider", f"--conformance-report={report}",
    )
    data = json.loads((pytester.path / "matrix.json").read_text())
    assert data["matrix"]["textbook_matmul-cpu"] == {"autocast": "failed"}, data["matrix"]
    assert data["matrix"]["textbook_matmul_never_autocast-cpu"] == {"autocast": "waived"}, data["matrix"]
    failed = next(c for c in data["results"] if c["function"] == "textbook_matmul")
    assert "waivers={'autocast': 'why'}" in failed["message"], failed["message"]


def test_spec_waiver_is_validated(clean_registry) -> None:  # type: ignore[no-untyped-def]
    import torch

    from conformance import SpecError, Tensor, register

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[no-untyped-def]
            return 2 * x

        @staticmethod
        def backward(ctx, g):  # type: ignore[no-untyped-def]
            return 2 * g

    with pytest.raises(SpecError, match="field 'waivers': 'gradcheck' cannot be waived"):
        register(Twice, inputs=[Tensor("x", "n")], reference=lambda x: 2 * x, waivers={"gradcheck": "slow"})
    with pytest.raises(SpecError, match="must be a non-empty reason"):
        register(Twice, inputs=[Tensor("x", "n")], reference=lambda x: 2 * x, waivers={"unneeded_grads": " "})
