"""Repro scripts reproduce: every zoo bug's script fails with its contract's message and numbers,
and the same script passes when the Function is replaced by a correct twin.

The zoo runs are the ones the contract-family tests read (tests/zoo_runs.py; the same worker makes
each once). All scripts of one run are replayed in one subprocess (``runpy``, as
``python script.py`` would run them) to keep the test fast; a few are also run truly standalone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conformance.engine.replay import EXIT_FAILED, EXIT_NOT_CHECKED, EXIT_PASSED, load_spec
from conformance.engine.repro import _same_case, write_script
from conformance.engine.verdict import Outcome
from conformance.spec import Tensor
from strategies.cases import Case
from strategies.recipes import ScalarRecipe, TensorRecipe
from tests.conftest import REPO
from tests.strategies.helpers import make_spec

# The zoo runs whose failures are replayed (every one has failures).
REPLAYED_RUNS = (
    "core_bugs", "ctx_hygiene", "derivative_layout_determinism_bugs", "float32_output", "global_state_bugs", "grad_and_memory_bugs",
    "gradcheck_bugs", "memory_bugs", "numeric_bugs", "real_world_bugs", "spec_language_bugs", "transposed_grad_output_bugs",
    "triton_bugs", "vacuous",
)
# Only these contracts' failures are replayed for these runs (the others are covered elsewhere).
REPLAYED = {"global_state_bugs": ("global_state",), "vacuous": ("return_count",)}

# Zoo bugs that are nondeterministic on purpose (unseeded noise in backward).
NONDETERMINISTIC_BUGS = ("noisy_backward", "undeclared_noise")

# Replays every script given in a JSON list, in this process, as `python script.py` would: first
# as written, then with the spec's Function swapped for the correct twin built from its reference.
DRIVER = """
import contextlib, io, json, runpy, sys
sys.path.append(sys.argv[3])
jobs, out_path = json.load(open(sys.argv[1])), sys.argv[2]


def replay_all():
    results = []
    for script in jobs:
        captured = io.StringIO()
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            try:
                runpy.run_path(script, run_name="__main__")
                status = 0
            except SystemExit as done:
                status = done.code
        results.append([status, captured.getvalue()])
    return results


as_written = replay_all()
import conformance.engine.replay as replay
from tests.twins import with_twin
load = replay.load_spec
replay.load_spec = lambda impl, name: with_twin(load(impl, name))
json.dump({"as_written": as_written, "twin": replay_all()}, open(out_path, "w"))
"""


def _replay_all(scripts: list[str], run_dir: Path, tmp_path: Path) -> dict[str, list[tuple[int, str]]]:
    """Each script's (exit status, output), as written and on the twin (one process: torch imports once)."""
    jobs, out = tmp_path / "jobs.json", tmp_path / "results.json"
    jobs.write_text(json.dumps(scripts))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the scripts set their own path
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(jobs), str(out), str(REPO)],
        cwd=run_dir, env=env, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {mode: [(status, text) for status, text in results] for mode, results in json.loads(out.read_text()).items()}


@pytest.mark.parametrize(
    "run_name",
    REPLAYED_RUNS,
)
def test_zoo_repro_scripts_fail_with_the_contract_message_and_pass_on_the_twin(
    zoo_run, tmp_path: Path, run_name: str  # type: ignore[no-untyped-def]
) -> None:
    run = zoo_run(run_name)
    replayed = REPLAYED.get(run_name)
    # A blocked test that reports an unowned defect fails at the end of the run, without a script of its own.
    failures = {
        key: v for key, v in run.verdicts.items()
        if v.outcome == "failed" and v.recorded.outcome is not Outcome.BLOCKED and (replayed is None or key[0] in replayed)
    }
    assert failures, f"{run_name}: no failures to reproduce"
    missing = [key for key, v in failures.items() if not v.recorded.repro]
    assert not missing, f"failures without a repro script: {missing}"
    keys = sorted(failures)
    scripts = [failures[k].recorded.repro for k in keys]

    replays = _replay_all(scripts, run.run_dir, tmp_path)
    for key, (status, text) in zip(keys, replays["as_written"]):
        contract, name, _ = key
        verdict = failures[key]
        assert status == EXIT_FAILED, f"{key}: the repro script exited {status}, but should fail:\n{text}"
        head = text.strip().splitlines()[0]
        assert head.startswith(f"[{contract}] ") and verdict.recorded.reason in head, (
            f"{key}: the script says {head!r}, but should report {verdict.recorded.reason!r}"
        )
        if name in NONDETERMINISTIC_BUGS:
            continue  # their numbers differ from run to run, by definition: the head line is the check
        # Same numbers: every line the script prints is a line of the test's own report.
        for line in text.strip().splitlines():
            assert line.strip() in verdict.text, f"{key}: {line.strip()!r} is not in the test's report:\n{verdict.text}"

    for key, (status, text) in zip(keys, replays["twin"]):
        assert status == EXIT_PASSED, f"{key}: the repro script exited {status} on the correct twin:\n{text}"
        assert "passed:" in text


