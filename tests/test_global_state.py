"""torch's global state: pinned for every evaluation, and the global_state contract.

* tests/zoo/global_state_bugs.py: each Function that leaks a flag or overwrites the RNG fails
  global_state (naming what changed, after forward or backward) and nothing else; correct ones
  that draw random numbers, restore the RNG with fork_rng, or set grad mode inside forward pass.
* The bundled catalogue passes global_state.
* A spec module that turns grad mode off, or sets float64 as the default dtype, at import changes
  nothing about the zoo bugs loaded after it: same verdicts and the same falsifying examples,
  serially and under ``-n 2``.
"""

from __future__ import annotations

import contextlib
import xml.etree.ElementTree as ET

import pytest
import torch

from conformance.engine.global_state import (
    FLAGS,
    PINNED,
    PINNED_SEED,
    kept_flags,
    pinned_global_state,
    preserved_global_state,
    snapshot,
)
from tests.conftest import CONFORMANCE_DIR, ZOO

LEAKS = {
    "leaks_default_dtype": "torch.get_default_dtype()=torch.float64 after forward, but should be torch.float32 [LeaksDefaultDtype.forward]",
    "leaks_deterministic_algorithms": (
        "torch.are_deterministic_algorithms_enabled()=True after forward, but should be False "
        "[LeaksDeterministicAlgorithms.forward]"
    ),
    "leaks_anomaly_mode_in_backward": (
        "torch.is_anomaly_enabled()=True after backward, but should be False [LeaksAnomalyModeInBackward.backward]"
    ),
    "leaks_default_device": "torch.get_default_device()='meta' after forward, but should be 'cpu' [LeaksDefaultDevice.forward]",
}
RNG_BUGS = {
    "reseeds_rng": "torch's RNG state after forward is the same whatever it was before, but should only advance [ReseedsRng.forward",
    "rewinds_rng_in_backward": (
        "torch's RNG state after backward is the state forward started from, but should not go back "
        "[RewindsRngInBackward.backward]"
    ),
}
CORRECT = ("dropout", "recomputing_dropout", "grad_mode_inside_forward", "scoped_float64")


@pytest.fixture
def zoo(zoo_run):  # type: ignore[no-untyped-def]
    return zoo_run("global_state_bugs")


@pytest.mark.parametrize("name", sorted(LEAKS))
def test_a_leaked_flag_fails_global_state_only(zoo, name: str) -> None:  # type: ignore[no-untyped-def]
    text = zoo.failed("global_state", name)
    assert LEAKS[name] in text, text
    assert "every op the caller runs after this call sees it" in text and "case: " in text
    # One defect, one failure: the leak is undone after every Function call, so nothing else trips on it.
    failed = sorted(c for (c, fn, _), v in zoo.verdicts.items() if fn == name and v.outcome == "failed")
    assert failed == ["global_state"], failed
    if name == "leaks_anomaly_mode_in_backward":
        # Dynamo cannot trace a backward that toggles anomaly mode: a graph break, which is advice.
        assert zoo.verdict("compile", name).recorded.outcome.value == "advice"


@pytest.mark.parametrize("name", sorted(RNG_BUGS))
def test_an_overwritten_rng_fails_global_state(zoo, name: str) -> None:  # type: ignore[no-untyped-def]
    text = zoo.failed("global_state", name)
    assert RNG_BUGS[name] in text, text


@pytest.mark.parametrize("name", CORRECT)
def test_drawing_random_numbers_or_restoring_state_is_not_a_leak(zoo, name: str) -> None:  # type: ignore[no-untyped-def]
    zoo.passed("global_state", name)


