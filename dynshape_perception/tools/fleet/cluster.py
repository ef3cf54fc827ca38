"""Ray for the fleet tools: an embedded instance or an existing cluster, and the dispatch loop."""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import psutil
from tqdm import tqdm

from dynshape_perception.errors import ConfigError
from dynshape_perception.tools.fleet import task
from dynshape_perception.tools.fleet.task import FAILED, ReplayJob
from dynshape_perception.tools.replay.params import Value

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install -r requirements-fleet.txt (or the package's 'fleet' extra)"
# Small: bags are read in place by path and outcomes are a few kB, so the object store only
# carries task arguments and results.
OBJECT_STORE_BYTES = 100 * 1024 * 1024
WAIT_S = 0.5
# How long the embedded instance's processes get to leave after ray.shutdown() before they
# are killed.
END_GRACE_S = 5.0


@dataclass(frozen=True)
class RayOptions:
    """``address`` None starts Ray embedded in this process with ``workers`` CPUs."""

    address: str | None = None
    workers: int | None = None
    retries: int = 3


def _token_auth_for_embedded() -> None:
    """An embedded instance gets token authentication with a token of its own, passed to
    its processes in the environment: nothing is written to ~/.ray. Set before Ray is
    imported, which reads the mode once."""
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    if os.environ["RAY_AUTH_MODE"] == "token" and not (
        os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
    ):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(16)


def check_options(options: RayOptions) -> None:
    if options.workers is not None and options.workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {options.workers}")
    if options.workers is not None and options.address is not None:
        raise ConfigError("--workers sizes the embedded Ray; a cluster has its own CPUs")
    if options.retries < 0:
        raise ConfigError(f"--retries must be >= 0, got {options.retries}")


@contextmanager
def ray_session(options: RayOptions) -> Iterator[Any]:
    """``ray`` connected to the cluster at ``options.address``, or to an embedded instance
    that is shut down (its processes ended) on leaving, Ctrl-C included."""
    check_options(options)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if options.address is None:
        _token_auth_for_embedded()
    try:
        import ray
    except ImportError as err:
        raise ConfigError(f"the fleet tools need Ray: {INSTALL_HINT}") from err
    common: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
    before = _children()
    try:
        if options.address is None:
            ray.init(
                num_cpus=options.workers or os.cpu_count() or 1,
                include_dashboard=False,
                object_store_memory=OBJECT_STORE_BYTES,
                _node_ip_address="127.0.0.1",
                **common,
            )
        else:
            ray.init(address=options.address, **common)
    except (ConnectionError, RuntimeError, ValueError) as err:
        _shutdown(ray, before)
        where = "an embedded Ray" if options.address is None else f"Ray at {options.address}"
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"cannot start or join {where}: {first}") from err
    except BaseException:
        # Ctrl-C during start-up: the processes started so far go too.
        _shutdown(ray, before)
        raise
    try:
        yield ray
    finally:
        _shutdown(ray, before)


def _children() -> dict[int, psutil.Process]:
    try:
        return {p.pid: p for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return {}


def _shutdown(ray: Any, before: dict[int, psutil.Process]) -> None:
    """``ray.shutdown()``, then SIGKILL for what the embedded instance started and left
    running: a worker blocked in a read (a hung network mount, a FIFO) never reaches Ray's
    own exit path, and it would hold this process's stdout open."""
    started = [p for pid, p in _children().items() if pid not in before]
    ray.shutdown()
    _, alive = psutil.wait_procs(started, timeout=END_GRACE_S)
    for proc in alive:
        log.warning("killing Ray process %d, still running after shutdown", proc.pid)
        try:
            proc.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(alive, timeout=END_GRACE_S)


def cluster_info(ray: Any) -> dict[str, Any]:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return {
        "nodes": [
            {
                "node_id": n["NodeID"],
                "address": n["NodeManagerAddress"],
                "cpus": n.get("Resources", {}).get("CPU", 0),
            }
            for n in nodes
        ],
        "cpus": sum(n.get("Resources", {}).get("CPU", 0) for n in nodes),
    }


def _failure(job: ReplayJob, err: BaseException) -> dict[str, Any]:
    text = " ".join(str(err).split()) or type(err).__name__
    outcome = task.BagOutcome(
        job.entry.name,
        str(job.entry.path),
        FAILED,
        f"{type(err).__name__}: {text[:500]}",
        tags=job.entry.tags,
    )
    return outcome.as_dict()


def warm_up(ray: Any, spec: task.EngineSpec, values: Mapping[str, Value]) -> dict[str, Any]:
    """One task builds an engine first, so that the cache holds every compiled model before
    the work fans out and no two workers compile the same model at once."""
    remote = ray.remote(num_cpus=1, max_retries=1)(task.warm_engine)
    result: dict[str, Any] = ray.get(remote.remote(spec, dict(values)))
    return result


def dispatch(
    ray: Any,
    jobs: Sequence[ReplayJob],
    retries: int,
    on_done: Callable[[dict[str, Any]], None],
    max_in_flight: int | None = None,
    progress: tqdm[Any] | None = None,
) -> list[dict[str, Any]]:
    """Each job as one Ray task (retried when its worker dies); outcomes in job order.

    Ctrl-C propagates as it comes: tasks are not cancelled one by one (a cancel that races
    a task's completion can abort Ray's driver), since Ray ends every task of a driver that
    leaves, and the embedded instance is shut down whole.
    """
    remote = ray.remote(num_cpus=1, max_retries=retries)(task.replay_bag)
    pending = list(enumerate(jobs))
    running: dict[Any, tuple[int, ReplayJob]] = {}
    outcomes: dict[int, dict[str, Any]] = {}
    limit = max_in_flight or len(jobs)
    while pending or running:
        while pending and len(running) < limit:
            index, job = pending.pop(0)
            job = _stamped(job)
            running[remote.remote(job)] = (index, job)
        ready, _ = ray.wait(list(running), num_returns=1, timeout=WAIT_S)
        for ref in ready:
            index, job = running.pop(ref)
            try:
                outcome = ray.get(ref)
            except ray.exceptions.RayError as err:
                outcome = _failure(job, err)
            outcome["timing"]["received_s"] = round(time.time(), 6)
            outcomes[index] = outcome
            on_done(outcome)
            if progress is not None:
                progress.update(1)
    return [outcomes[i] for i in range(len(jobs))]


def _stamped(job: ReplayJob) -> ReplayJob:
    return replace(job, submitted_s=time.time())