def test_a_repro_script_runs_standalone_from_where_pytest_ran(zoo_run) -> None:  # type: ignore[no-untyped-def]
    """``python script.py`` with nothing on PYTHONPATH, from the directory pytest ran in."""
    run = zoo_run("core_bugs")
    verdict = run.verdict("grad_meta", "wrong_dtype_grad")
    script = Path(verdict.recorded.repro)
    assert f"repro script: python {script}" in verdict.text
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(script)], cwd=run.run_dir, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == EXIT_FAILED, done.stdout + done.stderr
    assert "grad['x'].dtype=torch.float32, but should be torch.float64" in done.stderr


def test_a_repro_script_whose_spec_cannot_load_here_exits_2_not_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Run from another folder than pytest's, a relative --impl is not found: the check cannot run
    here (2); it exited 1, the code of a defect still present (a new user's trial)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "repro_elsewhere_ops.py").write_text(
        "import torch\nfrom conformance import Tensor, register\n\n"
        "class Twice(torch.autograd.Function):\n"
        "    @staticmethod\n    def forward(ctx, x):\n        return 2 * x\n\n"
        "    @staticmethod\n    def backward(ctx, g):\n        return 2 * g\n\n"
        "register(Twice, name='twice', inputs=[Tensor('x', 'n')], reference=lambda x: 2 * x)\n"
    )
    for impl, name in (("specs.py", "mea_flash"), (str(tmp_path / "repro_elsewhere_ops.py"), "no_such_function")):
        with pytest.raises(SystemExit) as exiting:
            load_spec(impl, name)
        assert exiting.value.code == EXIT_NOT_CHECKED
        assert capsys.readouterr().err.startswith("not checked: ")


# Runs a repro script without its final replay() call, then the Function on the judged case.
JUDGED_DRIVER = """
import sys, torch
source = open(sys.argv[1]).read()
exec(source[: source.rindex("replay(")])
out = spec.op.call(*judged.args())
print("nan" if bool(torch.isnan(out).any()) else "finite")
"""


def test_a_derived_case_is_written_out_and_shows_the_failure(zoo_run) -> None:  # type: ignore[no-untyped-def]
    """stability judges a case it derived from the draws (constant rows, a fully masked row): the
    script writes that case as ``judged``, and the Function returns NaN on its tensors."""
    run = zoo_run("numeric_bugs")
    verdict = run.verdict("stability", "masked_attention_nan_rows")
    assert "degenerate inputs" in verdict.text and "each mask with a fully masked row" in verdict.text, verdict.text
    script = Path(verdict.recorded.repro)
    source = script.read_text()
    judged = source[source.index("\njudged = Case("):]
    assert "mask_kind='masked_rows'" in judged and "constant_rows=True" in judged, judged
    assert "args = judged.args()" in source
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", JUDGED_DRIVER, str(script)], cwd=run.run_dir, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "nan", done.stdout


def test_a_repro_script_writes_the_judged_case_only_when_it_was_derived(tmp_path: Path) -> None:
    spec = make_spec([Tensor("x", "n")])  # its own spec: the registry holds whatever was imported before
    drawn = Case(spec=spec, device="cpu", dtype=torch.float32, sizes={"n": 3}, batches={"batch": ()},
                 recipes=(TensorRecipe("x", shape=(3,), seed=1),), requires_grad=frozenset({"x"}))
    derived = replace(drawn, recipes=(replace(drawn.recipes[0], constant_rows=True),))
    common = dict(contract="stability", spec_name=spec.name, device="cpu", impl="m.py", draws=[("case", drawn)], summary="s", run_dir=tmp_path)
    assert "judged = " not in write_script(tmp_path / "a.py", judged=drawn, **common).read_text()  # type: ignore[arg-type]
    assert "judged = " not in write_script(tmp_path / "b.py", judged=None, **common).read_text()  # type: ignore[arg-type]
    source = write_script(tmp_path / "c.py", judged=derived, **common).read_text()  # type: ignore[arg-type]
    assert "judged = Case(" in source and "constant_rows=True" in source and "args = judged.args()" in source
    # A Scalar holding a tensor cannot be compared as a whole: such cases count as different, no error.
    with_tensor = replace(drawn, recipes=(*drawn.recipes, ScalarRecipe("w", value=torch.tensor([0.5, 1.0]))))
    other = replace(drawn, recipes=(*drawn.recipes, ScalarRecipe("w", value=torch.tensor([0.5, 1.0]))))
    assert _same_case(with_tensor, with_tensor) and not _same_case(with_tensor, other)