def test_pinned_state_inside_restored_state_after() -> None:
    with preserved_global_state():
        torch.set_grad_enabled(False)
        torch.set_default_dtype(torch.float64)
        torch.use_deterministic_algorithms(True)
        torch.manual_seed(99)
        before = snapshot()
        with pinned_global_state():
            inside = snapshot()
            assert dict(inside.flags) == dict(PINNED)
            first = torch.rand(3)
            torch.set_default_device("meta")
            torch.set_grad_enabled(True)
        with pinned_global_state():
            assert torch.equal(torch.rand(3), first)  # the RNG starts from PINNED_SEED every time
        after = snapshot()
        assert dict(after.flags) == dict(before.flags) and after.rng.same_as(before.rng)
    torch.manual_seed(PINNED_SEED)
    assert torch.equal(torch.rand(3), first)


# A value other than the pinned one for each flag a CPU run can set.
_OTHER = {
    "torch.is_grad_enabled()": False,
    "torch.get_default_dtype()": torch.float64,
    "torch.are_deterministic_algorithms_enabled()": True,
    "torch.utils.deterministic.fill_uninitialized_memory": False,
    "torch.is_anomaly_enabled()": True,
    "torch.get_float32_matmul_precision()": "medium",
    "torch.backends.cudnn.benchmark": True,
    'torch.is_autocast_enabled("cpu")': True,
}


@pytest.mark.parametrize("name", sorted(_OTHER))
@pytest.mark.parametrize("raising", [False, True], ids=["returns", "raises"])
def test_kept_flags_puts_back_a_flag_changed_in_the_block_and_leaves_the_rng(name: str, raising: bool) -> None:
    flag = next(f for f in FLAGS if f.name == name)
    with preserved_global_state(), pinned_global_state():
        before = snapshot()
        with pytest.raises(ValueError) if raising else contextlib.nullcontext():
            with kept_flags():
                flag.set(_OTHER[name])
                assert flag.get() == _OTHER[name]
                drawn = torch.rand(2, dtype=torch.float32)
                if raising:
                    raise ValueError
        after = snapshot()
        assert dict(after.flags) == dict(before.flags), name
        assert not after.rng.same_as(before.rng)  # the draw stays visible (determinism's to judge)
        torch.manual_seed(PINNED_SEED)
        assert torch.equal(torch.rand(2, dtype=torch.float32), drawn)


def test_the_catalogue_passes_global_state(pytester: pytest.Pytester) -> None:
    # A subprocess: the catalogue's Triton kernels are imported fresh, as in a user's run.
    result = pytester.runpytest_subprocess(
        str(CONFORMANCE_DIR), "--contracts=global_state", "--device=cpu", "--max-examples=3", "-p", "no:cacheprovider"
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) >= 40, result.stdout.str()[-3000:]


# -- a spec module that changes torch's defaults at import -----------------------------------

BUG_FILES = ("core_bugs.py", "numeric_bugs.py")  # numeric_bugs has Mask inputs (masks once used the default dtype)
CONTRACTS = "--contracts=return_count,grad_meta,gradcheck,reference,stability"
BUGS_CAUGHT = {  # at --max-examples=5 by CONTRACTS (one failure per defect; a blocked test is not counted)
    "too_few_grads", "extra_grad", "unreduced_bias_grad", "unreduced_broadcast_mul", "wrong_dtype_grad", "missing_transpose",
    "naive_logsumexp", "naive_softmax", "softmax_half_reduction", "layer_norm_no_eps_backward", "masked_attention_nan_rows",
    "prod_dividing_by_input",
}
LEAKY_MODULES = ("grad_off_at_import.py", "float64_at_import.py", "frozen_flags_at_import.py")
EVIDENCE = ("case: ", "Draw ", "Mismatched elements", "Greatest absolute difference", "numerical:", "analytical:")


