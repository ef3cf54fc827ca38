"""Fixtures of the integration tests: weights, a shared artefact cache, node overrides, the scan,
one node with a probe."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.errors import WeightsError
from dynshape_perception.io.datasets import read_kitti_bin
from dynshape_perception.models import MODEL_NAMES, model_definition
from dynshape_perception.models.registry import committed_weights, parameter_shapes
from dynshape_perception.models.weights import init_weights, save_weights
from dynshape_perception.resources import config_path
from dynshape_perception.testing.probe import Probe, probe_session
from dynshape_perception.testing.processes import NodeProcess, dds_env, domain_lease, start_node

# Diagnostics often enough that a test sees a counter move within a fraction of a second.
DIAGNOSTICS_PERIOD_S = 0.2
INIT_SEED = 0
FULL_FAR_FIELD = 1.0


@pytest.fixture(scope="session")
def weights_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The committed weights (""), or, until they are fitted, seeded initial weights in the
    same checksummed manifest format, loaded by the nodes through ``weights_dir``."""
    try:
        for name in MODEL_NAMES:
            committed_weights(name)
        return ""
    except WeightsError:
        folder = tmp_path_factory.mktemp("weights")
        for name in MODEL_NAMES:
            shapes = parameter_shapes(model_definition(name))
            entry = {"model": name, "fit": f"init_weights(seed={INIT_SEED}) for tests"}
            save_weights(name, init_weights(shapes, INIT_SEED), entry, folder)
        return str(folder)


@pytest.fixture(scope="session")
def node_overrides(
    weights_dir: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, bool | int | float | str]:
    return {
        "weights_dir": weights_dir,
        "model_cache_dir": str(tmp_path_factory.mktemp("artefacts")),
        "diagnostic_updater.period": DIAGNOSTICS_PERIOD_S,
        "debug.publish_tables": True,
        # A deadline missed on a busy test machine puts the executor in degraded mode,
        # which would subsample the far field of the next frames: the tests that compare
        # tracks across frames need the whole cloud whatever the timing.
        "tiers.far_field_keep_fraction": FULL_FAR_FIELD,
        # Likewise a loaded CI machine may shed a frame's tier-2 work, and the tests that
        # wait for every frame's outputs would then time out. Shedding itself is tested in
        # test/scheduling and test/nodes/test_tiered.py.
        "tiers.shed_expired": False,
        "tiers.shed_infeasible": False,
        # The tests stamp frames on a timeline of their own, seconds apart between tests and
        # unrelated to the nodes' clock: each jump is taken at once. Held-back jumps are
        # tested in test/nodes/test_node_inputs.py and test/perception/test_stamps.py.
        "stamps.jump_confirm_frames": 1,
    }


@pytest.fixture(scope="session")
def kitti_points(kitti_bin: Path) -> np.ndarray:
    return read_kitti_bin(kitti_bin)


@contextmanager
def _node_with_probe(
    executable: str,
    log_dir: Path,
    overrides: Mapping[str, bool | int | float | str],
    graph: tuple[Mapping[str, int], Mapping[str, int]],
    startup_s: float,
    prepare: Callable[[Probe], None] | None = None,
) -> Iterator[tuple[NodeProcess, Probe]]:
    """``executable`` with the x86_dev parameters and ``overrides`` on a domain of its own, and
    a probe there, ready once the graph holds ``graph`` (subscribers, publishers by topic);
    ``prepare`` gives the probe its own endpoints first. Stopped with SIGINT, it must exit 0."""
    with domain_lease() as domain:
        proc = start_node(
            executable,
            env=dds_env(domain),
            log_dir=log_dir,
            params_file=config_path("x86_dev.param.yaml"),
            overrides=overrides,
        )
        try:
            with probe_session(domain) as probe:
                if prepare is not None:
                    prepare(probe)
                up = probe.wait_for_graph(*graph, startup_s)
                assert up, proc.log()[-2000:]
                yield proc, probe
        finally:
            assert proc.stop(signal.SIGINT) == 0, proc.log()[-2000:]


@pytest.fixture(scope="session")
def node_with_probe() -> Callable[..., AbstractContextManager[tuple[NodeProcess, Probe]]]:
    """``node_with_probe(executable, log_dir, overrides, graph, startup_s, prepare=None)``: a
    context manager of one node and a probe on a domain of their own."""
    return _node_with_probe
