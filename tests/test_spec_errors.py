"""A spec that cannot work fails at registration with one error naming the spec and the field,
and ``pytest conformance --impl=bad_spec.py`` stops with that one error and no traceback."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import strategies as st

from conformance import Index, Mask, Scalar, SpecError, Tensor, register
from conformance.spec import parse_shape
from tests.conftest import CONFORMANCE_DIR


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * 2 + y

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return grad_output * 2, grad_output


def ok_inputs() -> list[Any]:
    return [Tensor("x", "n"), Tensor("y", "n")]


def reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * 2 + y


@pytest.mark.parametrize(
    ("overrides", "field", "phrase"),
    [
        ({"inputs": [Tensor("x", "n")]}, "inputs", "forward takes 2 arguments after ctx, but the spec lists 1"),
        ({"inputs": [Tensor("x", "n"), Tensor("x", "n")]}, "inputs[1].name", "duplicate argument name 'x'"),
        ({"inputs": [Tensor("x", "n", domain="negative"), Tensor("y", "n")]}, "inputs[0].domain", "unknown domain 'negative'"),
        ({"inputs": [Tensor("x", "n", domain=(1.0, 0.0)), Tensor("y", "n")]}, "inputs[0].domain", "low < high"),
        ({"reference": "x * 2"}, "reference", "is not callable"),
        ({"reference": lambda x: x}, "reference", "takes 1..1 positional arguments, but the spec lists 2"),
        ({"dtypes": (torch.float32, torch.int64)}, "dtypes", "torch.int64 is not a floating-point torch.dtype"),
        ({"dtypes": ()}, "dtypes", "non-empty"),
        ({"inputs": [Tensor("x", "n *batch"), Tensor("y", "n")]}, "inputs[0].shape", "'*batch' must be the first token"),
        ({"inputs": [Tensor("x", "n 0"), Tensor("y", "n")]}, "inputs[0].shape", "must be >= 1"),
        ({"inputs": [Tensor("x", "n d-1"), Tensor("y", "n")]}, "inputs[0].shape", "token 'd-1'"),
        ({"devices": ("cpu", "tpu")}, "devices", "'tpu' is not one of"),
        ({"mutates": ("z",)}, "mutates", "'z' is not the name of a Tensor input"),
        ({"mutates": "x"}, "mutates", "got the string 'x'"),
        ({"double_backward": "no"}, "double_backward", "must be True or False"),
        ({"compile": "full"}, "compile", "'full' is not a torch.compile promise; choose from ('fullgraph', 'dynamic')"),
        ({"compile": 3}, "compile", "must be one of ('fullgraph', 'dynamic') or a sequence of them, got 3"),
        ({"surrogate": 3}, "surrogate", "is not callable"),
        ({"name": "has space"}, "name", "must be a non-empty string"),
        ({"tolerances": {torch.float16: {"grad": 4}}}, "tolerances", "not one of the spec's dtypes"),
        ({"tolerances": {torch.float32: {"grad": 1e6}}}, "tolerances", "must be a number in (0, 64"),
        ({"tolerances": {torch.float32: {"gradient": 4}}}, "tolerances", "key 'gradient'"),
        ({"inputs": [Tensor("x", "n"), "y"]}, "inputs[1]", "is not a Tensor, Scalar, Mask, AdditiveMask, Index, Derived or Offsets"),
        ({"inputs": [Tensor("x", "n"), Index("y", "n", high=0)]}, "inputs[1].high", "positive int"),
        ({"inputs": [Tensor("x", "n", kinks=0.5), Tensor("y", "n")]}, "inputs[0].kinks", "must be a tuple of kink locations"),  # type: ignore[arg-type]
        ({"inputs": [Tensor("x", "n", kinks=(float("nan"),)), Tensor("y", "n")]}, "inputs[0].kinks", "kink nan is not a finite number"),
        ({"inputs": [Tensor("x", "n", kinks=(True,)), Tensor("y", "n")]}, "inputs[0].kinks", "kink True is not a finite number"),
        ({"inputs": [Tensor("x", "n", kinks=("clip",)), Tensor("y", "n")]}, "inputs[0].kinks", "'clip' names no Scalar input"),
        ({"tolerances": {torch.float32: {"output": True}}}, "tolerances", "tolerances[torch.float32]['output'] = True must be a number"),
        ({"dtypes": (torch.float32, torch.float8_e4m3fn)}, "dtypes", "torch.float8_e4m3fn is not supported; use float64, float32, float16 or bfloat16"),
        ({"dtypes": (torch.complex64,)}, "dtypes", "torch.complex64 is not a floating-point torch.dtype"),
        ({"inputs": [Tensor("x", "n"), Scalar("y", st.nothing())]}, "inputs[1].value", "Scalar 'y': the strategy nothing() can never draw a value"),
        ({"inputs": [Tensor("x", "n"), Scalar("y", st.sampled_from([]))]}, "inputs[1].value", "is invalid: InvalidArgument: Cannot sample from a length-zero"),
        (
            {"inputs": [Tensor("x", "n"), Scalar("y", st.integers(min_value=5, max_value=1))]},
            "inputs[1].value",
            "Scalar 'y': the strategy integers(min_value=5, max_value=1) is invalid: InvalidArgument: Cannot have max_value=1 < min_value=5",
        ),
    ],
)
def test_bad_spec_names_the_field(overrides: dict[str, Any], field: str, phrase: str) -> None:
    kwargs: dict[str, Any] = {"inputs": ok_inputs(), "reference": reference, "name": "bad_double"}
    kwargs.update(overrides)
    with pytest.raises(SpecError) as excinfo:
        register(Double, **kwargs)
    error = excinfo.value
    assert error.field_name == field
    assert phrase in str(error), str(error)
    assert str(error).startswith(f"conformance spec {kwargs['name']!r}, field {field!r}: ")


class Clip(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, clip: Any) -> torch.Tensor:
        return x.clamp(max=clip)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad_output, None


def test_kinks_name_a_numeric_scalar() -> None:
    """Kinks may name a Scalar input (its value in the call); a non-numeric constant is refused."""
    with pytest.raises(SpecError, match="field 'inputs\\[0\\].kinks': '-clip' refers to Scalar 'clip' = 'max', which is not a finite number"):
        register(Clip, name="clip_bad_kink", inputs=[Tensor("x", "n", kinks=("-clip",)), Scalar("clip", "max")], reference=lambda x, c: x)
    register(
        Clip, name="clip_good_kinks", reference=lambda x, c: x.clamp(max=c),
        inputs=[Tensor("x", "n", kinks=[0.0, "clip", "-clip"]), Scalar("clip", st.floats(0.5, 2.0))],  # type: ignore[arg-type]
    )
    from conformance.spec import registered

    spec = next(s for s in registered() if s.name == "clip_good_kinks")
    assert spec.inputs[0].kinks == (0.0, "clip", "-clip")  # a list is kept as a tuple (hashable, frozen)


def test_not_a_function_class() -> None:
    with pytest.raises(SpecError, match="field 'fn'.*neither a torch.autograd.Function subclass nor a torch.library.custom_op"):
        register(lambda x: x, inputs=[Tensor("x", "n")], reference=lambda x: x, name="lam")


def test_a_custom_op_needs_its_autograd_registered(clean_registry) -> None:  # type: ignore[no-untyped-def]
    @torch.library.custom_op("conformance_spec_errors::no_autograd", mutates_args=())
    def no_autograd(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    with pytest.raises(SpecError, match="field 'fn'.*has no autograd formula: call no_autograd.register_autograd"):
        register(no_autograd, inputs=[Tensor("x", "n")], reference=lambda x: 2 * x, name="no_autograd")
    no_autograd.register_autograd(lambda ctx, grad: grad * 2)
    with pytest.raises(SpecError, match="field 'inputs'.*conformance_spec_errors::no_autograd takes 1 arguments, but the spec lists 2"):
        register(no_autograd, inputs=[Tensor("x", "n"), Tensor("y", "n")], reference=lambda x, y: 2 * x, name="no_autograd")
    spec_fn = register(no_autograd, inputs=[Tensor("x", "n")], reference=lambda x: 2 * x, name="no_autograd")
    assert spec_fn is no_autograd
    from conformance.spec import registered_spec

    assert registered_spec("no_autograd").display_name == "conformance_spec_errors::no_autograd"


def test_duplicate_name_from_another_function() -> None:
    class Other(Double):
        pass

    register(Double, inputs=ok_inputs(), reference=reference, name="dup_name_probe")
    with pytest.raises(SpecError, match="field 'name': registered twice: for Double at .*test_spec_errors.py:\\d+ and for .*Other at .*test_spec_errors.py:\\d+"):
        register(Other, inputs=ok_inputs(), reference=reference, name="dup_name_probe")


def test_two_specs_for_one_function_under_one_name_is_an_error() -> None:
    register(Double, inputs=ok_inputs(), reference=reference, name="dup_same_fn")
    with pytest.raises(SpecError, match="registered twice: for Double at .*:\\d+ and for Double at .*:\\d+"):
        register(Double, inputs=ok_inputs(), reference=reference, name="dup_same_fn", dtypes=(torch.float32,))


def test_good_spec_is_accepted_with_every_input_kind() -> None:
    class Mixed(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, mask: torch.Tensor, target: torch.Tensor, eps: float) -> torch.Tensor:
            return x

        @staticmethod
        def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
            return grad_output, None, None, None

    register(
        Mixed,
        name="mixed_kinds_probe",
        inputs=[
            Tensor("x", "*batch n c", domain=(0.0, 1.0)),
            Mask("mask", "*batch n c"),
            Index("target", "*batch n", high="c"),
            Scalar("eps", st.floats(1e-6, 1e-3)),
        ],
        reference=lambda x, mask, target, eps: x,
    )


def test_parse_shape() -> None:
    parsed = parse_shape("*batch n 3 d")
    assert parsed.batch == "batch"
    assert parsed.dims == ("n", 3, "d")
    assert parse_shape("").dims == ()


BAD_SPEC_FILE = textwrap.dedent(
    """
    import torch
    from conformance import Tensor, register

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return 2 * x + y

        @staticmethod
        def backward(ctx, g):
            return 2 * g, g

    register(Twice, name="twice", inputs=[Tensor("x", "n")], reference=lambda x: 2 * x)
    """
)


def test_bad_spec_stops_collection_with_one_clear_error(pytester: pytest.Pytester) -> None:
    path = pytester.makepyfile(bad_spec_for_collection=BAD_SPEC_FILE)
    result = pytester.runpytest_subprocess(str(CONFORMANCE_DIR), f"--impl={path}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert errors == [
        "ERROR: conformance spec 'twice', field 'inputs': Twice.forward takes 2 arguments after ctx, "
        "but the spec lists 1: ['x']"
    ], result.errlines
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


@pytest.mark.parametrize(
    ("impl", "phrase"),
    [
        ("no_such_module_xyz", "--impl=no_such_module_xyz: cannot import it (ModuleNotFoundError"),
        ("missing/file.py", "--impl=missing/file.py: no such file"),
        ("json", "--impl=json: importing it registered no Functions"),
    ],
)
def test_bad_impl_is_a_usage_error(pytester: pytest.Pytester, impl: str, phrase: str) -> None:
    result = pytester.runpytest_inprocess(str(CONFORMANCE_DIR), f"--impl={impl}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert phrase in result.stderr.str()


@pytest.mark.parametrize(
    ("option", "phrase"),
    [
        ("--device=tpu", "--device='tpu' is not one of auto, cpu, cuda"),
        ("--profile=fast", "--profile='fast' is not one of dev, ci, thorough"),
        ("--max-examples=many", "--max-examples='many' is not an integer"),
        ("--dtypes=float8", "--dtypes: unknown ['float8']"),
        ("--contracts=gradchek", "--contracts: unknown contracts ['gradchek']"),
    ],
)
def test_bad_option_is_a_usage_error_that_says_how_to_fix_it(pytester: pytest.Pytester, option: str, phrase: str) -> None:
    result = pytester.runpytest_inprocess(str(CONFORMANCE_DIR), option, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert phrase in result.stderr.str()


@pytest.mark.parametrize(
    ("option", "phrase"),
    [
        ("--impl=", "--impl is empty (--impl=''; an unset variable?); pass e.g. --impl=mypkg or --impl=path/to/specs.py, "
                    "or leave --impl out for the default (the bundled reference_ops)"),
        ("--dtypes=", "--dtypes is empty (--dtypes=''; an unset variable?); pass e.g. --dtypes=float32,bfloat16"),
        ("--dtypes=,", "--dtypes is empty (--dtypes=',';"),
        ("--contracts=", "--contracts is empty (--contracts=''; an unset variable?)"),
        ("--device=", "--device is empty (--device=''; an unset variable?); pass e.g. --device=cpu"),
        ("--conformance-report=", "--conformance-report is empty"),
    ],
)
def test_empty_option_value_is_a_usage_error_not_the_default(pytester: pytest.Pytester, option: str, phrase: str) -> None:
    """`--impl=$IMPL` with IMPL unset must not quietly test the default (or every dtype, contract)."""
    result = pytester.runpytest_inprocess(str(CONFORMANCE_DIR), option, "--collect-only", "-q", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.outlines[-3:]
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1 and phrase in errors[0], result.errlines


def test_unwritable_report_path_is_a_usage_error_before_the_run(pytester: pytest.Pytester) -> None:
    """Found up front, not in a traceback after the whole run; a missing folder is created."""
    blocker = pytester.makefile(".txt", blocker="a file, not a folder")
    bad = blocker / "reports" / "conformance"
    result = pytester.runpytest_inprocess(
        str(CONFORMANCE_DIR), f"--conformance-report={bad}", "--collect-only", "-q", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1, result.errlines
    assert errors[0].startswith(f"ERROR: --conformance-report={bad}: cannot write into {str(bad.parent)!r} (NotADirectoryError: ")
    assert "pass a path in a writable folder" in errors[0]

    occupied = pytester.path / "taken"
    Path(f"{occupied}.json").mkdir()
    result = pytester.runpytest_inprocess(
        str(CONFORMANCE_DIR), f"--conformance-report={occupied}", "--collect-only", "-q", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"{str(occupied) + '.json'!r} is a directory" in result.stderr.str()

    result = pytester.runpytest_inprocess(
        str(CONFORMANCE_DIR), "--conformance-report=new/nested/report", "--collect-only", "-q", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.OK
    assert (pytester.path / "new" / "nested").is_dir()
    assert list((pytester.path / "new" / "nested").iterdir()) == []  # the write probe is gone
