"""Unit tests of the typed verdict and the options, without a pytest run.

Like pytest-xdist's own MockNode tests, reports are built by hand and sent through the same
serialisation a worker's reports go through on their way to the controller; options are read
from a stand-in config.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

import autograd_conformance_plugin as entry
from conformance.engine.verdict import SKIP_OUTCOMES, VERDICT_PROPERTY, Outcome, Verdict
from conformance.plugin.collection import TEST_PROPERTY
from conformance.plugin.options import RunOptions, check_contract_names, parse_options
from conformance.plugin.outcomes import OUTCOMES, Cell
from conformance.plugin.session import cell_of

# ------------------------------------------------------------------------ verdicts


def _full(outcome: Outcome) -> Verdict:
    """A verdict with every field set (an owner only where one belongs)."""
    return Verdict(
        outcome,
        "len(backward return)=2, but should be 1 [ExtraGrad.backward] \u2014 \"quoted\"",
        owner="return_count" if outcome is Outcome.BLOCKED else "",
        case="torch.float64 on cpu; x: tensor(1,), requires_grad",
        repro="/tmp/r.repro/grad_meta-extra_grad-cpu.py",
        rerun="python -m pytest 'conformance/test_grad_meta.py::test_grad_meta[extra_grad-cpu]' --seed=0",
        message="[grad_meta] line one\n  line two",
        unmet_expectations=("[function=f, dtype=float16]",),
    )


def test_the_outcome_vocabulary_is_the_reports() -> None:
    assert OUTCOMES == tuple(outcome.value for outcome in Outcome)
    assert OUTCOMES == (
        "passed", "advice", "upstream", "failed", "error", "xfailed", "xpassed", "blocked", "waived", "not_applicable",
        "not_run_here", "skipped",
    )


@pytest.mark.parametrize("outcome", list(Outcome), ids=lambda o: o.value)
def test_verdict_round_trip(outcome: Outcome) -> None:
    for verdict in (Verdict(outcome, owner="grad_meta" if outcome is Outcome.BLOCKED else ""), _full(outcome)):
        text = verdict.to_json()
        assert isinstance(text, str) and json.loads(text)["outcome"] == outcome.value
        assert Verdict.from_json(text) == verdict


def test_a_bare_verdict_serialises_only_what_it_says() -> None:
    assert Verdict(Outcome.PASSED).to_json() == '{"outcome": "passed"}'


def test_of_finds_the_last_verdict_among_the_properties() -> None:
    first, last = Verdict(Outcome.FAILED, "first"), Verdict(Outcome.XFAILED, "last")
    properties = [(TEST_PROPERTY, ("c", "f", "cpu")), first.as_property(), ("other", 1), last.as_property()]
    assert Verdict.of(properties) == last
    assert Verdict.of([(TEST_PROPERTY, ("c", "f", "cpu"))]) is None
    with pytest.raises(ValueError, match="must be a JSON string"):
        Verdict.of([(VERDICT_PROPERTY, {"outcome": "passed"})])


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{not json", "not a serialised Verdict"),
        ('["passed"]', "a JSON list"),
        ('{"outcome": "green"}', "outcome 'green'"),
        ('{"outcome": "passed", "colour": "green"}', "unknown keys ['colour']"),
        ('{"outcome": "passed", "reason": 3}', "Verdict.reason must be a str"),
        ('{"outcome": "passed", "unmet_expectations": "x"}', "unmet_expectations 'x'"),
        ('{"outcome": "blocked", "reason": "r"}', "a blocked verdict names its owner"),
    ],
)
def test_from_json_refuses_anything_else(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        Verdict.from_json(text)


def test_only_a_blocked_verdict_has_an_owner() -> None:
    with pytest.raises(ValueError, match="names its owner"):
        Verdict(Outcome.FAILED, "r", owner="grad_meta")
    with pytest.raises(TypeError, match="must be an Outcome"):
        Verdict("passed")  # type: ignore[arg-type]


def test_describe_is_the_line_a_reader_sees() -> None:
    blocked = Verdict(Outcome.BLOCKED, "grad dtype wrong", owner="grad_meta", case="c1", rerun="python -m pytest x")
    assert blocked.describe() == "blocked by grad_meta: grad dtype wrong; see grad_meta; case: c1; rerun: python -m pytest x"
    assert replace(blocked, case="", rerun="").describe() == "blocked by grad_meta: grad dtype wrong; see grad_meta"
    assert Verdict(Outcome.NOT_APPLICABLE, "single output").describe() == "single output"
    assert {o for o in Outcome if Verdict(o, owner="x" if o is Outcome.BLOCKED else "").skipped} == SKIP_OUTCOMES


# ------------------------------------------------------------------------ reports crossing xdist


def _report(when: str, outcome: str, verdict: Verdict | None, *, longrepr: Any = None, **extra: Any) -> pytest.TestReport:
    properties: list[tuple[str, object]] = [(TEST_PROPERTY, ("grad_meta", "extra_grad", "cpu"))]
    if verdict is not None:
        properties.append(verdict.as_property())
    report = pytest.TestReport(
        nodeid="conformance/test_grad_meta.py::test_grad_meta[extra_grad-cpu]",
        location=("conformance/test_grad_meta.py", 10, "test_grad_meta[extra_grad-cpu]"),
        keywords={}, outcome=outcome, longrepr=longrepr, when=when, user_properties=properties, duration=1.5,  # type: ignore[arg-type]
    )
    for name, value in extra.items():
        setattr(report, name, value)
    return report


def _through_xdist(report: pytest.TestReport) -> pytest.TestReport:
    """What the controller gets: the report serialised as a worker sends it (JSON-safe data)."""
    data = json.loads(json.dumps(report._to_json()))
    return pytest.TestReport._from_json(data)


def _cell(report: pytest.TestReport) -> Cell:
    recorded = cell_of(_through_xdist(report))
    assert recorded is not None
    key, cell, _ = recorded
    assert key == ("grad_meta", "extra_grad", "cpu")
    return cell


def test_a_blocked_skip_arrives_as_its_verdict_not_its_prose() -> None:
    verdict = Verdict(Outcome.BLOCKED, "len(backward return)=2", owner="return_count", case="c", rerun="rerun me")
    # The skip message says something else entirely: the cell must come from the verdict.
    skip = ("conformance/test_grad_meta.py", 10, "Skipped: blocked by someone_else: whatever")
    cell = _cell(_report("call", "skipped", verdict, longrepr=skip))
    assert cell == Cell(
        "blocked", verdict.describe(), duration=1.5, rerun="rerun me", owner="return_count"
    )
    assert cell.short_label == "blocked by return_count"


@pytest.mark.parametrize("outcome", sorted(SKIP_OUTCOMES - {Outcome.BLOCKED}, key=lambda o: o.value), ids=lambda o: o.value)
def test_every_skip_outcome_arrives(outcome: Outcome) -> None:
    skip = ("f.py", 1, "Skipped: prose")
    cell = _cell(_report("setup", "skipped", Verdict(outcome, "why", rerun="r"), longrepr=skip))
    assert (cell.outcome, cell.reason, cell.rerun, cell.duration) == (outcome.value, "why", "r", 0.0)


def test_a_skip_without_a_verdict_is_pytests() -> None:
    cell = _cell(_report("setup", "skipped", None, longrepr=("f.py", 1, "Skipped: a marker")))
    assert (cell.outcome, cell.reason, cell.rerun) == ("skipped", "a marker", "")


def test_a_failure_arrives_with_its_summary_report_and_repro() -> None:
    verdict = _full(Outcome.FAILED)
    cell = _cell(_report("call", "failed", verdict, longrepr="Traceback ...\nAssertionError: the last line"))
    assert (cell.outcome, cell.reason, cell.message, cell.repro, cell.rerun) == (
        "failed", verdict.reason, verdict.message, verdict.repro, verdict.rerun,
    )


def test_a_failure_the_runner_did_not_judge_keeps_pytests_words() -> None:
    cell = _cell(_report("call", "failed", Verdict(Outcome.FAILED, rerun="r"), longrepr="Traceback\nE   boom"))
    assert (cell.outcome, cell.reason, cell.message, cell.rerun) == ("failed", "E   boom", "Traceback\nE   boom", "r")
    teardown = _cell(_report("teardown", "failed", Verdict(Outcome.PASSED, rerun="r"), longrepr="Traceback\nE   late"))
    assert (teardown.outcome, teardown.reason, teardown.message) == ("error", "E   late", "Traceback\nE   late")


def test_expected_deviations() -> None:
    xfail = Verdict(Outcome.XFAILED, "expected deviation [f]: why; failed with: s", repro="p.py", message="m")
    cell = _cell(_report("call", "skipped", xfail, longrepr=("f.py", 1, "XFAIL"), wasxfail="expected deviation [f]: why"))
    assert (cell.outcome, cell.reason, cell.repro, cell.message) == ("xfailed", "expected deviation [f]: why", "p.py", "")
    cell = _cell(_report("call", "passed", Verdict(Outcome.PASSED), wasxfail="expected deviation [f]: why"))
    assert (cell.outcome, cell.reason) == ("xpassed", "expected deviation [f]: why")


def test_a_passed_setup_makes_no_cell_and_other_tests_none() -> None:
    assert cell_of(_through_xdist(_report("setup", "passed", None))) is None
    other = _report("call", "passed", None)
    other.user_properties = []
    assert cell_of(other) is None


# ------------------------------------------------------------------------ options


class FakeConfig:
    """What :func:`autograd_conformance_plugin.read_values` reads: command-line values by dest
    (None when not given), ini values by key (None when absent)."""

    def __init__(self, cli: dict[str, Any] | None = None, ini: dict[str, Any] | None = None,
                 others: dict[str, Any] | None = None) -> None:
        self.cli = {f"conformance_{k}": v for k, v in (cli or {}).items()} | (others or {})  # others: other plugins' dests
        self.ini = {f"conformance_{k}": v for k, v in (ini or {}).items()}

    def getoption(self, name: str, default: Any = None) -> Any:
        return self.cli.get(name, default)

    def getini(self, name: str) -> Any:
        return self.ini.get(name)


def test_the_table_knows_every_option_once() -> None:
    names = [option.name for option in entry.OPTIONS]
    assert len(names) == len(set(names)) == 20
    assert {option.ini for option in entry.OPTIONS} == {f"conformance_{name}" for name in names}
    assert next(o for o in entry.OPTIONS if o.flag == "--conformance-report").ini == "conformance_report"


def test_the_tables_defaults_are_the_engines() -> None:
    # The entry point may not import the engine (it must not import torch), so the engine keeps
    # its own copy of three defaults; they must stay the table's.
    from conformance.engine.global_state import SUITE_THREADS
    from conformance.engine.runner import RunOptions as EngineOptions
    from conformance.engine.watchdog import DEFAULT_EXAMPLE_TIMEOUT

    table = {option.name: option.default for option in entry.OPTIONS}
    assert table["threads"] == SUITE_THREADS == EngineOptions().threads
    assert table["example_timeout"] == DEFAULT_EXAMPLE_TIMEOUT == EngineOptions().example_timeout
    assert tuple(table["compile_backends"]) == EngineOptions().compile_backends  # type: ignore[arg-type]


def test_defaults() -> None:
    values = entry.read_values(FakeConfig())
    assert values == {
        "impl": "reference_ops", "device": "auto", "gpus_per_worker": 1, "max_examples": None, "profile": "dev",
        "seed": 0, "dtypes": (), "contracts": (), "skip_contracts": (), "expectations": None,
        "strict_expectations": False, "example_timeout": 300.0, "threads": 1, "compile_backends": ("aot_eager",),
        "isolate": False, "report": None, "shard": None, "advice": "report", "upstream": "report",
        "author_coverage": False,
    }


def test_good_values_are_typed() -> None:
    values = entry.read_values(FakeConfig(cli={
        "seed": "7", "max_examples": "20", "example_timeout": "2.5", "dtypes": "float32, bfloat16,float32",
        "device": "cpu", "profile": "ci", "contracts": "gradcheck,grad_meta", "isolate": True,
    }))
    assert values["seed"] == 7 and values["max_examples"] == 20 and values["example_timeout"] == 2.5
    assert values["dtypes"] == ("float32", "bfloat16")  # stripped, each once
    assert values["contracts"] == ("gradcheck", "grad_meta")
    assert (values["device"], values["profile"], values["isolate"]) == ("cpu", "ci", True)


def test_the_command_line_wins_over_the_ini_file_which_wins_over_the_default() -> None:
    both = entry.read_values(FakeConfig(cli={"seed": "3", "profile": "thorough"}, ini={"seed": "5", "profile": "ci"}))
    assert (both["seed"], both["profile"]) == (3, "thorough")
    ini_only = entry.read_values(FakeConfig(ini={"seed": "5", "profile": "ci", "dtypes": "float64"}))
    assert (ini_only["seed"], ini_only["profile"], ini_only["dtypes"]) == (5, "ci", ("float64",))
    empty_ini = entry.read_values(FakeConfig(ini={"seed": "", "impl": "  "}))
    assert (empty_ini["seed"], empty_ini["impl"]) == (0, "reference_ops")


@pytest.mark.parametrize(
    ("ini", "expected"), [("true", True), ("Yes", True), ("1", True), ("false", False), ("", False), (None, False)]
)
def test_flags_from_the_ini_file(ini: str | None, expected: bool) -> None:
    assert entry.read_values(FakeConfig(ini={"strict_expectations": ini}))["strict_expectations"] is expected
    assert entry.read_values(FakeConfig(cli={"strict_expectations": True}, ini={"strict_expectations": ini}))[
        "strict_expectations"
    ] is True


@pytest.mark.parametrize(
    ("cli", "ini", "message"),
    [
        ({"seed": "x"}, {}, "--seed='x' is not an integer; pass e.g. --seed=0"),
        ({}, {"max_examples": "many"}, "--max-examples='many' is not an integer"),
        ({"example_timeout": "soon"}, {}, "--example-timeout='soon' is not a number; pass e.g. --example-timeout=60"),
        ({"device": "tpu"}, {}, "--device='tpu' is not one of auto, cpu, cuda; pass e.g. --device=cpu"),
        ({}, {"profile": "fast"}, "--profile='fast' is not one of dev, ci, thorough; pass e.g. --profile=ci"),
        ({"dtypes": "float32,float8"}, {}, "--dtypes: unknown ['float8']; choose from float64, float32, float16, bfloat16"),
        ({"compile_backends": "tvm"}, {}, "--compile-backends: unknown ['tvm']; choose from aot_eager, inductor, eager"),
        ({"impl": ""}, {"impl": "mypkg"}, "--impl is empty (--impl=''; an unset variable?); pass e.g. --impl=mypkg or "
                                          "--impl=path/to/specs.py, or leave --impl out for the default (the bundled reference_ops)"),
        ({"dtypes": ","}, {}, "--dtypes is empty (--dtypes=',';"),
    ],
)
def test_bad_values_are_usage_errors_that_echo_them(cli: dict[str, Any], ini: dict[str, Any], message: str) -> None:
    with pytest.raises(pytest.UsageError) as raised:
        entry.read_values(FakeConfig(cli=cli, ini=ini))
    assert message in str(raised.value)


def test_hypothesis_seed_is_the_runs_seed_or_a_usage_error() -> None:
    """Hypothesis's own --hypothesis-seed never reached the suite's properties: a run given only
    it used seed 0 without a word (two new users' trials)."""
    assert entry.read_values(FakeConfig(others={"hypothesis_seed": "12345"}))["seed"] == 12345
    assert entry.read_values(FakeConfig(cli={"seed": "7"}, others={"hypothesis_seed": "7"}))["seed"] == 7
    assert entry.read_values(FakeConfig(ini={"seed": "5"}, others={"hypothesis_seed": "3"}))["seed"] == 3
    with pytest.raises(pytest.UsageError, match=r"--hypothesis-seed='3' and --seed='7': .* give one of them"):
        entry.read_values(FakeConfig(cli={"seed": "7"}, others={"hypothesis_seed": "3"}))
    with pytest.raises(pytest.UsageError, match=r"--hypothesis-seed='abc': .* from an integer; pass e.g. --seed=0"):
        entry.read_values(FakeConfig(others={"hypothesis_seed": "abc"}))


def _parse(tmp_path: Path, **cli: Any) -> RunOptions:
    return parse_options(entry.read_values(FakeConfig(cli=cli)), run_dir=tmp_path)


def test_parse_options_builds_the_typed_options(tmp_path: Path) -> None:
    options = _parse(tmp_path, profile="ci", device="cpu", dtypes="float32,float64", example_timeout="0",
                     report="out/conformance", threads="2", seed="9")
    assert options.devices == ("cpu",) and options.example_timeout is None and options.seed == 9
    assert options.report == tmp_path / "out" / "conformance" and (tmp_path / "out").is_dir()
    assert options.repro_dir() == tmp_path / "out" / "conformance.repro"
    assert not options.default_threads
    engine = options.engine()
    assert engine.dtypes == (torch.float32, torch.float64) and engine.threads == 2 and engine.seed == 9
    settings = engine.hypothesis_settings()
    assert settings.max_examples == 10 and settings.derandomize
    assert _parse(tmp_path).devices == ("cpu", "cuda")  # auto
    assert _parse(tmp_path, max_examples="3").engine().hypothesis_settings().max_examples == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.seed = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("cli", "message"),
    [
        ({"max_examples": "0"}, "--max-examples=0 must be >= 1"),
        ({"threads": "0"}, "--threads=0 must be >= 1"),
        ({"gpus_per_worker": "0"}, "--gpus-per-worker=0 must be >= 1"),
        ({"example_timeout": "-1"}, "--example-timeout=-1.0 is not a number of seconds >= 0"),
        ({"example_timeout": "inf"}, "--example-timeout=inf is not a number of seconds >= 0"),
    ],
)
def test_parse_options_refuses_values_out_of_range(tmp_path: Path, cli: dict[str, Any], message: str) -> None:
    with pytest.raises(pytest.UsageError, match="^" + message.replace("+", r"\+").replace(".", r"\.")):
        _parse(tmp_path, **cli)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is usable here")
