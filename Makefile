# The kit's user-facing verbs. Each target sets up what it needs: a virtual environment outside the clone
# (cached by Python version and the hash of requirements/core.txt, so later runs start at once).
PYTHON    ?= python3
KIT_CACHE ?= $(HOME)/.cache/arc-kit
ARC_DATA  ?= $(abspath ../shared/arc-data)
OUT       ?= out
PYVER     := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
REQHASH   := $(shell cat requirements/core.txt | sha256sum | cut -c1-12)
VENV      ?= $(KIT_CACHE)/venv-core-py$(PYVER)-$(REQHASH)
PY        := $(VENV)/bin/python
# The engine environment (torch, transformers, vLLM's CPU build): tests and demos that run a model.
ENGHASH   := $(shell cat requirements/core.txt requirements/engine-cpu.txt | sha256sum | cut -c1-12)
ENGINE_VENV ?= $(KIT_CACHE)/venv-engine-cpu-py$(PYVER)-$(ENGHASH)
EPY       := $(ENGINE_VENV)/bin/python
# The build environment (torch, transformers, compressed-tensors' converter): checkpoint surgery in build/.
BLDHASH   := $(shell cat requirements/core.txt requirements/build-cpu.txt | sha256sum | cut -c1-12)
BUILD_VENV ?= $(KIT_CACHE)/venv-build-cpu-py$(PYVER)-$(BLDHASH)
BPY       := $(BUILD_VENV)/bin/python
# The unsloth environment (its own: unsloth pins older transformers and trl): the GPU training backend.
UNSHASH   := $(shell cat requirements/core.txt requirements/unsloth-cpu.txt | sha256sum | cut -c1-12)
UNSLOTH_VENV ?= $(KIT_CACHE)/venv-unsloth-cpu-py$(PYVER)-$(UNSHASH)
UPY       := $(UNSLOTH_VENV)/bin/python
export ARC_DATA

.PHONY: env engine-env build-env unsloth-env prune-demo wheels bundle train-rft test test-core dry-run simulate demo bench clean

env: $(VENV)/.installed

# No prerequisites: the folder is keyed by the requirements' hash, so its stamp alone says it is up to date
# (requirements/install.sh: a lock for concurrent set-ups, pip's per-package lines as progress).
$(VENV)/.installed:
	bash requirements/install.sh $(PYTHON) $(VENV) requirements/core.txt

engine-env: $(ENGINE_VENV)/.installed

build-env: $(BUILD_VENV)/.installed

unsloth-env: $(UNSLOTH_VENV)/.installed

# vLLM's CPU build and unsloth fail on the torchvision / torchaudio / torchcodec that their dependencies bring, so
# those environments remove them.
$(ENGINE_VENV)/.installed:
	bash requirements/install.sh $(PYTHON) $(ENGINE_VENV) requirements/engine-cpu.txt torchvision torchaudio torchcodec

$(BUILD_VENV)/.installed:
	bash requirements/install.sh $(PYTHON) $(BUILD_VENV) requirements/build-cpu.txt

$(UNSLOTH_VENV)/.installed:
	bash requirements/install.sh $(PYTHON) $(UNSLOTH_VENV) requirements/unsloth-cpu.txt torchvision torchaudio torchcodec

# The whole suite, the real engines included (vLLM's CPU build, transformers): the engine environment; then the
# checkpoint-surgery and training tests in the build environment (compressed-tensors' converter is newer than vLLM's
# pin); then the unsloth backend's test in its own environment.
test: engine-env build-env unsloth-env
	$(EPY) -m pytest -q tests
	$(BPY) -m pytest -q tests/test_prune.py tests/test_patch_eot.py tests/test_quantize.py tests/test_pipeline.py \
	    tests/test_rft.py tests/test_fused_groups.py tests/test_layerwise.py tests/test_build_scale.py
	$(UPY) -m pytest -q tests/test_rft.py -k unsloth

# The suite without the engine environment (engine tests skip): CI runs it on the second Python version.
test-core: env
	$(PY) -m pytest -q tests

# The solver end to end on a fresh machine: a tiny random-weight Qwen3 and a local tokenizer, 10 ARC-AGI-2
# evaluation tasks under a 3-minute deadline, the answer file and the attempt log; the closing summary scores it.
dry-run: engine-env
	$(EPY) -m build.tiny --arch qwen3 --out $(OUT)/tiny-qwen3
	$(EPY) -m submission.main --tasks $(ARC_DATA)/arc-agi-2/evaluation --max-tasks 10 --profile cpu-tiny \
	    --model $(OUT)/tiny-qwen3 --deadline 180 --out $(OUT)/dry-run/submission.json \
	    --log $(OUT)/dry-run/attempts.jsonl

# The core end to end without a model: the shipped example programs over ARC-AGI-2 training, scored.
demo: env
	$(PY) -m submission.library --tasks $(ARC_DATA)/arc-agi-2/training --programs examples/programs \
	    --out $(OUT)/demo/submission.json

# Forecast a 12-hour hidden-set run (240 tasks) of the moe-4xL4 profile from the shipped example log (synthetic:
# see sim/example_log.py), compare it with dense-27b-4xL4, and plot one run's timeline.
simulate: env
	$(PY) -m sim forecast --log sim/data/example_attempts.jsonl --tasks $(ARC_DATA)/arc-agi-2/evaluation \
	    --profile moe-4xL4 --hidden-tasks 240 --runs 50 --sensitivity --sweep dense-27b-4xL4 --out $(OUT)/simulate

