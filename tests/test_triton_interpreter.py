"""conformance.engine.triton_interpreter: third-party Triton kernels run on CPU without editing them
(libdevice fallbacks, autotune without a driver, bfloat16 refused), every autotune config is
its own test id, and interpreter limits are explained skips, never failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

triton = pytest.importorskip("triton", reason="Triton is not installed (pip install 'autograd-conformance[triton]')")

from conformance.engine.triton_interpreter import (  # noqa: E402
    InterpreterLimit,
    install,
    interpreter_limit,
    pinned_config,
)
from tests.conftest import REPO, ZOO  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(not INTERPRETED, reason="checks the interpreter helper (CUDA present: kernels run natively)")


import triton.language as tl  # noqa: E402
from triton.language.extra import libdevice  # noqa: E402


def _math_kernel():  # type: ignore[no-untyped-def]
    @triton.autotune(configs=[triton.Config({"BLOCK": 8}), triton.Config({"BLOCK": 32})], key=["n"])
    @triton.jit
    def kernel(x_ptr, out_ptr, n, eps, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=1.0)
        y = libdevice.rsqrt(x * x + eps.to(tl.float64)) + libdevice.tanh(x) + libdevice.pow(x * x + 1.0, 0.5) + libdevice.erf(x)
        tl.store(out_ptr + offs, y, mask=mask)

    return kernel


def test_libdevice_fallbacks_and_autotune_run_a_gpu_style_kernel_on_cpu() -> None:
    assert install()
    kernel = _math_kernel()
    x = torch.linspace(-3, 3, 37, dtype=torch.float64)
    eps32 = float(torch.tensor(1e-6, dtype=torch.float32))  # a float argument arrives as fp32, as natively
    expected = torch.rsqrt(x * x + eps32) + torch.tanh(x) + (x * x + 1).sqrt() + torch.erf(x)
    for index in (0, 1):
        out = torch.full_like(x, float("nan"))
        with pinned_config(kernel, index):
            kernel[lambda meta: (triton.cdiv(37, meta["BLOCK"]),)](x, out, 37, 1e-6)  # eps: a Python float, .to() in the kernel
        assert kernel.best_config.kwargs["BLOCK"] == (8, 32)[index]
        torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    out = torch.empty_like(x)
    kernel[lambda meta: (triton.cdiv(37, meta["BLOCK"]),)](x, out, 37, 1e-6)  # unpinned: the first config, no benchmark
    assert kernel.best_config.kwargs["BLOCK"] == 8


def test_bfloat16_and_missing_fallbacks_raise_an_interpreter_limit() -> None:
    install()
    kernel = _math_kernel()
    x = torch.ones(4, dtype=torch.bfloat16)
    with pytest.raises(Exception) as caught:
        kernel[(1,)](x, torch.empty_like(x), 4, 1e-6)
    assert isinstance(interpreter_limit(caught.value), InterpreterLimit)
    assert "truncates float32 to bfloat16" in str(interpreter_limit(caught.value))


def test_a_kernel_without_a_fallback_is_not_run_here_and_named(conformance_run) -> None:  # type: ignore[no-untyped-def]
    run = conformance_run(ZOO / "triton_interpreter_limits.py", max_examples=3)
    outcomes = {contract: v.outcome for (contract, _, _), v in run.verdicts.items()}
    assert "failed" not in outcomes.values(), {k: v.text for k, v in run.verdicts.items() if v.outcome == "failed"}
    for contract in ("reference", "gradcheck", "return_count"):
        text = run.verdict(contract, "triton_bessel_j0").text
        assert "libdevice.j0 has no fallback under the Triton interpreter" in text, text


def test_every_autotune_config_is_a_test_id_and_only_the_wrong_one_fails(conformance_run) -> None:  # type: ignore[no-untyped-def]
    run = conformance_run(ZOO / "triton_autotune_bugs.py", contracts=("unwritten_memory", "reference"), max_examples=8)
    configs = ("BLOCK_M16-BLOCK_N16", "BLOCK_M16-BLOCK_N32", "BLOCK_M32-BLOCK_N16")
    assert run.names() == {f"{name}:{c}" for name in ("triton_autotune_grid_bug", "triton_autotune_scale") for c in configs}
    failed = {(c, n) for (c, n, _), v in run.verdicts.items() if v.outcome == "failed"}
    assert failed == {("unwritten_memory", "triton_autotune_grid_bug:BLOCK_M16-BLOCK_N32")}
    text = run.failed("unwritten_memory", "triton_autotune_grid_bug:BLOCK_M16-BLOCK_N32")
    assert "autotune config 2 of 3 of scale_columns: BLOCK_M=16, BLOCK_N=32" in text
    assert "output[0][16, 0]=NaN from a poisoned allocation" in text  # the first row no program wrote
    assert "blocked by unwritten_memory" in run.verdict("reference", "triton_autotune_grid_bug:BLOCK_M16-BLOCK_N32").text
    for config in configs:
        run.passed("unwritten_memory", f"triton_autotune_scale:{config}")
        run.passed("reference", f"triton_autotune_scale:{config}")


def test_a_third_party_kernel_package_runs_unedited_on_cpu(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A subprocess, as a user runs it: the package and its kernels are imported fresh.
    package = REPO / "tests" / "thirdparty"
    env = {**os.environ, "PYTHONPATH": str(package)}  # as if installed
    report = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "conformance", f"--impl={package / 'tinykernels_conformance.py'}", "--device=cpu",
         "--max-examples=4", "-p", "no:cacheprovider", "-q", f"--conformance-report={report}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )
    data = json.loads(report.with_suffix(".json").read_text())
    assert data["run"]["triton"] == "interpreted (bfloat16 disabled; libdevice fallbacks and one autotune config per test id)"
    results = {(r["contract"], r["function"]): r for r in data["results"]}
    names = {name for _, name in results}
    assert names == {"tinykernels_gelu_tanh", "tinykernels_rms_norm:BLOCK_ROWS1-w2", "tinykernels_rms_norm:BLOCK_ROWS4"}
    failed = {key for key, r in results.items() if r["outcome"] == "failed"}
    # A real finding in the package, the only one: its backwards launch kernels without
    # @once_differentiable, so double backward silently returns gradients that are not differentiable.
    assert failed == {("gradgradcheck", name) for name in names}, done.stdout[-3000:]
    assert "but double backward should raise" in results[("gradgradcheck", "tinykernels_gelu_tanh")]["reason"]
    for name in names:
        for contract in ("reference", "layouts", "unwritten_memory", "out_of_bounds", "needs_input_grad"):
            assert results[(contract, name)]["outcome"] == "passed", (contract, name, results[(contract, name)]["reason"])
    # bfloat16 is left out of the draws, not skipped per test; only compile is not run here (Dynamo
    # traces Triton kernels with fake tensors, which the interpreter cannot launch).
    not_run = {(r["contract"], r["function"]) for r in data["results"] if r["outcome"] == "not_run_here"}
    assert not_run == {("compile", name) for name in names}, not_run
