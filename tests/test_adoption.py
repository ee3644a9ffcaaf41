"""Adoption: the plugin costs nothing and breaks nothing in projects that do not use it, a name
clash is one clear error, and the suite gives the same verdicts installed from a wheel, vendored
into another project, and from this checkout."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import conformance
import conformance.embed.check as check_module
from autograd_conformance_plugin import PROFILES
from conformance.engine.runner import RunOptions
from conformance.plugin import devices
from conformance.plugin.devices import worker_gpu, worker_gpus
from conformance.spec import Tensor
from tests.conftest import REPO, ZOO

PLUGIN = "autograd_conformance_plugin"
VERDICT_ARGS = ["--device=cpu", "--max-examples=3", "--contracts=grad_meta,return_count,gradcheck", "-p", "no:cacheprovider"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    env.update(extra)
    return env


def _pytest(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args], cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=900,
    )


def _unrelated_project(root: Path) -> Path:
    """A project with its own `strategies`, `conformance` and `reference_ops` packages and a test
    that fails if anything imported torch."""
    root.mkdir()
    for package in ("strategies", "conformance", "reference_ops"):
        (root / package).mkdir()
        (root / package / "__init__.py").write_text(f"NAME = {package!r}\n")
    (root / "test_own.py").write_text(
        "import sys\n"
        "import conformance, strategies, reference_ops\n\n"
        "def test_own_packages_and_no_torch():\n"
        "    assert (conformance.NAME, strategies.NAME, reference_ops.NAME) == ('conformance', 'strategies', 'reference_ops')\n"
        "    assert 'torch' not in sys.modules, 'something imported torch in an unrelated run'\n"
    )
    return root


def test_an_unrelated_project_with_clashing_package_names_runs_green_without_torch(tmp_path: Path) -> None:
    project = _unrelated_project(tmp_path / "project")
    result = _pytest(["-q", "-p", "no:cacheprovider"], project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout

    def seconds(*extra: str) -> float:
        start = time.perf_counter()
        done = _pytest(["-q", "-p", "no:cacheprovider", *extra], project)
        assert done.returncode == 0, done.stdout
        return time.perf_counter() - start

    # Printed, not asserted (timings belong in a benchmark): the plugin's start-up cost next to
    # the same run with the plugin disabled.
    with_plugin = statistics.median(seconds() for _ in range(3))
    without = statistics.median(seconds("-p", f"no:{PLUGIN}") for _ in range(3))
    print(f"unrelated project: {with_plugin:.2f} s with the plugin, {without:.2f} s with -p no:{PLUGIN} (median of 3)")


def test_running_the_suite_where_a_package_shadows_it_is_one_clear_error(tmp_path: Path) -> None:
    project = _unrelated_project(tmp_path / "project")
    shutil.copy(ZOO / "core_bugs.py", project / "my_ops.py")
    result = _pytest(["--pyargs", "conformance", "--impl=my_ops.py", "-p", "no:cacheprovider"], project)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    message = result.stderr
    assert "autograd-conformance needs its own top-level package" in message
    assert str(project) in message and "Rename your package" in message
    assert "Traceback" not in message


def _copy_sources(dest: Path) -> Path:
    """This checkout's tracked files (a build must not write into the checkout)."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)
    return dest


