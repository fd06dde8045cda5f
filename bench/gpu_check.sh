#!/usr/bin/env bash
# The GPU path in one run, about 7 minutes on one H200 (GPU_CHECK_BUDGET_S caps the whole run, 420 s):
#   1. learner   one GRPO learner step in bf16 (memr1.bench.gpu_learner): 16 prompts x 8 completions of
#                512 + 128 tokens, 3 warm-up + 5 timed steps, positions/s and MFU, with and without
#                activation checkpointing; a torch.profiler trace of one step and its top 15 ops
#   2. rollout   transformers generate in bf16 (memr1.bench.rollout --backends hf --kinds short): tokens/s,
#                prefill and decode seconds for 8 prompts x 4 samples of 64 new tokens (ignore_eos),
#                dynamic and static cache, and a full-model update_weights
#   3. kernels   the kernel tests with compiled Triton on CUDA tensors (TRITON_INTERPRET=0)
#   4. bench     memr1.bench.kernels --quick --device cuda
# Parts 1 and 2 share one model: random weights of SmolLM2-135M-Instruct's architecture with its
# tokenizer, built from .gpu_wheels/smollm2_shape/ (config + tokenizer files; else from the converted
# default model) into a temporary folder; fp32 on disk (the learner's master weights; the HF backend
# loads it as bf16).
#
# Nothing needs installing: memr1 is imported from this checkout through a temporary package of
# symlinks (memr1/engine -> engine/, ...; memory_store's native core is neither built nor imported),
# and wheels in .gpu_wheels/ (msgspec) are unpacked into a temporary folder when the interpreter lacks
# msgspec. On the device: carry `.gpu_wheels` and run `bash bench/gpu_check.sh` with $OUT set.
#
# Results in $OUT (runs/gpu_check when unset), at most 7 files:
#   gpu_check.log          everything printed, part by part
#   summary.json           each part's exit code, seconds and timeout; the files promised; highlights
#   learner.json           step times, positions/s, tokens/s, MFU (formula inside), top ops by CUDA time
#   learner_trace.json.gz  Chrome trace (CPU + CUDA) of one learner step (Perfetto, chrome://tracing)
#   rollout_hf.json        HF generation tokens/s per cache variant, update_weights ms against a plain copy
#   pytest_kernels.xml     junit XML of the kernel tests (not with --dry)
#   kernels_cuda.json      bench.kernels rows (kernels_cpu.json, gae only, with --dry)
#
#   bash bench/gpu_check.sh [--dry | --prepare]
# --prepare (here, before a device run): fills .gpu_wheels/ with what the device lacks, the cp312 msgspec
# wheel and SmolLM2's config and tokenizer files (3.7 MB; keep the folder out of git with
# `echo /.gpu_wheels/ >> .git/info/exclude`), then run the device with carry [".gpu_wheels"].
# --dry (or GPU_CHECK_DRY=1): every part on the CPU at toy sizes (2-layer model, 1 + 2 learner steps,
# 4 new tokens; no kernel tests), in seconds: tests/test_gpu_check.py runs it.
# PY picks the interpreter (.venv/bin/python when present, else python3); PEAK_FLOPS the MFU peak;
# GPU_WHEELS the wheel folder (.gpu_wheels).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DRY=${GPU_CHECK_DRY:-0}
prepare() {
    local dest=.gpu_wheels py=${PY:-.venv/bin/python}
    mkdir -p "$dest/smollm2_shape"
    local pin  # the project's own msgspec pin, as a cp312 wheel for the device's Python
    pin=$(grep -m1 '^msgspec==' requirements.txt) || return 1
    "$py" -m pip download -q "$pin" --only-binary=:all: --python-version 3.12 \
        --platform manylinux2014_x86_64 --no-deps -d "$dest" || return 1
    local model
    model=$("$py" -c "from memr1.engine.generation import default_model_path; print(default_model_path())") || return 1
    for f in config.json tokenizer.json tokenizer_config.json chat_template.jinja generation_config.json; do
        cp "$model/$f" "$dest/smollm2_shape/" || return 1
    done
    du -sh "$dest"
}
for arg in "$@"; do
    case $arg in
        --dry) DRY=1 ;;
        --prepare) prepare; exit $? ;;
        *) echo "usage: bash bench/gpu_check.sh [--dry | --prepare]" >&2; exit 2 ;;
    esac
done
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
case $PY in
    */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;;
    *) PY=$(command -v "$PY") ;;
esac
DEST=${OUT:-runs/gpu_check}
mkdir -p "$DEST" && DEST=$(cd "$DEST" && pwd)
# A previous run's results must not pass for this run's (the summary checks what is there).
rm -f "$DEST"/{summary.json,learner.json,learner_trace.json.gz,rollout_hf.json,pytest_kernels.xml,kernels_cuda.json,kernels_cpu.json}
if [ "$DRY" = 1 ]; then BUDGET=${GPU_CHECK_BUDGET_S:-300}; DEV=cpu; else BUDGET=${GPU_CHECK_BUDGET_S:-420}; DEV=cuda; fi
PEAK_FLOPS=${PEAK_FLOPS:-989e12}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/memr1-gpu-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# Compiled kernels, not the interpreter: tests/conftest.py only sets TRITON_INTERPRET as a default.
export TRITON_INTERPRET=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
# Compile caches stay out of $DEST, which holds results only.
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$WORK/inductor} TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$WORK/triton}
[ "$DRY" = 1 ] && export MEMR1_PRELOAD=0  # CPU entry points would restart once with tcmalloc: seconds for nothing

