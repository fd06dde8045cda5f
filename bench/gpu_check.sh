#!/usr/bin/env bash
# Kernel check on a CUDA machine, about 5 minutes: the kernel tests with compiled Triton on CUDA
# tensors, then `bench.kernels --quick` there. Results go to $OUT when set (runs/gpu_check otherwise):
#   pytest_kernels.xml, pytest_kernels.log, kernels_cuda.json, bench_kernels.log
# Run from anywhere: bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
DEST=${OUT:-runs/gpu_check}
mkdir -p "$DEST"

# Compiled kernels, not the interpreter: tests/conftest.py only sets TRITON_INTERPRET as a default.
export TRITON_INTERPRET=0
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# Compile caches stay out of $DEST, which should hold results only.
CACHE=$(mktemp -d)
trap 'rm -rf "$CACHE"' EXIT
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$CACHE/inductor}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$CACHE/triton}

if ! "$PY" -c "import sys, torch, triton; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: needs torch with CUDA and triton; this machine has no CUDA device or no triton" >&2
    exit 2
fi
if ! "$PY" -c "import memr1.kernels, memr1.bench"; then
    echo "gpu_check: memr1 is not installed in $PY (make install, or pip install -e .)" >&2
    exit 2
fi
"$PY" -c "import torch, triton; print('device', torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__)"

status=0
# Every kernel test: the cuda-parametrised ones run the Triton kernels and the torch references on
# the GPU (and the no-host-sync checks); CPU Triton cases skip, since the interpreter is off.
timeout 150 "$PY" -m pytest -q -rs tests/test_kernels_grpo.py tests/test_kernels_gae.py \
    tests/test_kernels_logprobs.py --junitxml "$DEST/pytest_kernels.xml" 2>&1 | tee "$DEST/pytest_kernels.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

# Triton rows are timed with triton.testing.do_bench; logprobs peak is max_memory_allocated.
timeout 150 "$PY" -m memr1.bench.kernels --quick --device cuda --json "$DEST/kernels_cuda.json" 2>&1 \
    | tee "$DEST/bench_kernels.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "gpu_check: exit $status; results in $DEST"
exit $status
