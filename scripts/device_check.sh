#!/usr/bin/env bash
# Issue 38's device checks on one CUDA GPU, at most five minutes. From the repository root:
#
#     OUT=/a/new/folder bash scripts/device_check.sh
#
# Everything goes under $OUT: the versions, the kernels' CPU and PTX tests, the CuPy tests and
# the determinism test, the fused GAT layers (GATv1, GATv2) against the literal layer (bitwise
# forward for GATv1, bitwise repeat), compute-sanitizer's racecheck and memcheck on them, and
# bench_gpu.py timing the training loop's step and the layers on the fused path, the literal
# CuPy path and PyG in the same call. Each step has its own time limit (they
# add up to 290 s) and writes $OUT/<step>.txt; summary.txt has every step's exit status and
# duration. A failed step does not stop the next: one run says everything it can.
set -u

OUT="${OUT:-$(mktemp -d)}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PYTHON="${PYTHON:-python}"
SANITIZER="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

# step NAME SECONDS COMMAND...: the command and its output in $OUT/NAME.txt, its exit status
# (124: over its time limit) and duration in the summary
step() {
    local name=$1 seconds=$2 start=$SECONDS status
    shift 2
    printf '$ %s\n' "$*" >"$OUT/$name.txt"
    timeout --kill-after=5 "$seconds" "$@" >>"$OUT/$name.txt" 2>&1
    status=$?
    echo "$name: exit $status after $((SECONDS - start)) s (limit $seconds s)" | tee -a "$SUMMARY"
}

# $0 in the versions script is the sanitizer, $1 the Python
step versions 10 bash -c '
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    nvcc --version | tail -2
    "$0" --version | head -2
    lscpu | grep -E "Model name|^CPU\(s\)"
    "$1" -c "import sys, numpy, scipy; print(sys.version.split()[0], numpy.__version__, scipy.__version__)"
    "$1" -c "import cupy; print(\"cupy\", cupy.__version__, cupy.cuda.runtime.runtimeGetVersion())"
    "$1" -c "import torch, torch_geometric as g; print(\"torch\", torch.__version__, torch.version.cuda, \"pyg\", g.__version__)"
' "$SANITIZER" "$PYTHON"
# The kernels' tests: the twins, the sources compiled on the CPU and to PTX (no float atomics).
step kernel_tests 25 "$PYTHON" -m pytest -q -p no:randomly -p no:cacheprovider tests/kernels
# The determinism test whole, and every test run on CuPy in the files that have such tests.
step determinism 15 "$PYTHON" -m pytest -q -p no:randomly -p no:cacheprovider \
    tests/test_device_determinism.py
step cupy_tests 60 "$PYTHON" -m pytest -q -p no:randomly -p no:cacheprovider -k cupy \
    tests/kernels tests/ops tests/nn tests/models tests/test_backend.py tests/test_optim.py \
    tests/test_device_training.py tests/test_sparse_features.py tests/test_sparse_structure.py
# The fused GAT layers against the literal layer on CuPy (this also fills CuPy's kernel cache,
# so the sanitised runs below do not compile); then the kernels alone under the sanitizer.
step fused_check 20 "$PYTHON" scripts/bench_gpu.py --check-fused full
step racecheck 25 "$SANITIZER" --tool racecheck --error-exitcode 3 \
    "$PYTHON" scripts/bench_gpu.py --check-fused kernels
step memcheck 20 "$SANITIZER" --tool memcheck --leak-check no --error-exitcode 3 \
    "$PYTHON" scripts/bench_gpu.py --check-fused kernels
# Timings: the layer cases (literal, fused, PyG) and the full training steps, one call each.
step bench_gat 70 "$PYTHON" scripts/bench_gpu.py --steps 10 \
    --cases gat-a-layer gat-large-layer gatv2-large-layer gat-a gat-a0 gat-c gatv2-large \
    --json "$OUT/bench_gat.json"
step bench_nodeformer 45 "$PYTHON" scripts/bench_gpu.py --steps 3 --cases nodeformer-1e7 \
    --json "$OUT/bench_nodeformer.json"
echo "all output in $OUT"
