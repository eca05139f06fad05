# rn50perf: `make train` runs the default MLPerf run, `make test` runs the tests; both set up .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PILLOW_SIMD := pillow-simd==12.1.1.post0
STAMP := $(VENV)/.installed

.PHONY: train test test-all lint clean-venv

train: $(STAMP)
	$(PY) train.py $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" $(ARGS)

test-all: $(STAMP)
	$(PY) -m pytest -q $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

# torchvision pulls in stock Pillow; swap it for pillow-simd built from source with AVX2.
$(STAMP): requirements.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip uninstall -q -y pillow
	CC="cc -mavx2" $(PY) -m pip install -q --no-deps --no-binary pillow-simd --force-reinstall $(PILLOW_SIMD)
	$(PY) -c "import PIL.features, sys; sys.exit(not PIL.features.check('jpg'))"
	touch $(STAMP)

clean-venv:
	rm -rf $(VENV)
