"""A corpus replayed on Ray: skip complete bags, fan the rest out, write summary and report."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from dynshape_perception.tools.fleet import results
from dynshape_perception.tools.fleet.cluster import (
    RayOptions,
    cluster_info,
    dispatch,
    ray_session,
    warm_up,
)
from dynshape_perception.tools.fleet.corpus import BagEntry
from dynshape_perception.tools.fleet.report import write_fleet_report
from dynshape_perception.tools.fleet.task import EngineSpec, ReplayJob, read_outcome
from dynshape_perception.tools.replay.params import Value


@dataclass(frozen=True)
class CorpusOptions:
    values: Mapping[str, Value] = field(default_factory=dict)
    engine: EngineSpec = field(default_factory=EngineSpec)
    storage: str = "mcap"
    max_frames: int | None = None
    redo: bool = False
    progress: bool = True


def make_jobs(entries: Sequence[BagEntry], run: Path, options: CorpusOptions) -> list[ReplayJob]:
    folder = results.bags_dir(run)
    return [
        ReplayJob(
            entry,
            (folder / entry.name).resolve(),
            dict(options.values),
            options.engine,
            options.storage,
            options.max_frames,
        )
        for entry in entries
    ]


def replay_corpus(
    corpus: str,
    entries: Sequence[BagEntry],
    run: Path,
    options: CorpusOptions,
    ray_options: RayOptions,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Replay every bag of ``entries`` not yet complete in ``run``; returns the summary."""
    run = Path(run)
    results.bags_dir(run).mkdir(parents=True, exist_ok=True)
    results.remove_stale_stages(run)
    jobs = make_jobs(entries, run, options)
    reused: dict[str, dict[str, Any]] = {}
    if not options.redo:
        for job in jobs:
            outcome = read_outcome(job.out_dir)
            if outcome is not None:
                reused[job.entry.name] = {**outcome.as_dict(), "reused": True}
    todo = [job for job in jobs if job.entry.name not in reused]
    if reused:
        say(f"{len(reused)} of {len(jobs)} bags have complete results in {run}: kept")
    t0 = time.time()
    info: dict[str, Any] = {"address": ray_options.address or "embedded", "cluster": {}}
    fresh: list[dict[str, Any]] = []
    try:
        if todo:
            with ray_session(ray_options) as ray:
                info["cluster"] = cluster_info(ray)
                nodes = len(info["cluster"]["nodes"])
                say(f"Ray: {nodes} node(s), {info['cluster']['cpus']:g} CPUs")
                info["warm_up"] = warm_up(ray, options.engine, options.values)
                bar = tqdm(
                    total=len(jobs),
                    initial=len(reused),
                    unit="bag",
                    desc="fleet replay",
                    disable=None if options.progress else True,
                )

                def done(outcome: dict[str, Any]) -> None:
                    reason = f": {outcome['reason']}" if outcome.get("reason") else ""
                    bar.write(f"{outcome['name']}: {outcome['status']}{reason}")

                with bar:
                    fresh = dispatch(ray, todo, ray_options.retries, done, progress=bar)
    finally:
        # No task of this run runs any more: what a killed or cancelled one left goes.
        results.remove_stale_stages(run)
    by_name = {o["name"]: o for o in fresh}
    outcomes = [reused.get(e.name) or by_name[e.name] for e in entries]
    info["wall_s"] = round(time.time() - t0, 3)
    document = results.summary_document(corpus, outcomes, info)
    results.write_summary(run, document)
    write_fleet_report(run, document)
    return document
