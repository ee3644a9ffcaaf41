"""--shard=K/N and the merge of the slices' reports: slices split by Function, merged they are the
unsharded run; the merge refuses reports that are not every slice of one run."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conformance.plugin.collection import ContractTest, contract_test_key, function_by_function, shard_of_rows
from conformance.plugin.merge import MergeError, main, merge_reports
from conformance.plugin.options import parse_shard
from conformance.plugin.outcomes import SCHEMA_VERSION
from tests.conftest import ZOO

CONTRACTS = ("grad_meta", "return_count", "needs_input_grad")


@pytest.mark.parametrize(("text", "expected"), [("1/1", (1, 1)), ("2/3", (2, 3)), (" 3/3", (3, 3))])
def test_parse_shard(text: str, expected: tuple[int, int]) -> None:
    assert parse_shard(text) == expected


@pytest.mark.parametrize(("text", "says"), [("0/3", "between 1 and N"), ("4/3", "between 1 and N"), ("1/0", "between"),
                                            ("2", "is not K/N"), ("a/b", "is not K/N"), ("-1/3", "is not K/N")])
def test_parse_shard_rejects(text: str, says: str) -> None:
    with pytest.raises(pytest.UsageError, match=says) as raised:
        parse_shard(text)
    assert repr(text) in str(raised.value)


def test_rows_go_to_the_lightest_slice_largest_first_device_by_device() -> None:
    rows = {("a", "cpu"): 23, ("b", "cpu"): 23, ("c", "cpu"): 10, ("d", "cpu"): 10, ("e", "cpu"): 5, ("a", "cuda"): 23}
    slices = shard_of_rows(rows, 3)
    assert slices == {("a", "cpu"): 1, ("b", "cpu"): 2, ("c", "cpu"): 3, ("d", "cpu"): 3, ("e", "cpu"): 3, ("a", "cuda"): 1}
    assert shard_of_rows(dict(reversed(list(rows.items()))), 3) == slices  # the order rows arrive in does not matter
    cpu_slices = {slices_ for row, slices_ in shard_of_rows(rows, 10).items() if row[1] == "cpu"}
    assert cpu_slices == set(range(1, 6))  # one CPU row per slice, five slices without one


def test_a_cpu_only_runner_gets_cpu_rows_in_every_slice() -> None:
    # A new user's trial: --device=auto on a runner without CUDA, 2 slices: one ran every CPU test,
    # the other only CUDA rows, all "not run here".
    rows = {(name, device): 23 for name in "abcd" for device in ("cpu", "cuda")}
    slices = shard_of_rows(rows, 2)
    assert sorted(slices[(name, "cpu")] for name in "abcd") == [1, 1, 2, 2]


def _report(shard: str, results: list[dict[str, Any]], **run: Any) -> dict[str, Any]:
    base = {"seed": 0, "profile": "ci", "max_examples": None, "impl": "mypkg", "devices": ["cpu"], "dtypes": None,
            "device_description": "cpu only", "triton": "interpreted", "versions": {"torch": "2.13.0"},
            "command": f"pytest conformance --shard={shard}", "header": [], "shard": shard}
    return {"schema_version": SCHEMA_VERSION, "run": {**base, **run}, "results": results}


def _result(function: str, contract: str, outcome: str = "passed", **extra: Any) -> dict[str, Any]:
    return {"id": f"{contract}[{function}-cpu]", "function": function, "device": "cpu", "contract": contract,
            "outcome": outcome, "reason": "", "duration": 0.1, "repro": "", "rerun": "", **extra}


def test_merge_of_fake_slices() -> None:
    reports = [
        _report("1/2", [_result("f", "grad_meta", "failed", message="boom"),
                        _result("f", "gradcheck", "blocked", reason="blocked by grad_meta", owner="grad_meta")]),
        _report("2/2", [_result("g", "grad_meta")]),
    ]
    matrix, run = merge_reports(reports, ["one.json", "two.json"])
    assert matrix.totals()["failed"] == 1 and matrix.totals()["passed"] == 1 and matrix.totals()["blocked"] == 1
    blocked = matrix.cell("f", "cpu", "gradcheck")
    assert blocked is not None and blocked.owner == "grad_meta"
    failed = matrix.cell("f", "cpu", "grad_meta")
    assert failed is not None and failed.message == "boom"
    assert run.command == "pytest conformance (merged from 2 slices)" and run.shard == ""


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda r: r[1]["run"].update(seed=1), "two.json: seed=1, but should be 0 as in one.json"),
        (lambda r: r[1]["run"].update(shard="1/2"), "two.json: shard 1/2 is also one.json"),
        (lambda r: r[1]["run"].update(shard="2/3"), "should be one of 2 slices"),
        (lambda r: r[1]["run"].update(shard=""), "a report of a --shard=K/N run"),
        (lambda r: r.pop(), "slices 2/2 are missing"),
        (lambda r: r[1]["results"].append(_result("f", "grad_meta")), "grad_meta\\[f-cpu\\] is also in one.json"),
        (lambda r: r[0].update(schema_version=1), "schema_version=1, but should be 3"),
    ],
)
def test_merge_refuses_what_is_not_one_sharded_run(change: Any, says: str) -> None:
    reports = [_report("1/2", [_result("f", "grad_meta")]), _report("2/2", [_result("g", "grad_meta")])]
    reports = copy.deepcopy(reports)
    change(reports)
    with pytest.raises(MergeError, match=says):
        merge_reports(reports, ["one.json", "two.json"][: len(reports)])


def test_merge_command_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = []
    for index, outcome in ((1, "failed"), (2, "passed")):
        path = tmp_path / f"s{index}.json"
        path.write_text(json.dumps(_report(f"{index}/2", [_result(f"f{index}", "grad_meta", outcome, message="m")])))
        paths.append(str(path))
    assert main([str(tmp_path / "merged"), *paths]) == 1
    assert "FAIL grad_meta[f1-cpu]" in capsys.readouterr().out
    assert {p.name for p in tmp_path.glob("merged.*")} == {"merged.json", "merged.md", "merged.html"}
    assert main([str(tmp_path / "again"), paths[0]]) == 2
    assert "slices 2/2 are missing" in capsys.readouterr().err


def test_three_slices_merged_are_the_unsharded_run(conformance_run, pytester: pytest.Pytester) -> None:  # type: ignore[no-untyped-def]
    """A zoo file of six Functions, some buggy: each slice holds whole rows, and the merge of the three
    equals the one run, outcome and reason alike."""
    whole = conformance_run(ZOO / "core_bugs.py", "--conformance-report=whole", contracts=CONTRACTS, max_examples=3)
    slices = [
        conformance_run(ZOO / "core_bugs.py", f"--shard={k}/3", f"--conformance-report=slice{k}", contracts=CONTRACTS,
                        max_examples=3)
        for k in (1, 2, 3)
    ]
    rows = [{(name, device) for _, name, device in run.verdicts} for run in slices]
    assert all(rows) and sum(map(len, rows)) == len(set().union(*rows)) == len(whole.names())
    for run in slices:
        for key, verdict in run.verdicts.items():
            assert verdict.outcome == whole.verdicts[key].outcome, key
    merged = main([str(pytester.path / "merged"), *(str(pytester.path / f"slice{k}.json") for k in (1, 2, 3))])
    expected = json.loads((pytester.path / "whole.json").read_text())
    got = json.loads((pytester.path / "merged.json").read_text())
    assert merged == (1 if expected["totals"]["failed"] else 0) == 1
    assert got["matrix"] == expected["matrix"] and got["totals"] == expected["totals"]
    drop = ("duration", "rerun", "repro", "message")
    assert [{k: v for k, v in r.items() if k not in drop} for r in got["results"]] == [
        {k: v for k, v in r.items() if k not in drop} for r in expected["results"]
    ]


def test_contract_tests_run_function_by_function_and_other_items_keep_their_place() -> None:
    """The order the evaluation pool relies on: each Function's (and device's) contracts in a row,
    in their collected order; an item that is not a contract test stays where it was."""
    def item(contract: str | None, function: str = "", device: str = "cpu") -> Any:
        node = SimpleNamespace(stash=pytest.Stash(), name=f"{contract}[{function}-{device}]" if contract else "plain")
        if contract is not None:
            node.stash[contract_test_key] = ContractTest(
                SimpleNamespace(name=contract), SimpleNamespace(name=function), device  # type: ignore[arg-type]
            )
        return node

    items = [item("grad_meta", "a"), item("grad_meta", "b"), item(None), item("grad_meta", "a", "cuda"),
             item("reference", "b"), item("reference", "a"), item("reference", "a", "cuda")]
    function_by_function(items)
    assert [i.name for i in items] == [
        "grad_meta[a-cpu]", "reference[a-cpu]", "plain", "grad_meta[b-cpu]", "reference[b-cpu]",
        "grad_meta[a-cuda]", "reference[a-cuda]",
    ]
    # Slow rows (interpreted Triton) first, in their collected order; the others after them.
    function_by_function(items, slow=lambda spec, device: device == "cuda" or spec.name == "b")
    assert [i.name for i in items] == [
        "grad_meta[b-cpu]", "reference[b-cpu]", "plain", "grad_meta[a-cuda]", "reference[a-cuda]",
        "grad_meta[a-cpu]", "reference[a-cpu]",
    ]
