# rn50perf: `make train` runs the default MLPerf run, `make test` runs the tests; both set up .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PILLOW_SIMD := pillow-simd==12.1.1.post0
STAMP := $(VENV)/.installed
# The fused JPEG decoder, compiled here from source against Debian's libjpeg-turbo headers.
PY_INCLUDE := $(shell $(PYTHON) -c "import sysconfig; print(sysconfig.get_paths()['include'])")
EXT_SUFFIX := $(shell $(PYTHON) -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
JPEG_EXT := data/jpeg/_jpeg$(EXT_SUFFIX)
JPEG_CFLAGS := -O3 -mavx2 -fPIC -shared -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Werror

NPROC ?= 2

.PHONY: train train-dist submission test test-all test-hosts lint peers native clean-venv gpu-check gpu-wheels gpu-rehearse

train: $(STAMP) $(JPEG_EXT)
	$(PY) train.py $(ARGS)

# The same run on NPROC processes of this machine (gloo on the CPU, nccl with device=cuda).
train-dist: $(STAMP) $(JPEG_EXT)
	$(VENV)/bin/torchrun --standalone --nproc-per-node $(NPROC) train.py $(ARGS)

# A result set: five runs of one recipe (RECIPE: overrides; the embedded task by default) with seeds 1 to 5, back
# to back, then the MLCommons package of them and the checkers' verdicts (mlperf_logs/package.py).
ORG ?= rn50perf
SYSTEM ?= cpu_$(shell nproc)cores
SUBMISSION ?= submission
# The embedded task converges far faster than ResNet's reference convergence points (RCPs), which the RCP check
# rejects; for it the package checker runs with its --rcp-bypass (a warning for the review committee). A recipe
# given in RECIPE is checked in full.
PACKAGE_ARGS ?= $(if $(RECIPE),,--rcp-bypass)
submission: $(STAMP) $(JPEG_EXT)
	$(PY) train.py -m run.seed=1,2,3,4,5 hydra.sweep.dir=$(SUBMISSION)/runs 'hydra.sweep.subdir=seed$${run.seed}' $(RECIPE)
	$(PY) -m mlperf_logs.package --runs $(SUBMISSION)/runs/seed* --org $(ORG) --system $(SYSTEM) --out $(SUBMISSION)/package $(PACKAGE_ARGS)

test: $(STAMP) $(JPEG_EXT)
	$(PY) -m pytest -q -m "not slow" $(ARGS)

test-all: $(STAMP) $(JPEG_EXT)
	$(PY) -m pytest -q $(ARGS)

# The tests whose outcome rests on training dynamics (marked convergence), under three hosts' kernel choices:
# oneDNN and ATen dispatch by instruction set, so rounding differs between an AMX Xeon, an AVX-512 EPYC and an
# AVX2-only CPU. Each run prints its margins; a host without an instruction set runs its best one instead.
HOST_KERNELS := avx512:AVX512_CORE_AMX avx512:AVX512_CORE avx2:AVX2
test-hosts: $(STAMP) $(JPEG_EXT)
	@for kernels in $(HOST_KERNELS); do \
	  aten=$${kernels%%:*}; isa=$${kernels##*:}; echo "== ATEN_CPU_CAPABILITY=$$aten ONEDNN_MAX_CPU_ISA=$$isa"; \
	  ATEN_CPU_CAPABILITY=$$aten ONEDNN_MAX_CPU_ISA=$$isa $(PY) -m pytest -q -m convergence $(ARGS) || exit 1; \
	done

# ruff, then mypy over the library (everything but tests/ and bench/; pyproject.toml's [tool.mypy] lists it).
lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy

# The benchmarks' optional peers (NVIDIA DALI's CPU pipeline for bench.loader); never needed to train or test.
peers: $(STAMP)
	$(PY) -m pip install -q -r requirements-peers.txt

# torchvision pulls in stock Pillow; swap it for pillow-simd built from source with AVX2.
$(STAMP): requirements.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip uninstall -q -y pillow
	CC="cc -mavx2" $(PY) -m pip install -q --no-deps --no-binary pillow-simd --force-reinstall $(PILLOW_SIMD)
	$(PY) -c "import PIL.features, sys; sys.exit(not PIL.features.check('jpg'))"
	touch $(STAMP)

native: $(JPEG_EXT)

# JPEG_PREFIX: where libjpeg-turbo's headers and library lie; the GPU check points it at the Debian packages that
# `make gpu-wheels` unpacks into .gpu/jpeg/usr (the library then found by rpath).
JPEG_PREFIX ?= /usr
JPEG_PATHS := $(if $(filter /usr,$(JPEG_PREFIX)),,-I$(JPEG_PREFIX)/include -I$(JPEG_PREFIX)/include/x86_64-linux-gnu \
	-L$(JPEG_PREFIX)/lib/x86_64-linux-gnu -Wl,-rpath,$(abspath $(JPEG_PREFIX)/lib/x86_64-linux-gnu))

$(JPEG_EXT): data/jpeg/_jpeg.c
	@test -f $(JPEG_PREFIX)/include/jpeglib.h || { echo "error: libjpeg headers missing: apt-get install libjpeg62-turbo-dev"; exit 2; }
	cc $(JPEG_CFLAGS) -I$(PY_INCLUDE) $(JPEG_PATHS) $< -ljpeg -lm -o $@

# The decoder under AddressSanitizer and UBSan, built beside the normal one (which it never replaces), and the JPEG
# tests with the seeded fuzz run against it (FUZZ_EXAMPLES=30000 for a long run). Python loads it through
# RN50PERF_JPEG_EXT, with gcc's ASan runtime preloaded (the interpreter is not instrumented) and leak checks off
# (the interpreter leaks by design).
ASAN_EXT := build/asan/data/jpeg/_jpeg$(EXT_SUFFIX)
ASAN_CFLAGS := $(filter-out -O3,$(JPEG_CFLAGS)) -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer
ASAN_ENV := LD_PRELOAD="$$(cc -print-file-name=libasan.so)" ASAN_OPTIONS=detect_leaks=0 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 RN50PERF_JPEG_EXT=$(CURDIR)/$(ASAN_EXT)

.PHONY: native-asan fuzz-asan

native-asan: $(ASAN_EXT)

$(ASAN_EXT): data/jpeg/_jpeg.c
	@mkdir -p $(@D)
	cc $(ASAN_CFLAGS) -I$(PY_INCLUDE) $< -ljpeg -lm -o $@

fuzz-asan: $(STAMP) $(ASAN_EXT)
	$(ASAN_ENV) RN50PERF_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -p no:cacheprovider tests/test_jpeg.py tests/fuzz $(ARGS)

clean-venv:
	rm -rf $(VENV)

# The one-shot GPU check (bench/gpu/check.py), run first whenever a GPU is lent: on the GPU machine, with the
# folder .gpu that `make gpu-wheels` prepared carried along, `make gpu-check` writes gpu.json, gpu.md and the
# stages' logs into $OUT. Its Python is the machine's own (python3, with torch): no venv. The whole check no longer
# fits one call: the next session runs `make gpu-check ARGS="--preset feed"`, then ARGS="--preset step-variants".
GPU_OUT ?= $(if $(OUT),$(OUT),build/gpu-check)
gpu-check:
	$(PYTHON) -m bench.gpu.check --out $(GPU_OUT) $(ARGS)

# What the GPU machine lacks, for the check to carry (.gpu, under 2 MB): the pure-Python wheels of hydra-core,
# omegaconf, antlr4 (built here: PyPI has only its source), mlperf-logging and the SLURM launcher; Debian's
# libjpeg-turbo headers and library; and Python 3.12's headers, for a Python that comes without them.
GPU_WHEELS := hydra-core==1.3.8 omegaconf==2.3.1 mlperf-logging==4.1.68 hydra-submitit-launcher==1.2.0 submitit==1.5.4
# Python 3.12 as the GPU machine has it: pyenv's where the shim does not offer it, else python3.12 on the PATH.
GPU_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) python3.12)
gpu-wheels: .gpu/.ready

