"""Shared fixtures: the real data in ../shared/data (skipped when absent, required under CI)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil
import pytest

from dynshape_perception.resources import PACKAGE, shared_data_dir
from dynshape_perception.testing.processes import clean_dds_shared_memory, dds_settings

if TYPE_CHECKING:
    from dynshape_perception.runtime.engine import Engine

# Fast DDS reads its transports and profile once per process, when the first participant of
# any test starts: set here, before every test, so that no order of tests leaves this process
# without the large-data transport (clouds would then never reach an in-process probe).
for _key, _value in dds_settings().items():
    os.environ.setdefault(_key, _value)
# The venv is an ament prefix of the package (make ros-deps): make and the venv's activate
# export it for launch files and FindPackageShare; a bare .venv/bin/pytest gets it here.
if (Path(sys.prefix) / "share" / "ament_index" / "resource_index" / "packages" / PACKAGE).is_file():
    os.environ.setdefault("AMENT_PREFIX_PATH", sys.prefix)


def pytest_sessionstart(session: pytest.Session) -> None:
    """What a run that was itself killed (a timeout) left in shared memory goes first."""
    clean_dds_shared_memory()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The nodes and commands the suite killed left their DDS shared memory: remove it."""
    clean_dds_shared_memory()


def _plain_loggers() -> None:
    """Importing launch (its pytest plugin does, and launch_testing again when it runs) makes
    every later logger a LaunchLogger that does not propagate, so the package's records would
    reach neither the root handlers nor caplog."""
    logging.setLoggerClass(logging.Logger)


_plain_loggers()


@pytest.fixture(autouse=True)
def plain_loggers() -> None:
    _plain_loggers()


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# A suite started in the background of a non-interactive shell inherits SIGINT ignored: the
# nodes and clusters its tests stop with Ctrl-C would then wait out their stop timeouts.
for _sig, _handler in (
    (signal.SIGINT, signal.default_int_handler),
    (signal.SIGTERM, signal.SIG_DFL),
):
    if signal.getsignal(_sig) is signal.SIG_IGN:
        signal.signal(_sig, _handler)


@pytest.fixture(autouse=True)
def stop_signal_dispositions() -> Iterator[None]:
    """A node's main run in this process ends by ignoring SIGINT and SIGTERM
    (interrupts.shutting_down). Ignored signals are inherited across exec: every process a
    later test started would then ignore Ctrl-C, and each stop would wait out its timeout."""
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    yield
    for sig, handler in saved.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("../shared/data is missing, and CI=true requires it")
        pytest.skip("../shared/data is absent")
    return path


@pytest.fixture(scope="session")
def kitti_bin(shared_data: Path) -> Path:
    return shared_data / "lidar" / "kitti_000008.bin"


@pytest.fixture(scope="session")
def eth_file(shared_data: Path) -> Path:
    return shared_data / "eth_ucy" / "biwi_eth.txt"


@pytest.fixture(scope="session")
def hotel_file(shared_data: Path) -> Path:
    return shared_data / "eth_ucy" / "biwi_hotel.txt"


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited child waits for the init process to reap it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _running(p)]


@pytest.fixture(scope="session")
def wait_gone() -> Callable[[list[int], float], list[int]]:
    """``wait_gone(pids, timeout_s)``: the pids still running (not zombies) after the wait."""
    return _wait_gone


@pytest.fixture(scope="session")
def prediction_metrics() -> frozenset[str]:
    """The errors a prediction report gives, each with its 95 % interval under ``ci95``."""
    return frozenset(
        {"minADE", "minFDE", "top1_ADE", "top1_FDE", "cv_ADE", "cv_FDE", "cv6_minADE", "cv6_minFDE"}
    )