def _verdicts(pytester: pytest.Pytester, impl: list[str], *extra: str) -> dict[str, tuple[str, list[str]]]:
    """test id -> (outcome, the lines that pin the example down: case, draws, numbers)."""
    xml = pytester.path / f"junit-{len(list(pytester.path.glob('junit-*')))}.xml"
    result = pytester.runpytest_subprocess(
        str(CONFORMANCE_DIR), f"--impl={','.join(str(ZOO / f) for f in impl)}", "--device=cpu", "--max-examples=5",
        CONTRACTS, "-p", "no:cacheprovider", f"--junitxml={xml}", *extra,
    )
    assert result.ret in (0, 1), result.stdout.str()[-3000:]
    verdicts: dict[str, tuple[str, list[str]]] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case.get("name", "")
        if "_module-" in name:
            continue  # the leaky module's own Function
        outcome, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, text = child.tag, child.text or ""
            elif child.tag == "skipped":
                outcome, text = child.tag, child.get("message") or ""
        # The rerun command names the --impl targets, which differ between the runs on purpose.
        lines = [line.split("rerun: ")[0].strip() for line in text.splitlines() if any(e in line for e in EVIDENCE)]
        verdicts[name] = (outcome, lines)
    return verdicts


def test_spec_modules_that_change_torch_defaults_at_import_change_no_example(pytester: pytest.Pytester) -> None:
    alone = _verdicts(pytester, list(BUG_FILES))
    failed = sorted(name for name, (outcome, _) in alone.items() if outcome == "failure")
    caught = {name[name.index("[") + 1:].rsplit("-", 1)[0] for name in failed}
    assert caught == BUGS_CAUGHT, failed  # every zoo bug of both files is caught
    assert all(alone[name][1] for name in failed), "a failure without its case"
    # Serially: every process imports every --impl module before its first test, so a worker under
    # xdist meets the leaks as this run does (serial and xdist verdicts agree: tests/test_plugin.py).
    after_leaks = _verdicts(pytester, [*LEAKY_MODULES, *BUG_FILES])
    assert after_leaks.keys() == alone.keys()
    changed = {name: (alone[name], after_leaks[name]) for name in alone if alone[name] != after_leaks[name]}
    assert not changed, "verdicts or falsifying examples changed:\n" + "\n".join(
        f"{name}:\n  alone:       {a}\n  after leaks: {b}" for name, (a, b) in changed.items()
    )


def test_the_leaky_modules_do_leak(clean_registry) -> None:  # type: ignore[no-untyped-def]
    """The zoo modules above really change torch's defaults (so the test above means something)."""
    from conformance.engine.loader import import_path

    with preserved_global_state() as changed:
        import_path(ZOO / "grad_off_at_import.py")
        import_path(ZOO / "float64_at_import.py")
    assert "torch.is_grad_enabled()=True -> False" in changed.describe()
    assert "torch.get_default_dtype()=torch.float32 -> torch.float64" in changed.describe()
    assert torch.is_grad_enabled() and torch.get_default_dtype() == torch.float32


_BACKEND_FLAGS = {  # torch.backends attributes whose getter is torch._C's, and their owners
    "torch.backends.cuda.matmul.allow_tf32": (torch.backends.cuda.matmul, "allow_tf32"),
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": (torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction"),
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": (torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction"),
    "torch.backends.cudnn.enabled": (torch.backends.cudnn, "enabled"),
    "torch.backends.cudnn.deterministic": (torch.backends.cudnn, "deterministic"),
    "torch.backends.cudnn.benchmark": (torch.backends.cudnn, "benchmark"),
    "torch.backends.cudnn.allow_tf32": (torch.backends.cudnn, "allow_tf32"),
}


@pytest.mark.parametrize("name", sorted(_BACKEND_FLAGS))
def test_each_backend_flag_reads_what_the_torch_attribute_says(name: str) -> None:
    flag = next(f for f in FLAGS if f.name == name)
    owner, attribute = _BACKEND_FLAGS[name]
    with preserved_global_state():
        for value in (not PINNED[name], PINNED[name]):
            flag.set(value)
            assert flag.get() is bool(getattr(owner, attribute)) is value, (name, value)
