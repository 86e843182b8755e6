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
export ARC_DATA

.PHONY: env test demo bench clean

env: $(VENV)/.installed

$(VENV)/.installed: requirements/core.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements/core.txt
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