@pytest.fixture(scope="session")
def prediction_keys(prediction_metrics: frozenset[str]) -> frozenset[str]:
    """Every key of a prediction report (as a library call or ``evaluate prediction --json``)."""
    return prediction_metrics | {
        "windows",
        "pedestrians",
        "ci95",
        "ratios",
        "calibration",
        "ranking",
        "breakdown",
    }


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One artefact cache for the whole session, so each model compiles once."""
    return tmp_path_factory.mktemp("artefacts")


# rosbag2 (Jazzy and later) records a service event topic with its service's request and
# response text as the schema (ros2msg, with a `---` between them) and the event type's name.
SERVICE_EVENT_TOPIC = "/planner/get_parameters/_service_event"
SERVICE_EVENT_TYPE = "rcl_interfaces/srv/GetParameters_Event"
_SERVICE_TEXT = (
    "# The names of the parameters to get.\nstring[] names\n---\n"
    "# Their values, in the order of the names.\nParameterValue[] values\n"
)
# The event type as rosidl generates it (IDL names the srv namespace, which .msg text cannot).
_EVENT_IDL = """
module rcl_interfaces { module srv {
  struct GetParameters_Request { sequence<string> names; };
  struct GetParameters_Response { sequence<rcl_interfaces::msg::ParameterValue> values; };
  struct GetParameters_Event {
    service_msgs::msg::ServiceEventInfo info;
    sequence<rcl_interfaces::srv::GetParameters_Request, 1> request;
    sequence<rcl_interfaces::srv::GetParameters_Response, 1> response;
  };
}; };
"""


@pytest.fixture
def service_event_bag(tmp_path: Path, storage: str) -> Path:
    """A bag as ``ros2 bag record --all-topics --all-services`` writes one, in ``storage``:
    three PointCloud2 clouds on ``/points`` and three service events on
    ``SERVICE_EVENT_TOPIC``, whose schema is the service's text (with its ``---``)."""
    return write_service_event_bag(tmp_path / f"recorded_{storage}", storage)


def write_service_event_bag(path: Path, storage: str, clouds: int = 3) -> Path:
    from rosbags.rosbag2 import Writer
    from rosbags.typesys import get_types_from_idl

    from dynshape_perception.io import bags, msgtypes

    store = msgtypes.typestore()
    events = get_typestore_copy(store)
    events.register(get_types_from_idl(_EVENT_IDL))
    value_text, _ = store.generate_msgdef("rcl_interfaces/msg/ParameterValue", ros_version=2)
    schema = f"{_SERVICE_TEXT}{'=' * 80}\nMSG: rcl_interfaces/msg/ParameterValue\n{value_text}"
    types = events.types
    rng = np.random.default_rng(4)
    with Writer(path, version=bags.BAG_VERSION, storage_plugin=bags.STORAGES[storage]) as writer:
        points = writer.add_connection("/points", bags.POINTCLOUD2, typestore=store)
        service = writer.add_connection(
            SERVICE_EVENT_TOPIC,
            SERVICE_EVENT_TYPE,
            msgdef=schema,
            rihs01=events.hash_rihs01(SERVICE_EVENT_TYPE),
        )
        for i in range(clouds):
            ns = 1_000_000_000 + i * 100_000_000
            cloud = rng.uniform(-20.0, 20.0, (6000, 4)).astype(np.float32)
            cloud[:, 3] = rng.uniform(0.0, 1.0, 6000)
            msg = bags.points_message(cloud, ns, "lidar")
            writer.write(points, ns, store.serialize_cdr(msg, bags.POINTCLOUD2))
            event = types[SERVICE_EVENT_TYPE](
                info=types["service_msgs/msg/ServiceEventInfo"](
                    event_type=0,
                    stamp=bags.time_msg(ns),
                    client_gid=np.zeros(16, np.uint8),
                    sequence_number=i,
                ),
                request=[types["rcl_interfaces/srv/GetParameters_Request"](names=["rate_hz"])],
                response=[],
            )
            writer.write(service, ns + 1, events.serialize_cdr(event, SERVICE_EVENT_TYPE))
    return path


def get_typestore_copy(store: Any) -> Any:
    from rosbags.typesys import Stores, get_typestore

    copy = get_typestore(Stores.EMPTY)
    copy.register(dict(store.fielddefs))
    return copy


@pytest.fixture(scope="session")
def engine() -> Iterator[Engine]:
    """The segmenter (committed weights) and the predictor (deterministic initial ones), on
    x86-64 with the JIT off."""
    from dynshape_perception.models import model_definition
    from dynshape_perception.models.registry import committed_weights, parameter_shapes
    from dynshape_perception.models.weights import init_weights
    from dynshape_perception.runtime.engine import Engine
    from dynshape_perception.runtime.policy import JitConfig

    models = ("segmenter", "predictor")
    # Equivalence does not depend on the weights, but a segmenter with random ones scores
    # too few obstacles in a scene for the streaming comparisons to show anything.
    weights = {n: init_weights(parameter_shapes(model_definition(n)), seed=0) for n in models}
    weights["segmenter"] = committed_weights("segmenter")[1]
    with Engine("x86_64", JitConfig(mode="off"), models=models, weights=weights) as eng:
        yield eng