def _vendor(project: Path) -> None:
    """The documented vendoring file list (README, "Vendoring")."""
    for package in ("conformance", "strategies"):
        shutil.copytree(REPO / package, project / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("autograd_conformance_plugin.py", "conftest.py"):
        shutil.copy(REPO / name, project / name)


def _verdicts(report: Path) -> dict[str, dict[str, str]]:
    return json.loads(report.with_suffix(".json").read_text())["matrix"]


def _suite_location(output: str) -> str:
    line = next(line for line in output.splitlines() if line.startswith("autograd-conformance: suite in "))
    return line.removeprefix("autograd-conformance: suite in ").split(";")[0]


def test_installed_vendored_and_checkout_runs_give_the_same_verdicts(tmp_path: Path) -> None:
    impl = ZOO / "core_bugs.py"
    # Checkout.
    checkout = _pytest(["conformance", f"--impl={impl}", *VERDICT_ARGS, f"--conformance-report={tmp_path / 'checkout'}"], REPO)
    assert _suite_location(checkout.stdout) == str(REPO)

    # Installed from a wheel built from the same sources, into its own directory.
    sources = _copy_sources(tmp_path / "sources")
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(sources)],
        check=True, capture_output=True, timeout=600,
    )
    site = tmp_path / "site"
    wheel = next(wheels.glob("autograd_conformance-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)], check=True, timeout=600)
    user = tmp_path / "user_project"
    user.mkdir()
    shutil.copy(impl, user / "my_ops.py")
    installed = _pytest(
        ["--pyargs", "conformance", "--impl=my_ops.py", *VERDICT_ARGS, f"--conformance-report={tmp_path / 'installed'}"],
        user, PYTHONPATH=str(site),
    )
    assert _suite_location(installed.stdout) == str(site)

    # Vendored into another project, whose own tests stay untouched.
    vendored_project = tmp_path / "vendored_project"
    vendored_project.mkdir()
    _vendor(vendored_project)
    shutil.copy(impl, vendored_project / "my_ops.py")
    vendored = _pytest(
        ["conformance", "--impl=my_ops.py", *VERDICT_ARGS, f"--conformance-report={tmp_path / 'vendored'}"], vendored_project,
    )
    assert _suite_location(vendored.stdout) == str(vendored_project)

    expected = _verdicts(tmp_path / "checkout")
    assert expected["wrong_dtype_grad-cpu"]["grad_meta"] == "failed" and expected["missing_transpose-cpu"]["gradcheck"] == "failed"
    assert _verdicts(tmp_path / "installed") == expected
    assert _verdicts(tmp_path / "vendored") == expected


def test_a_host_project_with_a_vendored_copy_runs_its_own_tests_unchanged(tmp_path: Path) -> None:
    project = tmp_path / "host"
    project.mkdir()
    _vendor(project)
    (project / "tests").mkdir()
    (project / "tests" / "test_host.py").write_text("def test_host():\n    assert True\n")
    for args in ([], ["tests"]):
        result = _pytest(["-q", "-p", "no:cacheprovider", *args], project)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "1 passed" in result.stdout and "error" not in result.stdout.lower(), result.stdout


def test_module_impl_of_an_uninstalled_project_resolves_from_where_pytest_runs(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "mypkg").mkdir(parents=True)
    (project / "mypkg" / "__init__.py").write_text((ZOO / "correct_module.py").read_text())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # Plain `pytest` (no cwd on sys.path) from the project root, the package not installed.
    result = subprocess.run(
        [str(Path(sys.executable).parent / "pytest"), "--pyargs", "conformance", "--impl=mypkg", *VERDICT_ARGS, "-q"],
        cwd=project, env=_env(), capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "passed" in result.stdout


@pytest.mark.parametrize(
    ("worker", "visible", "per_worker", "expected"),
    [
        ("", 4, 1, (0,)),
        ("master", 2, 1, (0,)),
        ("gw0", 4, 1, (0,)),
        ("gw3", 4, 1, (3,)),
        ("gw5", 4, 1, (1,)),  # more workers than GPUs: round-robin
        ("gw1", 4, 2, (2, 3)),
        ("gw2", 4, 2, (0, 1)),
        ("gw1", 3, 2, (2, 0)),
        ("gw7", 1, 1, (0,)),
    ],
)
def test_worker_gpus(worker: str, visible: int, per_worker: int, expected: tuple[int, ...]) -> None:
    assert worker_gpus(worker, visible, per_worker) == expected


@pytest.mark.parametrize(("visible", "per_worker"), [(0, 1), (2, 3), (2, 0)])
def test_worker_gpus_rejects_impossible_assignments(visible: int, per_worker: int) -> None:
    with pytest.raises(ValueError, match=f"{'visible' if visible < 1 else 'per_worker'}="):
        worker_gpus("gw0", visible, per_worker)


def test_check_under_xdist_makes_the_workers_own_gpu_current_and_restores_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """conformance.check() in a test spread over xdist workers (no suite run pinned them): worker
    gwN runs on GPU N (round-robin); a worker the suite pinned, and a call outside xdist, keep
    the current GPU; a CPU-only call does not enter it."""
    entered: list[int] = []

    @contextlib.contextmanager
    def device(index: int):  # type: ignore[no-untyped-def]
        entered.append(index)
        yield

    monkeypatch.setattr(devices, "cuda_usable", lambda: True)
    monkeypatch.setattr(devices.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(devices.torch.cuda, "device", device)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    with worker_gpu():
        assert entered == [1]  # gw3 of 2 GPUs
    monkeypatch.setitem(devices._PINNED, "gpu", 0)  # the suite's own run pinned this worker (--gpus-per-worker)
    with worker_gpu():
        pass
    monkeypatch.delitem(devices._PINNED, "gpu")
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    with worker_gpu():
        pass
    assert entered == [1]

    # check() runs its contract tests inside it.
    inside: list[bool] = []
    active = [False]

    @contextlib.contextmanager
    def recording_worker_gpu():  # type: ignore[no-untyped-def]
        active[0] = True
        yield
        active[0] = False

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[no-untyped-def]
            inside.append(active[0])
            return 2 * x

        @staticmethod
        def backward(ctx, g):  # type: ignore[no-untyped-def]
            return 2 * g

    monkeypatch.setattr(check_module, "worker_gpu", recording_worker_gpu)
    for device, on_the_workers_gpu in (("cpu", False), ("auto", True)):  # a CPU-only call never touches CUDA
        inside.clear()
        result = conformance.check(Double, inputs=[Tensor("x", "n")], reference=lambda x: 2 * x, device=device,
                                   contracts=["grad_meta"], max_examples=1)
        assert result.passed and inside and set(inside) == {on_the_workers_gpu}, (device, str(result), inside)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_profile_of_the_start_up_module_gives_the_runner_its_settings(profile: str) -> None:
    settings = RunOptions(profile_settings=PROFILES[profile]).hypothesis_settings()
    assert settings.max_examples == PROFILES[profile]["max_examples"]
    assert settings.derandomize == PROFILES[profile].get("derandomize", False)
    assert settings.database is None and settings.deadline is None
