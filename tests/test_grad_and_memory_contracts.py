"""The behavioural contracts needs_input_grad, inplace, saved_tensors and undefined_grads catch the
known-buggy Functions in tests/zoo/grad_and_memory_bugs.py with messages that say why, and pass the
correct-but-unusual Functions in tests/zoo/unusual_correct_grads_and_memory.py and the bundled reference ops.
saved_tensors searches ctx at any depth (tests/zoo/ctx_hygiene.py; unit tests of the search on fake
ctx objects at the end)."""

from __future__ import annotations

import array
import collections
import dataclasses
import importlib.util
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from conformance.engine.held import Held, held_on, owner_of, reachable
from conformance.engine.verdict import Outcome
from tests.conftest import ZOO
from tests.zoo_runs import CORE, MEMORY_BEHAVIOUR

BEHAVIOUR = MEMORY_BEHAVIOUR
SINGLE_OUTPUT_SKIP = "has a single tensor output"
# unneeded_grads has nothing to check when one input is differentiable: backward only runs when
# that input needs its gradient.
ONE_DIFFERENTIABLE_SKIP = "is the only differentiable input"


def _honest_skip(contract: str, text: str) -> bool:
    """A skip that says there was nothing to check, for the reason this contract can have."""
    reason = {"undefined_grads": SINGLE_OUTPUT_SKIP, "unneeded_grads": ONE_DIFFERENTIABLE_SKIP}.get(contract)
    return reason is not None and "nothing to check: " in text and reason in text

# bug name -> the one behavioural contract it must fail
INTENDED = {
    "ignores_needs_input_grad": "unneeded_grads",
    "swapped_needs_input_grad": "needs_input_grad",
    "mutates_grad_output": "inplace",
    "relu_input_in_place_without_mark_dirty": "inplace",
    "modifies_saved_tensor": "inplace",
    "grad_into_input_data": "inplace",
    "returns_input_view": "inplace",
    "scales_saved_input_view": "inplace",
    "tensor_on_ctx": "saved_tensors",
    "caches_outputs": "saved_tensors",
    "none_unaware_two_outputs": "undefined_grads",
}

MULTI_OUTPUT_CORRECT = {"none_aware_two_outputs", "max_with_index", "keep_positive_with_mask"}


@pytest.fixture
def bugs(zoo_run):  # type: ignore[no-untyped-def]
    return zoo_run("grad_and_memory_bugs")


@pytest.fixture
def unusual(conformance_run):  # type: ignore[no-untyped-def]
    return conformance_run(ZOO / "unusual_correct_grads_and_memory.py", contracts=(*BEHAVIOUR, *CORE), max_examples=4)


# ------------------------------------------------------------------ needs_input_grad


def test_ignoring_needs_input_grad_is_advice_naming_the_extra_work(bugs) -> None:  # type: ignore[no-untyped-def]
    advice = bugs.verdict("unneeded_grads", "ignores_needs_input_grad").recorded
    assert advice.outcome is Outcome.ADVICE, advice  # performance of correct code: it does not fail
    text = advice.message
    assert "computed, but not needed: extra work aten.mul.Tensor" in text and "waivers={'unneeded_grads'" in text
    bugs.passed("needs_input_grad", "ignores_needs_input_grad")  # its gradients are right
    assert "grad['x'] computed" in text or "grad['w'] computed" in text
    assert "ctx.needs_input_grad=(" in text and "Guard it with `if ctx.needs_input_grad[" in text
    bugs.passed("gradcheck", "ignores_needs_input_grad")  # the engine drops the extra gradient


