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

.PHONY: env engine-env build-env unsloth-env vllm-gpu-wheel grid-dry-run both-dry-run prune-demo wheels bundle kaggle-rehearsal train-rft train-grid \
	test test-core test-kaggle-python conformance dry-run simulate demo corpus-demo corpus-sample bench grid-learn clean

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

# vLLM's GPU release, the locked wheel of kaggle-gpu-py311 (~340 MB), downloaded once into
# ~/.cache/arc-kit/wheels/vllm-0.33.0 and never installed: tests/test_vllm_v2.py reads its source, tests/test_pp_drafts.py
# runs it.
vllm-gpu-wheel: env
	$(PY) -m offline_wheels.source --target kaggle-gpu-py311 --package vllm

# The whole suite, the real engines included (vLLM's CPU build, transformers): the engine environment; then the
# checkpoint-surgery and training tests in the build environment (compressed-tensors' converter is newer than vLLM's
# pin) and the grid line's PEFT tests; then the unsloth backend's test in its own environment. The vLLM contract tests
# read the GPU release's wheel.
# tests/test_vllm_load_weights.py (engine environment) quantises its checkpoint with the build environment's python
test: export KIT_BUILD_PYTHON := $(BPY)
test: engine-env build-env unsloth-env vllm-gpu-wheel
	$(EPY) -m pytest -q tests
	$(BPY) -m pytest -q tests/test_prune.py tests/test_patch_eot.py tests/test_quantize.py tests/test_nvfp4.py tests/test_pipeline.py \
	    tests/test_rft.py tests/test_fused_groups.py tests/test_layerwise.py tests/test_build_scale.py \
	    tests/test_kaggle_upload.py tests/test_kaggle_rehearsal.py tests/test_dense_qwen3_5.py
	$(BPY) -m pytest -q tests/test_grid_ttt.py tests/test_grid_oom.py tests/test_grid_workers.py tests/test_grid_nvarc.py \
	    tests/test_grid_tune.py tests/test_grid_resume.py tests/test_grid_both.py tests/test_corpus_mix.py \
	    tests/test_corpus_ray.py tests/test_benchmarks.py tests/test_grid_learns.py
	$(UPY) -m pytest -q tests/test_rft.py tests/test_grid_tune.py tests/test_grid_ttt.py -k unsloth

# The Kaggle rehearsal (tests/test_kaggle_rehearsal.py, also in make test): the CPU bundle uploaded by the real Kaggle
# client (intercepted at the network call), mounted read-only with the network cut, the notebook's cells run as Kaggle
# runs them (commit run, then the rerun), and the failure matrix. FULL=1 gives every row its own fresh install.
kaggle-rehearsal: build-env
	ARC_KIT_REHEARSAL_FULL=$(if $(FULL),1,0) $(BPY) -m pytest -q tests/test_kaggle_rehearsal.py

# docs/conformance.md from the tables in docs/conformance/*.toml (tests/test_conformance.py fails while it is stale);
# `$(PY) -m conformance --check` lists every disagreement between a table and its run instead.
conformance: env
	$(PY) -m conformance

# The suite without the engine environment (engine tests skip).
test-core: env
	$(PY) -m pytest -q tests

# What the bundle runs in the Kaggle box, on a second Python version (CI's run on 3.12: Kaggle images use 3.11 and
# 3.12): test-core without the host-only tools' tests (the training corpus, RFT, the simulator, the conformance pages),
# which run on the user's machine, never in the box, and are tested on the default Python by make test.
HOST_ONLY_TESTS := $(wildcard tests/test_corpus*.py tests/test_sim*.py tests/test_training_*.py tests/test_rft*.py \
                              tests/test_conformance.py)
test-kaggle-python: env
	$(PY) -m pytest -q tests $(addprefix --ignore=,$(HOST_ONLY_TESTS))