# Expert pruning end to end on a tiny Qwen3-MoE: traces from real ARC tasks through the solver's prompt renderer,
# routing statistics, expert lists and their report, the pruned checkpoint.
# With TOPOLOGY=qwen3-next-80b (or qwen3-30b-a3b): the real model's tensors at tiny widths (build.topology), and every
# step at that scale: calibrate (layer by layer) -> lists -> prune -> quantise -> patch -> likelihood check, each
# step's time and peak memory printed.
PD = $(OUT)/prune-demo
TOPOLOGY ?=
TIMED = /usr/bin/time -f "  -> %e s, peak RSS %M kB"
prune-demo: build-env
	rm -rf $(PD) && mkdir -p $(PD)
ifeq ($(TOPOLOGY),)
	$(BPY) -m build.tiny --arch qwen3_moe --out $(PD)/model --max-shard-size 300KB
	$(BPY) -m build.traces --model $(PD)/model --tasks $(ARC_DATA)/arc-agi-2/training --max-tasks 24 \
	    --out $(PD)/traces.jsonl
	$(BPY) -m build.calibrate --model $(PD)/model --traces $(PD)/traces.jsonl --out $(PD)/stats.npz
	$(BPY) -m build.experts --stats $(PD)/stats.npz --config build/lists-tiny.toml --out $(PD)/lists
	$(BPY) -m build.prune --model $(PD)/model --list $(PD)/lists/c1.json --out $(PD)/pruned
	@echo "pruned checkpoint: $(PD)/pruned (provenance in $(PD)/pruned/pruning.json)"
else
	$(TIMED) $(BPY) -m build.tiny --topology $(TOPOLOGY) --out $(PD)/model
	$(TIMED) $(BPY) -m build.traces --model $(PD)/model --tasks $(ARC_DATA)/arc-agi-2/training --max-tasks 4 \
	    --thinking 0 --out $(PD)/traces.jsonl
	$(TIMED) $(BPY) -m build.calibrate --model $(PD)/model --traces $(PD)/traces.jsonl --out $(PD)/stats.npz
	$(TIMED) $(BPY) -m build.experts --stats $(PD)/stats.npz --config build/lists.toml --out $(PD)/lists
	$(TIMED) $(BPY) -m build.prune --model $(PD)/model --list $(PD)/lists/c8.json --out $(PD)/pruned
	$(TIMED) $(BPY) -m build.quantize --model $(PD)/pruned --recipe build/recipes/moe-4xL4.toml \
	    --out $(PD)/quantized --no-report
	$(TIMED) $(BPY) -m build.patch_eot --model $(PD)/quantized --out $(PD)/patched
	$(TIMED) $(BPY) -m build.check_quality --reference $(PD)/pruned --candidate $(PD)/patched \
	    --traces $(PD)/traces.jsonl --recipe build/recipes/moe-4xL4.toml
endif

# The locked wheels of a bundle target, downloaded into ~/.cache/arc-kit/wheels/TARGET and checked against
# offline_wheels/locks/TARGET.txt.
TARGET ?= cpu-py311
wheels: env
	$(PY) -m offline_wheels.lock --target $(TARGET) --fetch

# The offline Kaggle dataset, built as the profile's [build] section says. By default the CPU demo: a tiny Qwen3 for
# the cpu-tiny profile. For a real model: make bundle PROFILE=moe-4xL4 MODEL=/ckpt LIST=lists/c8.json
# (TARGET=, RECIPE=, CALIBRATION_TASKS= override the profile).
PROFILE ?= cpu-tiny
bundle: build-env
	rm -rf $(OUT)/bundle
	$(BPY) -m build.pipeline --profile $(PROFILE) --out $(OUT)/bundle $(if $(filter command line,$(origin TARGET)),--target $(TARGET)) \
	    $(if $(MODEL),--model $(MODEL)) $(if $(LIST),--list $(LIST)) $(if $(RECIPE),--recipe $(RECIPE)) \
	    $(if $(CALIBRATION_TASKS),--calibration-tasks $(CALIBRATION_TASKS))

# Rejection-sampling fine-tuning end to end on the tiny model: traces sampled with the hf engine on 4 ARC training
# tasks (plus one injected known-correct trace per input, marked as such: random weights are rarely right), filters,
# rows with the prompt masked, a short LoRA run, the merge.
RFT = $(OUT)/rft
train-rft: engine-env build-env
	rm -rf $(RFT) && mkdir -p $(RFT)
	$(EPY) -m build.tiny --arch qwen3 --out $(RFT)/base
	$(EPY) -m training.traces --model $(RFT)/base --profile cpu-tiny --tasks $(ARC_DATA)/arc-agi-2/training \
	    --max-tasks 4 --attempts 2 --cap 64 --inject-known --out $(RFT)/traces.jsonl
	$(BPY) -m training.dataset --traces $(RFT)/traces.jsonl --tasks $(ARC_DATA)/arc-agi-2/training \
	    --model $(RFT)/base --out $(RFT)/rows.jsonl
	$(BPY) -m training.rft --config training/rft-tiny.toml
	$(BPY) -m training.rft --config training/rft-tiny.toml --merge

bench: env build-env
	$(PY) benchmarks/sandbox_throughput.py
	$(PY) benchmarks/sim_speed.py
	$(BPY) benchmarks/prune_and_calibrate.py
	$(BPY) benchmarks/quantize_throughput.py
	$(BPY) benchmarks/build_scale.py

clean:
	rm -rf $(OUT) .pytest_cache .hypothesis