# `part NAME TIMEOUT CMD...`: run CMD under `timeout`, cut to what is left of the budget; record it.
part() {
    local name=$1 limit=$2 left t0 rc
    shift 2
    left=$((BUDGET - SECONDS))
    if [ "$left" -lt 15 ]; then
        echo "== $name: skipped, ${left}s of the ${BUDGET}s budget left"
        printf '%s\t%s\t%s\t%s\n' "$name" skipped 0 0 >> "$WORK/parts.tsv"
        status=1
        return
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    echo
    echo "== $name (timeout ${limit}s, at ${SECONDS}s): $*"
    t0=$SECONDS
    timeout -k 10 "$limit" "$@"
    rc=$?
    echo "== $name: exit $rc after $((SECONDS - t0))s$([ $rc -eq 124 ] || [ $rc -eq 137 ] && echo ' (timed out)')"
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$limit" >> "$WORK/parts.tsv"
    [ "$rc" -eq 0 ] || status=1
}

# memr1 from this checkout without installing it, and the carried wheels the interpreter lacks.
setup_python() {
    mkdir -p "$WORK/py/memr1" "$WORK/site"
    echo '"""memr1 from a checkout, for bench/gpu_check.sh: each folder linked in as a subpackage."""' \
        > "$WORK/py/memr1/__init__.py"
    for d in engine kernels rl bench memory_store; do ln -s "$ROOT/$d" "$WORK/py/memr1/$d"; done
    export PYTHONPATH="$WORK/py:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
    if ! "$PY" -c "import msgspec" 2>/dev/null; then
        for w in "${GPU_WHEELS:-$ROOT/.gpu_wheels}"/*.whl; do
            [ -f "$w" ] || continue
            echo "installing $(basename "$w") into $WORK/site"
            if "$PY" -m pip --version >/dev/null 2>&1; then
                "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" "$w"
            else  # a wheel is a zip of the files to install
                "$PY" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$w" "$WORK/site"
            fi
        done
    fi
}

# Imports the GPU path: memr1 comes from this checkout, and nothing on the path reaches the memory bank
# (whose native core is not built here); if something does, say which import did.
IMPORT_CHECK='
import importlib, os, sys, traceback

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "memr1.memory_store":
            print("FAIL: memr1.memory_store imported from:\n" + "".join(traceback.format_stack()[:-1]), flush=True)
            Watch.hit = True
        return None
Watch.hit = False
sys.meta_path.insert(0, Watch())
import torch
for m in ("memr1.kernels", "memr1.engine.training.learner", "memr1.engine.generation", "memr1.engine.generation.hf",
          "memr1.bench.gpu_learner", "memr1.bench.rollout", "memr1.bench.kernels"):
    importlib.import_module(m)
import memr1, msgspec, transformers
print("memr1 from", list(memr1.__path__), "| msgspec", msgspec.__version__, "from", os.path.dirname(msgspec.__file__))
print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda,
      "| transformers", transformers.__version__, end=" ")
try:
    import triton
    print("| triton", triton.__version__)
except ImportError:
    print("| no triton")
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))
bank = sorted(m for m in sys.modules if m.startswith("memr1.memory_store"))
if Watch.hit or bank:
    sys.exit(f"FAIL: the GPU path imported {bank}")
if os.environ["GPU_CHECK_DEV"] == "cuda" and not torch.cuda.is_available():
    sys.exit("no CUDA device visible to torch")
'

SUMMARY='
import glob, json, os, sys, xml.etree.ElementTree as ET
dest, work, dry, budget, dev = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4]), sys.argv[5]
parts = []
for line in open(os.path.join(work, "parts.tsv")):
    name, rc, secs, limit = line.rstrip("\n").split("\t")
    parts.append({"part": name, "rc": None if rc == "skipped" else int(rc), "skipped": rc == "skipped",
                  "seconds": int(secs), "timeout_s": int(limit), "timed_out": rc in ("124", "137")})
promised = ["gpu_check.log", "summary.json", "learner.json", "learner_trace.json.gz", "rollout_hf.json",
            f"kernels_{dev}.json"] + ([] if dry else ["pytest_kernels.xml"])
def load(name):
    try:
        return json.load(open(os.path.join(dest, name)))
    except (OSError, ValueError):
        return None
hi = {}
learner = load("learner.json")
if learner:
    hi["learner"] = [{k: r.get(k) for k in ("variant", "step_ms_median", "positions_per_s", "response_tokens_per_s",
                                             "mfu", "hfu_with_recompute", "peak_mem_gib")} for r in learner["rows"]]
rollout = load("rollout_hf.json")
if rollout:
    hi["hf_tokens_per_s"] = {r["variant"]: r["tokens_per_s"] for r in rollout["rows"] if "prompt_kind" in r}
    hi["hf_update_ms"] = [r["update_ms"] for r in rollout["rows"] if "update_ms" in r]
if os.path.exists(os.path.join(dest, "pytest_kernels.xml")):
    try:
        s = ET.parse(os.path.join(dest, "pytest_kernels.xml")).getroot()
        s = s if s.tag == "testsuite" else s.find("testsuite")
        hi["kernel_tests"] = {k: int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    except ET.ParseError:
        hi["kernel_tests"] = "unreadable junit XML"
files = {os.path.basename(p): os.path.getsize(p) for p in glob.glob(os.path.join(dest, "*")) if os.path.isfile(p)}
missing = [f for f in promised if f not in files and f != "summary.json"]
ok = all(p["rc"] == 0 for p in parts) and not missing
summary = {"bench": "gpu_check", "dry": dry, "device": dev, "ok": ok, "budget_s": budget,
           "parts": parts, "promised": promised, "missing": missing, "files": files, "highlights": hi}
json.dump(summary, open(os.path.join(dest, "summary.json"), "w"), indent=2)
print(json.dumps({"ok": ok, "parts": {p["part"]: p["rc"] for p in parts}, "missing": missing, **hi}, indent=1))
sys.exit(0 if ok else 1)
'

main() {
    status=0
    : > "$WORK/parts.tsv"
    echo "gpu_check: $(date -u +%FT%TZ) dry=$DRY device=$DEV python=$PY budget=${BUDGET}s out=$DEST"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit \
        --format=csv 2>&1
    setup_python
    cd "$WORK"  # never the checkout: its bare folders (kernels/, engine/) must not shadow packages
    printf '%s' "$IMPORT_CHECK" > "$WORK/import_check.py"
    export GPU_CHECK_DEV=$DEV
    part imports 90 "$PY" "$WORK/import_check.py"
    if [ "$status" -ne 0 ] && [ "$DEV" = cuda ] && ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
        echo "gpu_check: needs torch with CUDA; this machine has no CUDA device"
        write_summary
        return 2
    fi

    local model=$WORK/model/SmolLM2-135M-Instruct-random dry_flag=""
    if [ "$DRY" = 1 ]; then
        model=$WORK/model/SmolLM2-135M-Instruct-tiny-random
        dry_flag=--dry
    fi
    # Writes the random model first (at $model, which the rollout part reuses), then trains on it.
    part learner 240 "$PY" -m memr1.bench.gpu_learner $dry_flag --model "$model" --out "$DEST" \
        --peak-flops "$PEAK_FLOPS"
    [ -f "$model/model.safetensors" ] || part model 120 "$PY" -m memr1.bench.gpu_learner $dry_flag --build-only --model "$model"
    if [ "$DRY" = 1 ]; then
        part rollout 120 "$PY" -m memr1.bench.rollout --backends hf --kinds short --hf-variants dynamic \
            --model "$model" --dtype bfloat16 --quick --new-tokens 4 --json "$DEST/rollout_hf.json"
        part bench_kernels 120 "$PY" -m memr1.bench.kernels --quick --device cpu --only gae --threads 1 \
            --json "$DEST/kernels_cpu.json"
    else
        part rollout 150 "$PY" -m memr1.bench.rollout --backends hf --kinds short --hf-variants dynamic,static \
            --model "$model" --dtype bfloat16 --new-tokens 64 --rounds 3 --json "$DEST/rollout_hf.json"
        # Every kernel test: the cuda-parametrised ones run the Triton kernels and the torch references on
        # the GPU (and the no-host-sync checks); CPU Triton cases skip, since the interpreter is off, and
        # so do the C++ CPU path's, which this unbuilt checkout lacks.
        part kernel_tests 150 env MEMR1_NATIVE_UNBUILT=1 "$PY" -m pytest -q -rs -p no:cacheprovider --rootdir "$ROOT" \
            "$ROOT/tests/test_kernels_grpo.py" "$ROOT/tests/test_kernels_gae.py" "$ROOT/tests/test_kernels_logprobs.py" \
            --junitxml "$DEST/pytest_kernels.xml"
        # Triton rows are timed with triton.testing.do_bench; logprobs peak is max_memory_allocated.
        part bench_kernels 150 "$PY" -m memr1.bench.kernels --quick --device cuda --json "$DEST/kernels_cuda.json"
    fi
    echo
    write_summary || status=1
    echo "gpu_check: exit $status after ${SECONDS}s; results in $DEST"
    return $status
}

write_summary() {
    printf '%s' "$SUMMARY" > "$WORK/summary.py"
    "$PY" "$WORK/summary.py" "$DEST" "$WORK" "$DRY" "$BUDGET" "$DEV"
}

main 2>&1 | tee "$DEST/gpu_check.log"
exit "${PIPESTATUS[0]}"