# The solver end to end on a fresh machine: a tiny random-weight Qwen3 and a local tokenizer, 10 ARC-AGI-2
# evaluation tasks under a 3-minute deadline, the answer file and the attempt log; the closing summary scores it.
# ENGINE=vllm runs the production engine (vLLM's CPU build, profile cpu-tiny-vllm) into out/dry-run-vllm; its deadline
# is longer because the engine's start (1-4 minutes on a busy 2-core machine) counts against it.
ENGINE ?= hf
DRY_PROFILE  := $(if $(filter vllm,$(ENGINE)),cpu-tiny-vllm,cpu-tiny)
DRY_OUT      := $(OUT)/dry-run$(if $(filter vllm,$(ENGINE)),-vllm)
DRY_DEADLINE := $(if $(filter vllm,$(ENGINE)),420,180)
dry-run: engine-env
	rm -rf $(DRY_OUT)  # a fresh run each time: the solver refuses to append to an earlier run's log
	$(EPY) -m build.models.tiny --arch qwen3 --out $(OUT)/tiny-qwen3
	$(EPY) -m submission.main --tasks $(ARC_DATA)/arc-agi-2/evaluation --max-tasks 10 --profile $(DRY_PROFILE) \
	    --model $(OUT)/tiny-qwen3 --deadline $(DRY_DEADLINE) --out $(DRY_OUT)/submission.json \
	    --log $(DRY_OUT)/attempts.jsonl

