"""Beyond eager autograd: each new contract (opcheck, compile, forward_ad, func, autocast) catches
its zoo bug and only that, its correct twin passes everything, custom ops are first-class targets
(every applicable contract runs on them), and the new reference ops pass."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import conformance
from conformance import Tensor, test_compile
from conformance.engine.verdict import Outcome, owner_missed
from tests.conftest import ZOO

# Each zoo bug, the contracts it may fail (the first is its owner), and a contract that must pass
# on it because it cannot see the defect.
BUGS = {
    "custom_op_fake_wrong_shape": ({"opcheck"}, "reference"),
    "custom_op_fake_swapped_dims": ({"opcheck"}, "reference"),
    "custom_op_fake_dtype": ({"opcheck"}, "gradcheck"),
    "custom_op_backward_wrong": ({"gradcheck"}, "opcheck"),  # reference and gradgradcheck: blocked by gradcheck
    "custom_op_bias_grad_wrong_dim": ({"grad_meta"}, "return_count"),
    "compile_only_bug": ({"compile"}, "gradcheck"),
    "compile_graph_break": ({"compile"}, "reference"),
    "compile_recompile_storm": ({"compile"}, "reference"),
    "wrong_jvp": ({"forward_ad"}, "gradcheck"),
    "wrong_vmap_rule": ({"func"}, "gradcheck"),
    "autocast_dtype_grads": ({"autocast"}, "grad_meta"),
}
OWNERS = {
    "custom_op_fake_wrong_shape": "opcheck",
    "custom_op_fake_swapped_dims": "opcheck",
    "custom_op_fake_dtype": "opcheck",
    "custom_op_backward_wrong": "gradcheck",
    "custom_op_bias_grad_wrong_dim": "grad_meta",
    "compile_only_bug": "compile",
    "compile_graph_break": "compile",
    "compile_recompile_storm": "compile",
    "wrong_jvp": "forward_ad",
    "wrong_vmap_rule": "func",
    "autocast_dtype_grads": "autocast",
}
NEW_REFERENCE_OPS = (
    "custom_softplus", "custom_rms_norm", "custom_swiglu", "triton_custom_swiglu",
    "silu_jvp", "softcap", "bias_softmax", "autocast_linear", "autocast_fp32_softmax",
)


@pytest.fixture
def bugs(zoo_run):  # type: ignore[no-untyped-def]
    return zoo_run("beyond_eager_bugs")


@pytest.fixture
def twins(conformance_run):  # type: ignore[no-untyped-def]
    return conformance_run(ZOO / "beyond_eager_correct.py", max_examples=10)


@pytest.mark.parametrize("name", sorted(BUGS))
def test_each_bug_fails_only_the_contracts_that_own_it(bugs, name: str) -> None:  # type: ignore[no-untyped-def]
    allowed, blind = BUGS[name]
    failed = {c for (c, fn, _), v in bugs.verdicts.items() if fn == name and v.outcome == "failed"}
    assert OWNERS[name] in failed, (name, failed)
    assert failed <= allowed, (name, failed)
    row = {c: (v.recorded.outcome, v.recorded.owner) for (c, fn, _), v in bugs.verdicts.items() if fn == name}
    for contract, (outcome, owner) in row.items():
        if outcome is Outcome.BLOCKED:  # blocked by an owner that failed, or by one blocked by it
            assert owner_missed(owner, row) is None, (contract, owner, row)
    bugs.passed(blind, name)


def test_second_derivatives_of_a_wrong_backward_are_blocked_by_gradcheck(bugs) -> None:  # type: ignore[no-untyped-def]
    """One defect, one failure: finite differences of a backward already wrong on the case judge
    nothing new (gradgradcheck failed too, and said nothing of the first derivative)."""
    blocked = bugs.verdict("gradgradcheck", "custom_op_backward_wrong")
    assert blocked.outcome == "skipped" and "blocked by gradcheck: first derivatives are already wrong on this case" in blocked.text, blocked.text
    bugs.failed("gradcheck", "custom_op_backward_wrong")


def test_a_real_kernel_of_another_dtype_than_its_fake_is_opchecks_and_blocks_reference(bugs) -> None:  # type: ignore[no-untyped-def]
    assert "MetadataMismatchError" in bugs.failed("opcheck", "custom_op_fake_dtype")
    blocked = bugs.verdict("reference", "custom_op_fake_dtype")
    assert blocked.outcome == "skipped" and "blocked by opcheck: test_faketensor failed" in blocked.text, blocked.text


def test_every_twin_passes_every_contract(twins) -> None:  # type: ignore[no-untyped-def]
    assert twins.names() == {f"{name}_ok" for name in BUGS}
    failures = {key: v.text[-1500:] for key, v in twins.verdicts.items() if v.outcome == "failed"}
    assert not failures, failures
    for name in BUGS:
        twins.passed(OWNERS[name], f"{name}_ok")


def test_opcheck_names_the_failing_sub_check(bugs) -> None:  # type: ignore[no-untyped-def]
    text = bugs.failed("opcheck", "custom_op_fake_wrong_shape")
    assert "test_faketensor failed" in text and "MetadataMismatchError" in text
    assert "test_schema: passed" in text and "test_faketensor: FAILED" in text
    blocked = bugs.verdict("compile", "custom_op_fake_wrong_shape")
    assert blocked.outcome == "skipped" and "blocked by opcheck" in blocked.text
    # A fake kernel right only where two dims are equal: compile's later calls give them different
    # sizes, so compile meets it (blocked by opcheck) instead of passing it.
    swapped = bugs.verdict("compile", "custom_op_fake_swapped_dims")
    assert swapped.outcome == "skipped" and "blocked by opcheck" in swapped.text, swapped.text
    # A gradient of the wrong shape is grad_meta's: opcheck's test_aot_dispatch_dynamic and compile
    # meet it too, at every call's sizes, and are blocked by it.
    for contract in ("opcheck", "compile"):
        wrong_dim = bugs.verdict(contract, "custom_op_bias_grad_wrong_dim")
        assert wrong_dim.outcome == "skipped" and "blocked by grad_meta" in wrong_dim.text, (contract, wrong_dim.text)


def test_compile_reports_wrong_values_graph_breaks_and_recompile_storms(bugs) -> None:  # type: ignore[no-untyped-def]
    wrong = bugs.failed("compile", "compile_only_bug")
    # torch keeps its structured-trace logger at DEBUG for TORCH_TRACE files; pytest captures
    # non-propagating loggers too, and every compile filled the report with empty DEBUG lines.
    assert "torch.__trace" not in bugs.verdict("compile", "compile_only_bug").log
    assert "(eager is within it)" in wrong and "backend='aot_eager'" in wrong and "grad['x']" in wrong
    # Both break a promise their specs make (compile="fullgraph", compile="dynamic"): defects.
    graph_break = bugs.failed("compile", "compile_graph_break")
    assert "but the spec promises compile='fullgraph'" in graph_break and "data pointer" in graph_break
    storm = bugs.failed("compile", "compile_recompile_storm")
    assert "compiled 3 variants for 3 calls" in storm and "the spec promises compile='dynamic'" in storm
    assert "TORCH_LOGS=recompiles" in storm


def test_forward_ad_func_and_autocast_messages_name_the_transform(bugs) -> None:  # type: ignore[no-untyped-def]
    assert "jvp" in bugs.failed("forward_ad", "wrong_jvp")
    assert "torch.func.vmap(SoftmaxVmapIgnoresInDims, in_dims=" in bugs.failed("func", "wrong_vmap_rule")
    autocast = bugs.failed("autocast", "autocast_dtype_grads")
    assert "grad['x'].dtype=bfloat16 as backward returned it, narrower than x's float32, but should be <= 3 x" in autocast
    assert "(native autocast's own error, or x's dtype's rounding)" in autocast


def test_forward_ad_in_lower_precision_goes_through_the_reference_policy(conformance_run) -> None:  # type: ignore[no-untyped-def]
    run = conformance_run(ZOO / "beyond_eager_bugs.py", "--dtypes=float32", contracts=("forward_ad",), max_examples=10)
    text = run.failed("forward_ad", "wrong_jvp")
    assert "max|tangent[" in text and "reference's own error in float32" in text


def test_contracts_that_do_not_apply_say_why(bugs) -> None:  # type: ignore[no-untyped-def]
    custom_op = bugs.verdict("forward_ad", "custom_op_backward_wrong")
    assert custom_op.outcome == "skipped" and "no forward-mode AD registration" in custom_op.text
    function = bugs.verdict("opcheck", "wrong_jvp")
    assert function.outcome == "skipped" and "is an autograd.Function" in function.text
    custom_op_autocast = bugs.verdict("autocast", "custom_op_backward_wrong")
    assert custom_op_autocast.outcome == "skipped" and "the dispatcher casts their inputs" in custom_op_autocast.text


def test_custom_ops_run_every_applicable_existing_contract(conformance_run) -> None:  # type: ignore[no-untyped-def]
    run = conformance_run("reference_ops", "-k", "custom_", max_examples=5)
    for contract in ("return_count", "grad_meta", "needs_input_grad", "reference", "gradcheck", "layouts",
                     "inplace", "stability", "saved_tensors", "determinism", "opcheck", "compile", "func"):
        run.passed(contract, "custom_softplus")


@pytest.mark.parametrize("seed", [1])  # the main job (.ci/run) runs seed 0
def test_new_reference_ops_pass_on_another_seed(conformance_run, seed: int) -> None:  # type: ignore[no-untyped-def]
    from reference_ops.triton._common import INTERPRETED

    # A native Triton kernel runs on CUDA tensors only: its test ids are -cuda ones there.
    triton_device = "cpu" if INTERPRETED else "cuda"
    devices = () if INTERPRETED else ("--device=auto",)
    run = conformance_run("reference_ops", f"--seed={seed}", *devices, "-k", " or ".join(NEW_REFERENCE_OPS), max_examples=5)
    assert set(NEW_REFERENCE_OPS) <= run.names()
    failures = {key: v.text[-1500:] for key, v in run.verdicts.items() if v.outcome == "failed"}
    assert not failures, failures
    for name in ("silu_jvp", "softcap", "bias_softmax"):
        run.passed("forward_ad", name)
        run.passed("func", name)
    for name in ("autocast_linear", "autocast_fp32_softmax"):
        run.passed("autocast", name)
    for name in ("custom_softplus", "custom_rms_norm", "custom_swiglu", "triton_custom_swiglu"):
        device = triton_device if name.startswith("triton_") else "cpu"
        run.passed("opcheck", name, device)
        run.passed("compile", name, device)


def test_inductor_is_opt_in(conformance_run) -> None:  # type: ignore[no-untyped-def]
    run = conformance_run(ZOO / "beyond_eager_correct.py", "--compile-backends=inductor", "-k", "compile_only_bug_ok",
                          contracts=("compile",), max_examples=1)
    run.passed("compile", "compile_only_bug_ok")
    bad = conformance_run(ZOO / "beyond_eager_correct.py", "--compile-backends=tvm", contracts=("compile",), cache=False)
    assert bad.result is not None  # an uncached run keeps its pytest result
    assert "--compile-backends: unknown ['tvm']" in str(bad.result.stderr) + str(bad.result.stdout)


def test_a_spec_whose_function_is_replaced_calls_the_new_one() -> None:
    """``dataclasses.replace(spec, fn=other)`` copies the old adapter along; the spec rebuilds it, so
    contracts that call the target as users do (``spec.op.call``) never run the replaced Function."""
    import dataclasses

    import torch

    from conformance.spec import Spec

    class PlusOne(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[no-untyped-def]
            return x + 1

        @staticmethod
        def backward(ctx, g):  # type: ignore[no-untyped-def]
            return g

    class PlusTwo(PlusOne):
        @staticmethod
        def forward(ctx, x):  # type: ignore[no-untyped-def]
            return x + 2

    spec = Spec(
        fn=PlusOne, name="plus_one", inputs=(), reference=lambda x: x + 1, dtypes=(torch.float64,), devices=("cpu",),
        double_backward=False, surrogate=None, mutates=(), nondeterministic=False,
    )
    replaced = dataclasses.replace(spec, fn=PlusTwo)
    assert replaced.op.call(torch.zeros(1)).item() == 2.0, "the replaced spec still calls PlusOne"
    assert spec.op.call(torch.zeros(1)).item() == 1.0


class _TripleUnderCompile(torch.autograd.Function):
    """y = 2x; backward's compile-only branch returns 3g (eager's 2g is right)."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x * 2

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        return grad * 3 if torch.compiler.is_compiling() else grad * 2