def test_swapped_needs_input_grad_misses_the_needed_gradient(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("needs_input_grad", "swapped_needs_input_grad")
    assert "=None, but should be a Tensor" in text
    assert "requires_grad: ['x']" in text or "requires_grad: ['w']" in text  # exactly one input
    assert "wrong index" in text
    bugs.passed("gradcheck", "swapped_needs_input_grad")  # gradcheck makes every input require grad


# ------------------------------------------------------------------ inplace


def test_grad_output_scaled_in_place_fails_inplace_but_gradcheck_passes(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("inplace", "mutates_grad_output")
    assert "grad_output[0] was modified in place by backward" in text
    assert "returned as grad['x']" in text and "grad_output.mul_(2)" in text
    bugs.passed("gradcheck", "mutates_grad_output")


def test_undeclared_in_place_forward_fails_inplace(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("inplace", "relu_input_in_place_without_mark_dirty")
    assert "input 'x' was modified in place by forward, but should be unchanged" in text
    assert "version counter 0 -> 1" in text and "ctx.mark_dirty(x)" in text and "mutates=['x']" in text


def test_saved_tensor_modified_in_backward_fails_inplace(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("inplace", "modifies_saved_tensor")
    assert "ctx.saved_tensors[0] was modified in place by backward" in text


def test_saved_tensor_written_in_backward_blocks_gradgradcheck(conformance_run) -> None:  # type: ignore[no-untyped-def]
    # gradgradcheck runs backward's graph again and meets autograd's version check: inplace's
    # defect, so one defect gives one failure, however gradgradcheck words the errors it owns.
    run = conformance_run(
        ZOO / "grad_and_memory_bugs.py", "-k", "modifies_saved_tensor or scales_saved_input_view",
        contracts=("gradgradcheck", "inplace"), max_examples=3,
    )
    for name in ("modifies_saved_tensor", "scales_saved_input_view"):
        run.failed("inplace", name)
        blocked = run.verdict("gradgradcheck", name)
        assert blocked.outcome == "skipped" and "blocked by inplace: " in blocked.text, blocked.text


def test_gradient_written_through_data_fails_inplace_but_gradcheck_passes(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("inplace", "grad_into_input_data")
    assert "input 'x' was modified in place by backward" in text
    assert "went through .data" in text  # the version counter did not move
    assert "returned its memory as grad['x']" in text
    bugs.passed("gradcheck", "grad_into_input_data")


def test_saved_input_view_scaled_in_backward_fails_inplace_and_blocks_gradcheck(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("inplace", "scales_saved_input_view")
    assert "input 'x' was modified in place by backward" in text
    # gradcheck meets autograd's refusal of the write into its no_grad view of x: inplace's defect.
    blocked = bugs.verdict("gradcheck", "scales_saved_input_view")
    assert blocked.outcome == "skipped" and "blocked by inplace: " in blocked.text, blocked.text
    assert "A view was created in no_grad mode" in blocked.text


def test_view_of_input_as_output_fails_inplace(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("inplace", "returns_input_view")
    assert "output[0] shares memory with input 'x'" in text and "x.clone()" in text


def test_ctx_buffer_clobbered_by_backward_fails_the_rerun(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("inplace", "accumulates_into_ctx_buffer")
    assert "grad['x'] on the second backward != first backward" in text
    assert "Mismatched elements" in text  # assert_close's numbers
    assert "ctx.buffer holds a tensor" in bugs.failed("saved_tensors", "accumulates_into_ctx_buffer")


# ------------------------------------------------------------------ saved_tensors


def test_tensor_on_ctx_fails_saved_tensors_but_gradcheck_passes(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("saved_tensors", "tensor_on_ctx")
    assert "ctx.x holds a tensor ((" in text and "use ctx.save_for_backward" in text.lower()
    bugs.passed("gradcheck", "tensor_on_ctx")
    bugs.passed("inplace", "tensor_on_ctx")


def test_output_cache_leak_fails_saved_tensors(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("saved_tensors", "caches_outputs")
    assert "output[0]" in text and "is alive after backward" in text and "should be freed" in text
    assert "CachesOutputsBackward" in text  # the graph node leaks with it


# ------------------------------------------------------------------ saved_tensors: ctx hygiene (any depth, views)

CTX_CORRECT = (
    "keeps_numpy_copy", "keeps_nested_metadata", "saves_for_backward", "saves_detached", "saves_clone", "mul_keeps_input_on_ctx",
)
CTX_BUGS = ("tensor_three_deep", "numpy_view_of_input", "saves_input_data", "saves_input_data_once", "mul_keeps_input_on_class")


@pytest.fixture
def ctx_zoo(zoo_run):  # type: ignore[no-untyped-def]
    return zoo_run("ctx_hygiene")


def test_tensor_three_levels_deep_fails_saved_tensors_naming_its_path(ctx_zoo) -> None:  # type: ignore[no-untyped-def]
    text = ctx_zoo.failed("saved_tensors", "tensor_three_deep")
    assert "ctx.cache[0][1][0] holds a tensor ((" in text and "It shares memory with input 'x'." in text
    ctx_zoo.passed("gradcheck", "tensor_three_deep")  # right gradients: only saved_tensors can tell
    ctx_zoo.passed("reference", "tensor_three_deep")


def test_numpy_view_of_input_fails_saved_tensors_saying_why(ctx_zoo) -> None:  # type: ignore[no-untyped-def]
    text = ctx_zoo.failed("saved_tensors", "numpy_view_of_input")
    assert "ctx.x_np holds a numpy view of input 'x' memory" in text
    assert "writes to the input change the gradient" in text and ".copy()" in text
    ctx_zoo.passed("gradcheck", "numpy_view_of_input")
    ctx_zoo.passed("reference", "numpy_view_of_input")


def test_a_save_of_input_data_fails_saved_tensors_when_the_input_is_written_after_forward(ctx_zoo) -> None:  # type: ignore[no-untyped-def]
    """save_for_backward(x.data): backward reads what a caller wrote into x after forward, where
    saving x makes it raise. gradcheck and reference never write x, so they pass; the second
    derivative lost through the detached save is the same defect (blocked by saved_tensors)."""
    for name in ("saves_input_data", "saves_input_data_once"):
        text = ctx_zoo.failed("saved_tensors", name)
        assert "grad['x'] changed after input 'x' was written in place between forward and backward" in text, text
        assert "x.mul_(2).add_(1)" in text and "x.data" in text and "ctx.save_for_backward(x)" in text, text
        ctx_zoo.passed("gradcheck", name)
        ctx_zoo.passed("reference", name)
    blocked = ctx_zoo.verdict("gradgradcheck", "saves_input_data")
    assert blocked.outcome == "skipped" and "blocked by saved_tensors: " in blocked.text, blocked.text
    ctx_zoo.passed("gradgradcheck", "saves_input_data_once")  # raises on double backward, as declared


def test_state_kept_on_the_class_fails_saved_tensors_when_two_forwards_run_before_their_backwards(ctx_zoo) -> None:  # type: ignore[no-untyped-def]
    """Backward reads x from a class attribute: one call at a time it is right (gradcheck and
    reference pass); a second forward before the first backward gives the first the second's x."""
    text = ctx_zoo.failed("saved_tensors", "mul_keeps_input_on_class")
    assert "grad['w'] of the first call differs from the same call's alone when a second call's forward runs" in text, text
    assert "forward(a), forward(b), backward(a)" in text and "attribute of the Function class" in text, text
    for contract in ("gradcheck", "reference"):
        ctx_zoo.passed(contract, "mul_keeps_input_on_class")


def test_correct_ways_of_keeping_things_on_ctx_pass(ctx_zoo) -> None:  # type: ignore[no-untyped-def]
    assert ctx_zoo.names() == {*CTX_CORRECT, *CTX_BUGS}
    for name in CTX_CORRECT:
        for contract in ("saved_tensors", "gradcheck", "gradgradcheck", "reference"):
            ctx_zoo.passed(contract, name)


def _ctx_zoo_module() -> Any:
    spec = importlib.util.spec_from_file_location("ctx_hygiene_zoo", ZOO / "ctx_hygiene.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.usefixtures("clean_registry")
def test_the_buggy_twins_really_give_a_gradient_the_input_was_changed_under() -> None:
    """The bugs are real: writing to the input between forward and backward changes their gradient
    (300 instead of 3) without an error; the correct twins give 3 or refuse."""
    zoo = _ctx_zoo_module()

    def gradient_after_write(function: Any) -> float | None:
        x = torch.tensor([1.5], dtype=torch.float64, requires_grad=True)
        y = function.apply(x)
        with torch.no_grad():
            x.mul_(100)
        try:
            return float(torch.autograd.grad(y, x)[0])
        except RuntimeError:  # autograd saw the write (save_for_backward)
            return None

    assert gradient_after_write(zoo.SquareKeepsNumpyView) == 300.0
    assert gradient_after_write(zoo.SquareTensorThreeDeep) == 300.0
    assert gradient_after_write(zoo.SquareKeepsNumpyCopy) == 3.0
    assert gradient_after_write(zoo.SquareSavesForBackward) is None


# The search itself, on fake ctx objects.

Pair = collections.namedtuple("Pair", ["weight", "scale"])


@dataclasses.dataclass(slots=True)
class Slots:
    tensor: Any


class Plain:
    def __init__(self, value: Any) -> None:
        self._value = value


def _paths(ctx: Any) -> list[str]:
    return [held.path for held in held_on(ctx)]


@pytest.mark.parametrize("depth", [1, 2, 3, 6])
def test_search_finds_a_tensor_at_any_depth_of_tuples(depth: int) -> None:
    value: Any = torch.ones(2)
    for _ in range(depth):
        value = (0.5, value)
    assert _paths(SimpleNamespace(cache=value)) == ["ctx.cache" + "[1]" * depth]


def test_search_names_the_path_through_every_kind_of_container() -> None:
    t = torch.ones(2)
    ctx = SimpleNamespace(
        a=[{"k": (t,)}], b={t: "key"}, c={(t,)}, d=Pair(weight=t, scale=2.0),
        e=Slots(t), f=Plain([None, t]),
    )
    assert _paths(ctx) == [
        "ctx.a[0]['k'][0]", "list(ctx.b)[0]", "list(ctx.c)[0][0]", "ctx.d.weight", "ctx.e.tensor", "ctx.f._value[1]",
    ]


def test_search_ends_on_cycles_and_keeps_to_its_node_limit() -> None:
    loop: list[Any] = [torch.ones(1)]
    loop.append(loop)
    node = Plain(None)
    node._value = (node, torch.ones(1))
    assert _paths(SimpleNamespace(loop=loop, node=node)) == ["ctx.loop[0]", "ctx.node._value[1]"]
    ints = [*range(50), torch.ones(1)]
    assert [path for path, _ in reachable([("ctx.ints", ints)])] == ["ctx.ints[50]"]
    # The limit bounds the walk of each attribute, not of the others.
    assert [path for path, _ in reachable([("ctx.ints", ints), ("ctx.t", torch.ones(1))], limit=20)] == ["ctx.t"]


def test_search_skips_metadata_callables_modules_and_private_ctx_attributes() -> None:
    t = torch.ones(2)
    ctx = SimpleNamespace(
        shape=t.shape, meta=((t.shape, (1.5, (2, "sum"))),), dtype=t.dtype, device=t.device, pair=Pair(1.0, 2.0),
        scalar=np.float64(1.0), module=torch.nn.Linear(2, 2), fn=lambda: t, klass=Plain, _private=t,
        objects=np.array([t], dtype=object),
    )
    assert held_on(ctx) == []


class _Raises:
    @property
    def __dict__(self) -> Any:  # type: ignore[override]
        raise RuntimeError("no attributes today")


def test_search_survives_an_object_that_raises_and_goes_on() -> None:
    assert _paths(SimpleNamespace(odd=_Raises(), t=torch.ones(1))) == ["ctx.t"]


def test_a_numpy_view_or_memoryview_of_an_input_is_told_from_a_copy() -> None:
    x = torch.arange(12.0).reshape(3, 4)
    own = torch.ones(3)  # the Function's intermediate, not an input or output
    ctx = SimpleNamespace(
        view=x.detach().numpy(), row=x.numpy()[1, ::-2], mv=memoryview(x.numpy()), cpu=x.cpu().numpy(),
        copy=x.detach().numpy().copy(), own=own.numpy(), listed=array.array("d", [1.0]), empty=x.numpy()[:0],
        storage=x.untyped_storage(),
    )
    owners = [("input 'x'", x)]
    found = {held.path: owner_of(held.span, owners) for held in held_on(ctx)}
    assert found == {
        "ctx.view": "input 'x'", "ctx.row": "input 'x'", "ctx.mv": "input 'x'", "ctx.cpu": "input 'x'",
        "ctx.copy": None, "ctx.own": None, "ctx.listed": None, "ctx.empty": None, "ctx.storage": "input 'x'",
    }
    kinds = {held.path: held.kind for held in held_on(ctx)}
    assert kinds["ctx.view"] == "numpy" and kinds["ctx.mv"] == "memoryview"


def test_a_tensor_view_of_an_input_is_held_with_the_input_as_owner() -> None:
    x, out = torch.arange(6.0), torch.zeros(2)
    (held,) = held_on(SimpleNamespace(tail=x[3:].view(3, 1)))
    assert held == Held("ctx.tail", "tensor", "(3, 1) torch.float32", held.span) and held.is_tensor
    assert owner_of(held.span, [("output[0]", out), ("input 'x'", x)]) == "input 'x'"
    assert owner_of(held.span, [("output[0]", out)]) is None


# ------------------------------------------------------------------ undefined_grads


def test_none_grad_output_unhandled_fails_undefined_grads(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("undefined_grads", "none_unaware_two_outputs")
    assert "backward raised TypeError when output[" in text and "unused" in text
    assert "None)" in text or "(None," in text  # the grad_outputs it received
    assert "set_materialize_grads(False)" in text
    # gradcheck differentiates one output at a time and meets the same None: blocked, not a second failure
    blocked = bugs.verdict("gradcheck", "none_unaware_two_outputs")
    assert blocked.outcome == "skipped" and "blocked by undefined_grads: " in blocked.text, blocked.text


# ------------------------------------------------------------------ one finding per bug


@pytest.mark.parametrize("name", sorted(INTENDED))
def test_each_bug_fails_only_its_behavioural_contract(bugs, name: str) -> None:  # type: ignore[no-untyped-def]
    for contract in BEHAVIOUR:
        outcome = bugs.outcome(contract, name)
        if contract == INTENDED[name]:
            found = bugs.verdict(contract, name).recorded.outcome
            assert found is (Outcome.ADVICE if contract == "unneeded_grads" else Outcome.FAILED), (contract, name, found)
        elif outcome == "skipped" and _honest_skip(contract, bugs.verdict(contract, name).text):
            continue
        elif outcome == "skipped":  # one defect, one failure: the others say what blocks them
            assert f"blocked by {INTENDED[name]}: " in bugs.verdict(contract, name).text
        else:
            assert outcome == "passed", f"{contract}[{name}] {outcome}:\n{bugs.verdict(contract, name).text}"


# ------------------------------------------------------------------ no false positives


def test_unusual_but_correct_functions_pass(unusual) -> None:  # type: ignore[no-untyped-def]
    names = unusual.names()
    assert {
        "scale_trailing_nones", "none_aware_two_outputs", "max_with_index", "double_in_place",
        "exp_saves_output", "copy_returns_grad_output", "sum_expands_grad_output", "mul_setup_context",
        "keep_positive_with_mask",
    } <= names
    for (contract, name, device), verdict in unusual.verdicts.items():
        if contract == "undefined_grads" and name not in MULTI_OUTPUT_CORRECT:
            assert verdict.outcome == "skipped" and SINGLE_OUTPUT_SKIP in verdict.text, f"{name}: {verdict.text}"
            continue
        if verdict.outcome == "skipped" and _honest_skip(contract, verdict.text):
            continue
        assert verdict.outcome == "passed", f"{contract}[{name}-{device}]:\n{verdict.text}"


def test_reference_ops_pass_behavioural_contracts(conformance_run) -> None:  # type: ignore[no-untyped-def]
    run = conformance_run("reference_ops", contracts=BEHAVIOUR, max_examples=4)
    assert {"square", "sigmoid", "linear", "logsumexp", "swish"} <= run.names()
    for (contract, name, device), verdict in run.verdicts.items():
        if verdict.outcome == "skipped" and contract in ("undefined_grads", "unneeded_grads"):
            assert _honest_skip(contract, verdict.text), verdict.text
            continue
        assert verdict.outcome == "passed", f"{contract}[{name}-{device}]:\n{verdict.text}"