# The grid line end to end on CPU: a tiny random-weight Qwen3 cut to 16 tokens, a small adapter fine-tuned on it
# (training.grid_tune: 2 ARC-AGI-2 training tasks, 8 steps) and loaded on it as the run loads one (--adapter), two
# worker processes, 10 ARC-AGI-2 evaluation tasks under a 5-minute deadline (README: the grid line). GRID_FORMAT=nvarc
# gives the cut NVARC's published tokenizer files (tests/nvarc_tokenizer) in place of the kit's and runs the tuning
# and the run through the nvarc format.
GRID_FORMAT ?= kit16
grid-dry-run: build-env
	rm -rf $(OUT)/grid-dry-run $(OUT)/tiny-grid
	$(BPY) -m build.models.tiny --arch qwen3 --out $(OUT)/tiny-qwen3-base
	$(BPY) -m build.models.grid_vocab --model $(OUT)/tiny-qwen3-base --out $(OUT)/tiny-grid
	$(if $(filter nvarc,$(GRID_FORMAT)),rm -f $(OUT)/tiny-grid/tokenizer*.json $(OUT)/tiny-grid/special_tokens_map.json \
	    && cp tests/nvarc_tokenizer/*.json tests/nvarc_tokenizer/*.j2 $(OUT)/tiny-grid/)
	$(BPY) -m training.grid_tune --model $(OUT)/tiny-grid --format $(GRID_FORMAT) --dtype float32 \
	    --tasks $(ARC_DATA)/arc-agi-2/training --max-tasks 2 --steps 8 --checkpoint-every 8 --rank 8 --lr 3e-3 \
	    --max-len 2048 --out $(OUT)/grid-dry-run/tune
	$(BPY) -m submission.grid.main --tasks $(ARC_DATA)/arc-agi-2/evaluation --max-tasks 10 --profile grid-tiny \
	    --format $(GRID_FORMAT) --model $(OUT)/tiny-grid --adapter $(OUT)/grid-dry-run/tune/adapter --deadline 300 \
	    --out $(OUT)/grid-dry-run/submission.json --log $(OUT)/grid-dry-run/attempts.jsonl \
	    --solutions $(ARC_DATA)/arc-agi-2/evaluation

# Both lines in one run on CPU (profiles/both-tiny.toml): the reasoning line's tiny model on the hf engine and one
# grid-line worker, each in its own environment, one merged answer file (README: both lines in one run).
both-dry-run: engine-env build-env
	rm -rf $(OUT)/both-dry-run
	$(EPY) -m build.models.tiny --arch qwen3 --out $(OUT)/tiny-qwen3
	$(BPY) -m build.models.tiny --arch qwen3 --out $(OUT)/tiny-qwen3-base
	$(BPY) -m build.models.grid_vocab --model $(OUT)/tiny-qwen3-base --out $(OUT)/tiny-grid
	$(EPY) -m submission.both --tasks $(ARC_DATA)/arc-agi-2/evaluation --max-tasks 10 --profile both-tiny \
	    --reasoning-model $(OUT)/tiny-qwen3 --grid-model $(OUT)/tiny-grid --reasoning-python $(EPY) \
	    --grid-python $(BPY) --deadline 300 --out $(OUT)/both-dry-run/submission.json \
	    --solutions $(ARC_DATA)/arc-agi-2/evaluation

# The core end to end without a model: the shipped example programs over ARC-AGI-2 training, scored.
demo: env
	$(PY) -m submission.sandbox.library --tasks $(ARC_DATA)/arc-agi-2/training --programs examples/programs \
	    --out $(OUT)/demo/submission.json

# Forecast a 12-hour hidden-set run (240 tasks) of the moe-4xL4 profile from the shipped example log (synthetic:
# see sim/example_log.py), compare it with dense-27b-4xL4 and with first-in first-out second attempts; prints the scenario it assumed, writes the report, its JSON,
# the median run's timeline and the forecast's distribution.
simulate: env
	$(PY) -m sim forecast --log sim/data/example_attempts.jsonl --tasks $(ARC_DATA)/arc-agi-2/evaluation \
	    --profile moe-4xL4 --hidden-tasks 240 --runs 50 --sensitivity --sweep dense-27b-4xL4 --compare-fifo --out $(OUT)/simulate \
	    --json $(OUT)/simulate/forecast.json

# A generated corpus (make corpus-demo) mixed into the tasks of prune-demo's calibration traces, train-rft's traces and
# train-grid's rows (training/corpus/mix.py): e.g. make train-rft CORPUS_MIX=out/corpus-demo. Its share of the tasks is
# the [corpus] fraction of training/rft-tiny.toml, the demos' one corpus table. Unset (the default): real tasks only.
CORPUS_MIX ?=
CORPUS_MIX_ARGS = $(if $(CORPUS_MIX),--config training/rft-tiny.toml --corpus $(CORPUS_MIX))

# Expert pruning end to end on a tiny Qwen3-MoE: traces from real ARC tasks through the solver's prompt renderer,
# routing statistics, expert lists and their report, the pruned checkpoint.
# With TOPOLOGY=qwen3-next-80b (or qwen3-30b-a3b): the real model's tensors at tiny widths (build.models.topology), and
# every step at that scale: calibrate (layer by layer) -> lists -> prune -> quantise -> patch -> likelihood check, each
# step's time and peak memory printed. Its quantising step uses the kit's NVFP4 recipe: the topology's tiny widths (32
# and 16) cannot fill the study's W4A16 groups of 128 (build/recipes/moe-4xL4.toml refuses them).
PD = $(OUT)/prune-demo
PD_RECIPE = build/recipes/moe-4xL4-nvfp4.toml
TOPOLOGY ?=
TIMED = /usr/bin/time -f "  -> %e s, peak RSS %M kB"
prune-demo: build-env
	rm -rf $(PD) && mkdir -p $(PD)
ifeq ($(TOPOLOGY),)
	$(BPY) -m build.models.tiny --arch qwen3_moe --out $(PD)/model --max-shard-size 300KB
	$(BPY) -m training.calibration_traces --model $(PD)/model --tasks $(ARC_DATA)/arc-agi-2/training --max-tasks 24 \
	    --out $(PD)/traces.jsonl $(CORPUS_MIX_ARGS)
	$(BPY) -m build.prune.calibrate --model $(PD)/model --traces $(PD)/traces.jsonl --out $(PD)/stats.npz
	$(BPY) -m build.prune.experts --stats $(PD)/stats.npz --config build/lists-tiny.toml --out $(PD)/lists
	$(BPY) -m build.prune --model $(PD)/model --list $(PD)/lists/c1.json --out $(PD)/pruned
	@echo "pruned checkpoint: $(PD)/pruned (provenance in $(PD)/pruned/pruning.json)"
else
	$(TIMED) $(BPY) -m build.models.tiny --topology $(TOPOLOGY) --out $(PD)/model
	$(TIMED) $(BPY) -m training.calibration_traces --model $(PD)/model --tasks $(ARC_DATA)/arc-agi-2/training --max-tasks 4 \
	    --thinking 0 --out $(PD)/traces.jsonl $(CORPUS_MIX_ARGS)
	$(TIMED) $(BPY) -m build.prune.calibrate --model $(PD)/model --traces $(PD)/traces.jsonl --out $(PD)/stats.npz
	$(TIMED) $(BPY) -m build.prune.experts --stats $(PD)/stats.npz --config build/lists.toml --out $(PD)/lists
	$(TIMED) $(BPY) -m build.prune --model $(PD)/model --list $(PD)/lists/c8.json --out $(PD)/pruned
	$(TIMED) $(BPY) -m build.quantize --model $(PD)/pruned --recipe $(PD_RECIPE) \
	    --out $(PD)/quantized --no-report
	$(TIMED) $(BPY) -m build.patch_eot --model $(PD)/quantized --out $(PD)/patched
	$(TIMED) $(BPY) -m build.check_quality --reference $(PD)/pruned --candidate $(PD)/patched \
	    --traces $(PD)/traces.jsonl --recipe $(PD_RECIPE)
endif

# The locked wheels of a bundle target, downloaded into ~/.cache/arc-kit/wheels/TARGET and checked against
# offline_wheels/locks/TARGET.txt.
TARGET ?= cpu-py311
wheels: env
	$(PY) -m offline_wheels.lock --target $(TARGET) --fetch

# The offline Kaggle dataset, built as the profile's [build] section says. By default the CPU demo: a tiny Qwen3 for
# the cpu-tiny profile. For a real model: make bundle PROFILE=moe-4xL4 MODEL=/ckpt LIST=lists/c8.json
# (TARGET=, RECIPE=, CALIBRATION_TASKS= override the profile). A combined profile takes both models:
# make bundle PROFILE=both-4xL4 MODEL=/reasoning-ckpt GRID_MODEL=/nvarc-4b ADAPTER=/ckpt-adapter. ADAPTER= bundles
# the grid line's fine-tuned adapter (training.grid_tune's out/adapter) inside its model, where the profile's
# model.adapter names it (grid-4b-4xL4, and so both-4xL4, needs it).
# COMPETITION= names the competition whose mount (/kaggle/input/<slug>/) boot reads the tasks from (default
# arc-prize-2025).
PROFILE ?= cpu-tiny
BUNDLE_ARGS = $(if $(filter command line,$(origin TARGET)),--target $(TARGET)) $(if $(MODEL),--model $(MODEL)) \
	$(if $(GRID_MODEL),--grid-model $(GRID_MODEL)) $(if $(ADAPTER),--adapter $(ADAPTER)) \
	$(if $(LIST),--list $(LIST)) $(if $(RECIPE),--recipe $(RECIPE)) \
	$(if $(CALIBRATION_TASKS),--calibration-tasks $(CALIBRATION_TASKS)) $(if $(ID),--id $(ID)) \
	$(if $(COMPETITION),--competition $(COMPETITION))
bundle: build-env
	rm -rf $(OUT)/bundle
	$(BPY) -m build.pipeline --profile $(PROFILE) --out $(OUT)/bundle $(strip $(BUNDLE_ARGS))

# Rejection-sampling fine-tuning end to end on the tiny model: traces sampled with the hf engine on 4 ARC training
# tasks (plus one injected known-correct trace per input, marked as such: random weights are rarely right), filters,
# rows with the prompt masked (RFT v1: thinking + grid targets), a short LoRA run, the merge.
RFT = $(OUT)/rft
train-rft: engine-env build-env
	rm -rf $(RFT) && mkdir -p $(RFT)
	$(EPY) -m build.models.tiny --arch qwen3 --out $(RFT)/base
	$(EPY) -m training.traces --model $(RFT)/base --profile cpu-tiny --tasks $(ARC_DATA)/arc-agi-2/training \
	    --max-tasks 4 --attempts 2 --cap 64 --inject-known --out $(RFT)/traces.jsonl $(CORPUS_MIX_ARGS)
	$(BPY) -m training.dataset --traces $(RFT)/traces.jsonl --tasks $(ARC_DATA)/arc-agi-2/training \
	    --model $(RFT)/base --out $(RFT)/rows.jsonl
	$(BPY) -m training.rft --config training/rft-tiny.toml
	$(BPY) -m training.rft --config training/rft-tiny.toml --merge

# Continued fine-tuning of the grid model on the tiny demo model: rows from 4 labelled ARC-AGI-2 training tasks in 16
# views each, a short LoRA run checkpointed every 4 steps (a second run resumes), the merge. $(GT)/run/adapter is what
# the solver loads on the base (submission.grid.main --adapter; --merge, or $(GT)/run/merged, for the merged form).
# Real runs: README.
GT = $(OUT)/train-grid
train-grid: build-env
	rm -rf $(GT) && mkdir -p $(GT)
	$(BPY) -m build.models.tiny --arch qwen3 --out $(GT)/base
	$(BPY) -m build.models.grid_vocab --model $(GT)/base --out $(GT)/grid
	$(BPY) -m training.grid_tune --model $(GT)/grid --tasks $(ARC_DATA)/arc-agi-2/training --max-tasks 4 \
	    --out $(GT)/run --steps 16 --checkpoint-every 4 --rank 8 --lr 3e-3 --max-len 2048 $(CORPUS_MIX_ARGS)
	$(BPY) -m training.grid_tune --model $(GT)/grid --out $(GT)/run --merge

# Synthetic ARC tasks from typed rules (training/corpus/README.md): seven families and depth-2 composites, gated as Ray
# tasks on a local Ray of both cores (each command starts and stops it), then audited against $(ARC_DATA) the same
# way. Prints the admission and gate rates per depth; writes corpus.png. Killed, the same command continues from its
# last complete shard (make clean, or another CORPUS, to start afresh). RAY_ADDRESS=host:port runs both on a cluster
# started with `ray start --head`.
CORPUS = $(OUT)/corpus-demo
CORPUS_RAY = --workers 2 $(if $(RAY_ADDRESS),--address $(RAY_ADDRESS))
corpus-demo: build-env
	$(BPY) -m training.corpus generate --rules 56 --depth 2 --tasks-per-rule 4 --tries 2 --seed 0 $(CORPUS_RAY) \
	    --out $(CORPUS)
	$(BPY) -m training.corpus audit $(CORPUS) --arc-data $(ARC_DATA) $(CORPUS_RAY)

# A 200-task sample of a fresh corpus (every family, depth 2), filtered by difficulty and ordered as a curriculum
# (training/corpus/curriculum.py), then checked: no no-op or 1x1-only test pair, no stage the demonstrations do not
# show, nothing beyond the filter (exit 1 on a finding). Killed, the generate step continues from its checkpoints.
CORPUS_SAMPLE = $(OUT)/corpus-sample
corpus-sample: build-env
	$(BPY) -m training.corpus generate --rules 64 --depth 2 --tasks-per-rule 3 --tries 2 --seed 1 $(CORPUS_RAY) \
	    --out $(CORPUS_SAMPLE)/corpus
	rm -rf $(CORPUS_SAMPLE)/sample
	$(BPY) -m training.corpus.curriculum sample --corpus $(CORPUS_SAMPLE)/corpus --out $(CORPUS_SAMPLE)/sample --tasks 200
	$(BPY) -m training.corpus.curriculum check $(CORPUS_SAMPLE)/sample

# The grid line learns at CPU scale (issue 45 section 5; benchmarks/grid_learn.py, not in CI or make bench: minutes to
# half an hour on 2 cores): a tiny kit16 model pre-trained from random weights by training.grid_tune on a small corpus
# and ARC-AGI-1 training, then submission.main on held-out panels under four variants (no TTT, TTT, TTT + rescoring,
# unseeded search), scored; fails when the task's training adds no right answer. GRID_LEARN_ARGS grows it
# (e.g. --steps 3000 --eval-tasks 20 --task-s 60); benchmarks/RESULTS.md has the recorded run and its command.
GRID_LEARN_ARGS ?=
grid-learn: build-env
	$(BPY) benchmarks/grid_learn.py --out $(OUT)/grid-learn $(GRID_LEARN_ARGS)

# Every benchmark runs (each prints its ratios and targets); the verb fails at the end if any missed a target.
MISSED = $(OUT)/bench-missed.txt
bench: env build-env engine-env
	@mkdir -p $(OUT) && rm -f $(MISSED)
	$(PY) benchmarks/sandbox_throughput.py || echo sandbox_throughput >> $(MISSED)
	$(PY) benchmarks/sandbox_real_programs.py || echo sandbox_real_programs >> $(MISSED)
	$(PY) benchmarks/sim_speed.py || echo sim_speed >> $(MISSED)
	$(BPY) benchmarks/prune_and_calibrate.py || echo prune_and_calibrate >> $(MISSED)
	$(BPY) benchmarks/quantize_throughput.py || echo quantize_throughput >> $(MISSED)
	$(BPY) benchmarks/grid_throughput.py || echo grid_throughput >> $(MISSED)
	$(BPY) benchmarks/grid_search.py || echo grid_search >> $(MISSED)
	OMP_NUM_THREADS=1 $(BPY) benchmarks/grid_search.py --lockstep || echo grid_search_lockstep >> $(MISSED)
	$(BPY) benchmarks/grid_ttt.py || echo grid_ttt >> $(MISSED)
	$(BPY) benchmarks/build_scale.py || echo build_scale >> $(MISSED)
	$(PY) benchmarks/corpus_admission.py || echo corpus_admission >> $(MISSED)
	$(BPY) benchmarks/corpus_scaling.py || echo corpus_scaling >> $(MISSED)
	$(EPY) benchmarks/v2_processor.py || echo v2_processor >> $(MISSED)
	$(EPY) benchmarks/engine_overhead.py || echo engine_overhead >> $(MISSED)
	@if [ -f $(MISSED) ]; then echo "missed a target or failed: $$(tr '\n' ' ' < $(MISSED))"; exit 1; fi

clean:
	rm -rf $(OUT) .pytest_cache .hypothesis
