#!/usr/bin/env bash
# The CUDA paths in one prepared run, for a machine with a GPU (CI has none): the main job on CUDA
# (native Triton, bfloat16, CUDA autocast, xdist workers pinned round-robin on the GPUs) and the
# project tests whose CUDA branches a CPU run skips. Logs and the main job's reports go to $OUT.
set -u
OUT="${OUT:-$PWD/gpu_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
WORKERS="${WORKERS:-8}"

step() {  # step NAME SECONDS COMMAND...: run it with a time limit, log to $OUT/NAME.log, show its end
    local name=$1 limit=$2 start=$SECONDS rc=0
    shift 2
    echo "== $name: $*"
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1 || rc=$?
    echo "   rc=$rc in $((SECONDS - start)) s"
    tail -n "${TAIL:-30}" "$OUT/$name.log"
}

# The pytest11 entry point: pytester's runs in a temporary folder load the plugin only from it.
"$PY" -m pip install -q --no-deps --no-index --no-build-isolation -e . > "$OUT/pip.log" 2>&1 \
    || echo "pip install -e . failed (see $OUT/pip.log): tests that run pytester in a temporary folder will miss the plugin"

{
    nvidia-smi -L
    "$PY" -c "import torch, triton, hypothesis, xdist; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'hypothesis', hypothesis.__version__, 'xdist', xdist.__version__, torch.cuda.device_count(), 'x', torch.cuda.get_device_name(0))"
} 2>&1 | tee "$OUT/env.log"

step main_cuda "${MAIN_LIMIT:-200}" "$PY" -m pytest conformance --profile=ci --device=cuda -n "$WORKERS" \
    -p no:cacheprovider -q -rfE --conformance-report="$OUT/main_cuda"
step tests_cuda "${TESTS_LIMIT:-220}" "$PY" -m pytest tests/test_triton_kernels.py \
    tests/test_derivative_layout_determinism_device_contracts.py tests/test_plugin.py tests/test_memory_contracts.py \
    tests/test_beyond_eager.py tests/test_gradcheck_tolerance.py -n "$WORKERS" -p no:cacheprovider -q -rfE