.gpu/.ready: Makefile
	rm -rf .gpu && mkdir -p .gpu/wheels .gpu/jpeg .gpu/include
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: -d .gpu/wheels $(GPU_WHEELS)
	$(PYTHON) -m pip wheel -q --no-deps -w .gpu/wheels antlr4-python3-runtime==4.9.3
	cd .gpu/jpeg && apt-get download -q libjpeg62-turbo libjpeg62-turbo-dev && for deb in *.deb; do dpkg -x $$deb .; done && rm *.deb
	cp -r "$$($(GPU_PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" .gpu/include/
	du -sh .gpu
	touch $@

# The check rehearsed here on the CPU, on the GPU machine's stack (.venv-gpu: requirements-gpu.txt under Python
# 3.12), at tiny sizes: every stage must end "ok", GPU-only figures "skipped" with the reason.
GPU_VENV := .venv-gpu
gpu-rehearse: .gpu/.ready $(GPU_VENV)/.installed
	$(GPU_VENV)/bin/python -m bench.gpu.check --tiny --budget 1800 --out build/gpu-rehearse $(ARGS)

$(GPU_VENV)/.installed: requirements-gpu.txt
	test -x $(GPU_VENV)/bin/python || $(GPU_PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install -q -r requirements-gpu.txt
	touch $@
