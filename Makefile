# Two commands on a fresh Debian machine with Python 3.11: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SYSTEM_PACKAGES := g++-aarch64-linux-gnu qemu-user-static debootstrap chromium
# DDS stays on this host; large clouds need Fast DDS' large-data transport.
export ROS_AUTOMATIC_DISCOVERY_RANGE ?= LOCALHOST
export FASTDDS_BUILTIN_TRANSPORTS ?= LARGE_DATA
# A 32 MB shared-memory segment: the 0.5 MB default drops clouds above ~32k points.
export FASTDDS_DEFAULT_PROFILES_FILE ?= $(CURDIR)/config/fastdds_profile.xml
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: demo test venv system-deps lint emu-aarch64 bench-extras clean

$(STAMP): requirements.txt requirements-dev.txt setup.py setup.cfg
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

venv: $(STAMP)

# Cross compiler, emulator and browser used by the aarch64, CUDA and report checks.
system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

demo: venv
	$(BIN)/dynshape-perception demo

lint: venv
	$(BIN)/ruff check dynshape_perception test launch
	$(BIN)/mypy dynshape_perception

test: venv system-deps lint
	$(BIN)/python -m pytest -q -p no:cacheprovider test

# Peers for `bench kernels`: PyTorch (CPU build), ONNX Runtime and ONNX, pinned.
bench-extras: venv
	$(BIN)/python -m pip install -q -r requirements-bench.txt

# Emulated aarch64 Python with the aarch64 TVM wheels, for `verify --target aarch64` (idempotent;
# .emu/aarch64, downloads cached in .emu/cache).
emu-aarch64: venv system-deps
	scripts/setup_aarch64_emu.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .hypothesis
