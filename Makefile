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
export ARC_DATA

.PHONY: env engine-env test demo bench clean

env: $(VENV)/.installed

$(VENV)/.installed: requirements/core.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements/core.txt
	touch $@

engine-env: $(ENGINE_VENV)/.installed

# torch first, alone: with no torch installed, a dependency asking for a torch range could pull a CUDA build.
$(ENGINE_VENV)/.installed: requirements/core.txt requirements/engine-cpu.txt
	$(PYTHON) -m venv $(ENGINE_VENV)
	$(EPY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(EPY) -m pip install --quiet --disable-pip-version-check -r requirements/engine-cpu.txt
	$(EPY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

test: env
	$(PY) -m pytest -q tests

# The core end to end without a model: the shipped example programs over ARC-AGI-2 training, scored.
demo: env
	$(PY) -m submission.library --tasks $(ARC_DATA)/arc-agi-2/training --programs examples/programs \
	    --out $(OUT)/demo/submission.json

bench: env
	$(PY) benchmarks/sandbox_throughput.py

clean:
	rm -rf $(OUT) .pytest_cache .hypothesis
