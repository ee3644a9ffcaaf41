"""``python -m conformance write``: specs written from one example call collect, and once the test
fills in their reference stubs, pass on correct Functions and catch the zoo's bugs."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch.autograd.function import once_differentiable

import conformance
from conformance.embed.ghostwriter import GhostwriterError, parse_example, write_spec
from conformance.engine.loader import import_path
from tests.conftest import REPO
from tests.zoo_runs import CORNER_OWNERS, ZOO_RUNS

EVERYONES = ZOO_RUNS["everyones_code_bugs"].contracts


@dataclass(frozen=True)
class Written:
    correct: str  # module:Name
    bug: str  # module:Name of a buggy twin
    example: str
    reference: str  # the stub's body, as the author writes it
    catches: frozenset[str]  # contracts among which the bug must fail
    imports: str = ""
    # The contracts the zoo runs the correct twin under (its file's run in tests/zoo_runs.py; the
    # corner twins' attention, e.g., has no double backward guard and no autocast support); None: all.
    contracts: tuple[str, ...] | None = None


CASES = {
    "attention_causal": Written(
        "tests.zoo.corner_bugs:CausalAttentionShortQueriesOk", "tests.zoo.corner_bugs:CausalAttentionShortQueries",
        "q=torch.randn(2, 3, 4), k=torch.randn(2, 5, 4), v=torch.randn(2, 5, 6), causal=True",
        "return _attention_reference(q, k, v, causal)", frozenset({"reference", "gradcheck"}),
        "from tests.zoo.corner_bugs import _attention_reference", CORNER_OWNERS,
    ),
    "rmsnorm": Written(
        "reference_ops.normalization:RMSNorm", "tests.zoo.unregistered_kernels:RMSNormRowsOnly",
        "x=torch.randn(3, 8), weight=torch.randn(8), eps=1e-6",
        "return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight", frozenset({"grad_meta"}),
    ),
    "cross_entropy_ignore_index": Written(
        "tests.zoo.corner_bugs:CrossEntropyIgnoreOk", "tests.zoo.corner_bugs:CrossEntropyIgnore",
        "logits=torch.randn(4, 5), target=torch.tensor([1, -100, 3, 0]), ignore_index=-100",
        "return _cross_entropy(logits, target, ignore_index)", frozenset({"gradcheck", "reference"}),
        "from tests.zoo.corner_bugs import _cross_entropy", CORNER_OWNERS,
    ),
    "varlen": Written(
        "tests.zoo.corner_bugs:SegmentSumOk", "tests.zoo.corner_bugs:SegmentSum",
        "x=torch.randn(7, 3), cu=torch.tensor([0, 2, 2, 7], dtype=torch.int32)",
        "return _segment_sums(x, cu)", frozenset({"gradcheck", "reference"}),
        "from tests.zoo.corner_bugs import _segment_sums", CORNER_OWNERS,
    ),
    "inplace": Written(
        "tests.zoo.everyones_code_correct:InplaceSquare", "tests.zoo.everyones_code_bugs:InplaceSquareSignBits",
        "x=torch.randn(3, 4)", "return torch.square(x)", frozenset({"stability"}), contracts=EVERYONES,
    ),
    "index_output": Written(
        "tests.zoo.everyones_code_correct:SortRows", "tests.zoo.everyones_code_bugs:SortRowsContiguous",
        "x=torch.randn(3, 4)", "return torch.sort(x, dim=-1)", frozenset({"layouts", "reference"}), contracts=EVERYONES,
    ),
}


def _filled(text: str, case: Written) -> str:
    """The written module with its reference stub filled in, as the author would."""
    stub = [line for line in text.splitlines() if line.strip().startswith("raise NotImplementedError(")]
    assert len(stub) == 1, text
    body = f"    {case.imports}\n    {case.reference}" if case.imports else f"    {case.reference}"
    return text.replace(stub[0], body)


def _load(tmp_path: Path, target: str, example: str, name: str, case: Written) -> str:
    written = write_spec(target, parse_example(example), name=name, example_text=example)
    path = tmp_path / f"{name}.py"
    path.write_text(_filled(written, case))
    import_path(path)
    return written


@pytest.mark.parametrize("label", list(CASES))
def test_a_written_spec_passes_the_correct_function_and_catches_the_bug(label: str, tmp_path: Path, clean_registry) -> None:  # type: ignore[no-untyped-def]
    case = CASES[label]
    written = _load(tmp_path, case.correct, case.example, f"written_{label}", case)
    _load(tmp_path, case.bug, case.example, f"written_{label}_bug", case)
    assert "reference=reference" in written and "TODO" in written
    contracts = list(case.contracts) if case.contracts is not None else None
    passed = conformance.check(f"written_{label}", device="cpu", contracts=contracts, profile="ci", raise_on_failure=False)
    assert passed.passed, f"{written}\n{passed}"
    with pytest.raises(conformance.ConformanceFailure) as raised:
        conformance.check(f"written_{label}_bug", device="cpu", contracts=sorted(case.catches), profile="ci")
    failed = {f.contract for f in raised.value.failures}
    assert failed & case.catches, f"{failed} should include one of {sorted(case.catches)}:\n{raised.value}"


def test_the_command_prints_a_spec_that_collects(tmp_path: Path) -> None:
    case = CASES["cross_entropy_ignore_index"]
    done = subprocess.run(
        [sys.executable, "-m", "conformance", "write", case.correct, "--example", case.example, "--name", "written_ce"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "Index('target', 'n', high='m', sentinels=(-100,))" in text, text
    assert "Scalar('ignore_index', -100)" in text, text
    (tmp_path / "written_ce.py").write_text(text)
    # The command the spec's docstring gives, run as written from the user's folder (the target
    # module importable, as the user's own package is).
    command = next(line.strip() for line in text.splitlines() if "--impl=<this file>" in line)
    assert command == "pytest --pyargs conformance --impl=<this file>", command
    args = command.replace("<this file>", "written_ce.py").split()[1:]
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "--collect-only", "-q", "-p", "no:cacheprovider", "-k", "written_ce"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))},
    )
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-2000:]
    assert "test_gradcheck[written_ce-cpu]" in collected.stdout


@pytest.mark.parametrize(
    ("target", "example", "echo"),
    [
        ("tests.zoo.corner_bugs", "x=1", "is not module:Name"),
        ("tests.zoo.corner_bugs:NoSuchThing", "x=1", "has no attribute 'NoSuchThing'"),
        ("tests.zoo.corner_bugs:SegmentSumOk", "y=torch.randn(3)", "example names ['y']"),
        ("tests.zoo.corner_bugs:SegmentSumOk", "x=torch.randn(3, 2)", "gives no value for 'cu'"),
        ("tests.zoo.corner_bugs:SegmentSumOk", "x=torch.randn(3, 2), cu=", "is not name=value"),
        ("tests.zoo.corner_bugs:SegmentSumOk", "x=torch.randn(0, 2), cu=torch.tensor([0, 0])", "are empty"),
        ("tests.zoo.core_bugs:TooFewGrads", "x=torch.randn(3), scale=2.0", "a trial backward on the example raised"),
    ],
)
def test_bad_targets_and_examples_are_refused_echoing_them(target: str, example: str, echo: str) -> None:
    with pytest.raises(GhostwriterError) as raised:
        write_spec(target, parse_example(example))
    assert echo in str(raised.value)


class Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, table, idx, *, reduce=False):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(idx)
        ctx.rows = table.shape[0]
        return table[idx]

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        (idx,) = ctx.saved_tensors
        grad = g.new_zeros(ctx.rows, g.shape[-1])
        grad.index_add_(0, idx.flatten(), g.reshape(-1, g.shape[-1]))
        return grad, None


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    @once_differentiable
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        (x,) = ctx.saved_tensors
        return 2 * x * g


def test_a_multi_dim_index_gets_the_tightest_bound_and_keyword_only_arguments_are_left_out() -> None:
    text = write_spec("tests.test_ghostwriter:Gather", parse_example("table=torch.randn(8, 32), idx=torch.tensor([[0, 5], [3, 7]])"))
    assert "Index('idx', 'd d', high='n')" in text, text  # 8 rows (n), not 32 columns (m)
    assert "TODO: or m (larger dims fit too)" in text, text
    assert "dim d appears twice in idx" in text, text
    assert "reduce" not in text.split("inputs=[", 1)[1], text


def test_once_differentiable_is_named_as_such() -> None:
    text = write_spec("tests.test_ghostwriter:Square", parse_example("x=torch.randn(3, 4)"))
    assert "double_backward=False,  # its gradients lead back to no input: backward is not differentiable" in text, text


class ScaleInFloat32(torch.autograd.Function):
    """A kernel that accumulates in float32 whatever the input dtype (as many Triton kernels do)."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return (x.float() * 3).to(x.dtype)

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        return (g.float() * 3).to(g.dtype)


def test_float64_is_listed_only_for_a_float64_computation() -> None:
    """Forward runs on float64 inputs either way; listing float64 for a float32 kernel would fail
    gradcheck on correct code, and leaving it out of an exact float64 op (a sort, a gather, a scale)
    would lose gradcheck."""
    text = write_spec("tests.test_ghostwriter:ScaleInFloat32", parse_example("x=torch.randn(3, 4)"))
    assert "dtypes=(torch.float32, torch.float16, torch.bfloat16)" in text, text
    assert "refused float64 (computes in float32" in text, text
    for target, example in (("tests.test_ghostwriter:Gather", "table=torch.randn(8, 32), idx=torch.tensor([1, 5])"),
                            ("tests.zoo.everyones_code_correct:SortRows", "x=torch.randn(3, 4)")):
        assert "dtypes=(torch.float64," in write_spec(target, parse_example(example)), target


def test_a_leading_batch_keeps_the_dims_a_lower_rank_input_lines_up_with() -> None:
    text = write_spec("reference_ops.normalization:RMSNorm", parse_example("x=torch.randn(3, 5, 16), weight=torch.randn(16), eps=1e-6"))
    assert "Tensor('x', '*batch n')" in text and "Tensor('weight', 'n')" in text, text