def test_device_cuda_without_cuda(tmp_path: Path) -> None:
    with pytest.raises(pytest.UsageError, match=r"--device=cuda, but CUDA is not usable here: torch .*device_count\(\)=0"):
        _parse(tmp_path, device="cuda")


def test_report_path_problems_are_found_before_the_run(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(pytest.UsageError, match=r"^--conformance-report=file/r: cannot write into '.*/file' \(FileExistsError"):
        _parse(tmp_path, report="file/r")
    (tmp_path / "taken.json").mkdir()
    with pytest.raises(pytest.UsageError, match=r"taken\.json' is a directory"):
        _parse(tmp_path, report="taken")


def test_contract_names_are_checked_against_the_suite(tmp_path: Path) -> None:
    check_contract_names(_parse(tmp_path, contracts="gradcheck"), ["grad_meta", "gradcheck"])
    with pytest.raises(pytest.UsageError, match=r"^--skip-contracts: unknown contracts \['gradchek'\]; choose from grad_meta, gradcheck"):
        check_contract_names(_parse(tmp_path, skip_contracts="gradchek"), ["gradcheck", "grad_meta"])


@pytest.mark.parametrize("given", ["run", "run.json", "run.md", "run.html"])
def test_a_report_path_with_a_report_suffix_names_the_same_three_files(tmp_path: Path, given: str) -> None:
    options = _parse(tmp_path, report=f"out/{given}")
    assert options.report is not None and options.report.name == "run"  # never run.json.json
    assert options.repro_dir() == options.report.with_name("run.repro")