def test_a_dynamo_wrong_on_the_canary_convicts_only_a_compile_only_branch_eager_shows(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """torch 2.11's Dynamo gives zero gradients for a correct Function whose forward returns a no-op
    ``.to(x.dtype)``: there, every upcasting reference op failed compile. A Dynamo that fails the
    canary convicts a Function only through evidence without Dynamo: its compile-only branch, run
    eagerly with ``is_compiling()`` True. This torch's Dynamo passes it: the same bug is a defect."""
    keywords = {"inputs": [Tensor("x", "n")], "reference": lambda x: x * 2, "device": "cpu", "dtypes": ["float64"],
                "contracts": ["compile"], "max_examples": 1, "raise_on_failure": False}
    assert test_compile.dynamo_canary_failure() == "", "this torch's Dynamo fails the canary"
    plain = conformance.check(_TripleUnderCompile, **keywords)
    assert plain.outcome("compile") == "failed" and "compile-only branch" not in plain.results[0].verdict.message
    monkeypatch.setattr(test_compile, "dynamo_canary_failure", lambda: "grad [0.0] instead of [0.75] (simulated)")
    convicted = conformance.check(_TripleUnderCompile, **keywords)
    assert convicted.outcome("compile") == "failed", str(convicted)
    text = convicted.results[0].verdict.message
    assert "The Function's own compile-only branch shows it without Dynamo" in text and "is_compiling()=True" in text, text
    # No such evidence (the branch is not taken eagerly): the difference may be Dynamo's alone.
    monkeypatch.setattr(test_compile, "_compiling_branch_eagerly", lambda *args: RuntimeError("no evidence"))
    doubted = conformance.check(_TripleUnderCompile, **keywords)
    assert doubted.outcome("compile") == "upstream", str(doubted)
    text = doubted.results[0].verdict.message
    assert "Dynamo is wrong on a correct canary Function" in text and "(simulated)" in text, text


class _ScaleWithWrongWeightTangent(torch.autograd.Function):
    """x * w with a jvp off by half in w's tangent only (x's is right)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.save_for_forward(x, w)
        return x * w

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        return grad * w, grad * x

    @staticmethod
    def jvp(ctx: Any, x_tangent: torch.Tensor | None, w_tangent: torch.Tensor | None) -> torch.Tensor:
        x, w = ctx.saved_tensors
        out = torch.zeros_like(x * w)
        if x_tangent is not None:
            out = out + x_tangent * w
        if w_tangent is not None:
            out = out + 0.5 * x * w_tangent
        return out


def test_forward_ad_names_the_input_whose_tangent_is_wrong(clean_registry) -> None:  # type: ignore[no-untyped-def]
    # A new user's trial: the failure named every input ("with respect to 'x', 'w'").
    with pytest.raises(conformance.ConformanceFailure) as raised:
        conformance.check(_ScaleWithWrongWeightTangent, inputs=[Tensor("x", "n"), Tensor("w", "n")], reference=torch.mul,
                          dtypes=(torch.float64,), contracts=["forward_ad"], device="cpu", max_examples=3)
    assert "with respect to 'w' [" in str(raised.value), str(raised.value)


class _LinearCrossEntropyOfOneClass(torch.autograd.Function):
    """mean cross-entropy of x @ w.T over a single class: exactly 0, and so are its gradients. Its
    backward recomputes the logits in float32 against forward's saved log-sum-exp (under autocast
    a bfloat16 one): (p - 1) * w off by a bfloat16 rounding step of its terms, not of 0."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = x.float() @ w.float().t()
        lse = torch.logsumexp(logits, -1)
        ctx.save_for_backward(x, w, target, lse)
        return (lse - logits.gather(1, target[:, None])[:, 0]).mean().to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, w, target, lse = ctx.saved_tensors
        p = torch.exp(x.float() @ w.float().t() - lse[:, None])
        p = p - torch.nn.functional.one_hot(target, p.shape[1]).to(p.dtype)
        p = p * (grad.float() / x.shape[0])
        return (p @ w.float()).to(x.dtype), (p.t() @ x.float()).to(w.dtype), None


