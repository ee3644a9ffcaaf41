"""The printed rerun line replays the failing example, however the suite was loaded: from a
checkout (path), installed (``--pyargs``) or vendored into another project (path); and a CUDA
run on a machine without CUDA is a usage error, never a silent green."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import CONFORMANCE_DIR, REPO, ZOO

# Options that shape the examples: the rerun must carry every one of them.
SHAPING = ["--seed=5", "--profile=ci", "--max-examples=4", "--dtypes=float64,float32", "--device=cpu"]


def _pytest(args: list[str], cwd: Path, tmp_path: Path, tag: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider", f"--basetemp={tmp_path / tag}"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )


def _one(pattern: str, text: str) -> str:
    found = re.findall(pattern, text, flags=re.MULTILINE)
    assert len(found) >= 1, f"no line matching {pattern!r} in:\n{text[-4000:]}"
    return found[0]


def _check_rerun_replays(first: subprocess.CompletedProcess[str], cwd: Path, tmp_path: Path, expect_in_rerun: str) -> None:
    assert first.returncode == 1, first.stdout[-4000:] + first.stderr[-2000:]
    rerun = _one(r"^(?:E)?\s+rerun: (.*)$", first.stdout)
    argv = shlex.split(rerun)
    assert expect_in_rerun in " ".join(argv), rerun
    for option in SHAPING:
        assert option in argv, f"{option} is missing from the rerun line {rerun!r}"
    case = _one(r"^(?:E)?\s+case: (.*)$", first.stdout)
    assert argv[:3] == ["python", "-m", "pytest"]
    again = _pytest(argv[3:], cwd, tmp_path, "rerun")
    assert again.returncode == 1, again.stdout[-4000:]
    assert "1 failed" in again.stdout, again.stdout[-2000:]
    assert _one(r"^(?:E)?\s+case: (.*)$", again.stdout) == case, "the rerun failed on another example"


def _first_run_args(impl: Path) -> list[str]:
    return [f"--impl={impl}", "--contracts=grad_meta", "-k", "wrong_dtype_grad", *SHAPING]


def test_rerun_from_a_checkout(tmp_path: Path) -> None:
    first = _pytest(["conformance", *_first_run_args(ZOO / "core_bugs.py")], REPO, tmp_path, "first")
    _check_rerun_replays(first, REPO, tmp_path, "conformance/test_grad_meta.py::test_grad_meta[wrong_dtype_grad-cpu]")


def test_rerun_of_an_installed_suite_uses_pyargs(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ZOO / "core_bugs.py", project / "my_ops.py")
    first = _pytest(["--pyargs", "conformance", *_first_run_args(Path("my_ops.py"))], project, tmp_path, "first")
    _check_rerun_replays(first, project, tmp_path, "--pyargs conformance.test_grad_meta::test_grad_meta[wrong_dtype_grad-cpu]")


def test_rerun_of_a_vendored_copy(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    for package in ("conformance", "strategies"):
        shutil.copytree(REPO / package, project / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "conftest.py", project / "conftest.py")
    shutil.copy(ZOO / "core_bugs.py", project / "my_ops.py")
    first = _pytest(["conformance", *_first_run_args(Path("my_ops.py"))], project, tmp_path, "first")
    assert str(project / "conformance") in first.stdout or "conformance/test_grad_meta.py" in first.stdout
    _check_rerun_replays(first, project, tmp_path, "conformance/test_grad_meta.py::test_grad_meta[wrong_dtype_grad-cpu]")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: --device=cuda is valid here")
def test_device_cuda_without_cuda_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess(str(CONFORMANCE_DIR), "--impl=reference_ops", "--device=cuda", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    message = result.stderr.str()
    assert "--device=cuda, but CUDA is not usable here" in message
    assert "torch.cuda.is_available()=False" in message and "torch.cuda.device_count()=0" in message
    assert f"torch {torch.__version__}" in message