def test_autocast_measures_the_terms_of_a_result_that_is_exactly_zero(clean_registry) -> None:  # type: ignore[no-untyped-def]
    # A new user's trial: the budget was 11 rounding steps "at 0" (1e-39), as the truth's term
    # bounds were never measured under autocast; the gradient was 1/30 of a step of its terms off.
    result = conformance.check(
        _LinearCrossEntropyOfOneClass,
        inputs=[Tensor("x", "n h"), Tensor("w", "1 h"), conformance.Index("target", "n", high=1)],
        reference=lambda x, w, t: torch.nn.functional.cross_entropy(x @ w.t(), t),
        dtypes=(torch.float64, torch.float32), double_backward=False, contracts=["autocast"], device="cpu", seed=0,
    )
    assert [r.verdict.outcome for r in result.results] == [Outcome.PASSED], result


class _MeanOverACountReadInForward(torch.autograd.Function):
    """A masked mean that keeps its count as a Python int (int(tensor) in forward): right in
    eager; Dynamo under fullgraph fails internally on the number (an unbacked symbol)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        count = valid.sum().clamp(min=1)
        ctx.count = int(count)
        ctx.save_for_backward(valid)
        return (x * valid).sum() / count

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (valid,) = ctx.saved_tensors
        return grad / ctx.count * valid.to(grad.dtype), None


def test_compile_names_a_number_read_from_a_tensor_as_the_workaround(clean_registry) -> None:  # type: ignore[no-untyped-def]
    # A new user's trial: torch's message points at the suite's own frame, not the int() line.
    result = conformance.check(
        _MeanOverACountReadInForward, inputs=[Tensor("x", "n"), conformance.Mask("valid", "n")],
        reference=lambda x, valid: (x * valid).sum() / valid.sum().clamp(min=1),
        dtypes=(torch.float64,), contracts=["compile"], device="cpu", seed=0,
    )
    assert result.outcome("compile") == "upstream", str(result)
    assert "keep it a tensor" in result.results[0].verdict.message, result.results[0].verdict.message
