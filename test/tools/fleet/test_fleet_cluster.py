"""``fleet replay`` on a real two-node Ray cluster and on embedded Ray: identical outputs to
serial replay, retried workers, unreadable bags, goldens, resume and Ctrl-C."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from dynshape_perception.cli import replay as replay_cli
from dynshape_perception.cli.main import main
from dynshape_perception.models import MODEL_NAMES, model_definition
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights, save_weights
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.runtime.policy import JitConfig
from dynshape_perception.tools.fleet.corpus import load_corpus
from dynshape_perception.tools.fleet.task import RESULT_FILE
from dynshape_perception.tools.replay import golden, sources
from dynshape_perception.tools.replay.params import load_params_file
from dynshape_perception.tools.sim.drive import DriveConfig

BAGS = 10
FRAMES = 4


def drive(seed: int) -> DriveConfig:
    return DriveConfig(
        seed=seed,
        frames=FRAMES,
        segment_frames=2,
        points_range=(5_000, 7_000),
        objects_range=(2, 12),
        agents_range=(0, 6),
    )


@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("weights")
    for name in MODEL_NAMES:
        weights = init_weights(parameter_shapes(model_definition(name)), seed=0)
        save_weights(name, weights, {"version": "test-init"}, directory)
    return directory


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ten generated drives, at two depths below the corpus folder."""
    root = tmp_path_factory.mktemp("corpus")
    for i in range(BAGS):
        sources.write_generated(root / ("city" if i % 2 else "highway") / f"d{i}", "mcap", drive(i))
    return root


@pytest.fixture(scope="module")
def serial(
    corpus: Path, weights_dir: Path, cache_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """Every bag through ``replay --record`` one after the other in this process."""
    runs = tmp_path_factory.mktemp("serial")
    out: dict[str, Path] = {}
    with (
        Engine(
            "x86_64", JitConfig(mode="off"), cache_dir=cache_root, weights_dir=weights_dir
        ) as engine,
        pytest.MonkeyPatch.context() as mp,
    ):
        mp.setattr(replay_cli, "build_engine", lambda *_: engine)
        for entry in load_corpus(corpus):
            run = runs / entry.name
            args = ["replay", str(entry.path), "--record", str(run), "--no-progress"]
            assert main([*args, "--weights-dir", str(weights_dir)]) == 0
            out[entry.name] = run
    return out


def _files(folder: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(folder.iterdir())}


def _engine_args(weights_dir: Path, cache_root: Path) -> list[str]:
    return ["--weights-dir", str(weights_dir), "--cache-dir", str(cache_root), "--no-progress"]


def _summary(run: Path) -> dict[str, Any]:
    return json.loads((run / "summary.json").read_text())


def _assert_identical(run: Path, serial: dict[str, Path], names: list[str] | None = None) -> None:
    for name in names or list(serial):
        baseline = serial[name]
        got = run / "bags" / name
        assert _files(got / "output") == _files(baseline / "output"), name
        assert (got / "params.yaml").read_text() == (baseline / "params.yaml").read_text()


def _manifest(path: Path, corpus: Path, count: int) -> tuple[Path, list[str]]:
    """A manifest of the corpus's first ``count`` bags, under their usual names."""
    entries = load_corpus(corpus)[:count]
    lines = [f"  - {{path: {e.path}, name: {e.name}}}" for e in entries]
    path.write_text("bags:\n" + "\n".join(lines) + "\n")
    return path, [e.name for e in entries]


def _hidden(run: Path) -> list[str]:
    return [p.name for p in (run / "bags").iterdir() if p.name.startswith(".")]


def test_a_corpus_on_two_nodes_equals_serial_replay_and_resumes(
    ray_cluster: Any,
    corpus: Path,
    serial: dict[str, Path],
    weights_dir: Path,
    cache_root: Path,
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    args = ["fleet", "replay", str(corpus), "--out", str(run), "--address", ray_cluster.address]
    proc = ray_cluster.cli([*args, *_engine_args(weights_dir, cache_root)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "10 bags: 10 ok, 0 regressed, 0 failed" in proc.stdout
    doc = _summary(run)
    rows = doc["bags"]
    assert sorted(r["name"] for r in rows) == sorted(serial)
    assert all(r["status"] == "ok" and r["frames"] == FRAMES for r in rows)
    nodes = {r["node_id"] for r in rows}
    assert len(nodes) == 2 and set(doc["nodes"]) == nodes, "both nodes replayed bags"
    assert len(doc["run"]["cluster"]["nodes"]) == 2
    _assert_identical(run, serial)
    # Each model compiles at most once in the whole run: the warm-up fills the cache.
    assert sum(w["compiles"] for w in doc["workers"]) + doc["run"]["warm_up"]["compiles"] <= 3
    assert all(w["cache_hits"] + w["compiles"] >= len(MODEL_NAMES) for w in doc["workers"])
    page = (run / "report.html").read_text()
    assert page.count("<tr>") >= BAGS + 1 and "tier misses 1/2/3/4" in page
    assert all(name in page for name in serial)

    # Again with the same --out: every bag is kept, none replayed, Ray not even started.
    marks = {p: p.stat().st_mtime_ns for p in (run / "bags").glob(f"*/{RESULT_FILE}")}
    again = ray_cluster.cli([*args, *_engine_args(weights_dir, cache_root)])
    assert again.returncode == 0 and "10 of 10 bags have complete results" in again.stdout
    assert "Ray:" not in again.stdout
    assert {p: p.stat().st_mtime_ns for p in marks} == marks
    assert _summary(run)["totals"]["reused"] == BAGS


def _task_workers(ns: Any) -> list[psutil.Process]:
    """Ray workers of the namespace that are running a replay task right now."""
    found = []
    for pid in ns.pids():
        try:
            proc = psutil.Process(pid)
            if proc.cmdline()[:1] == ["ray::replay_bag"]:
                found.append(proc)
        except (psutil.Error, IndexError):
            continue
    return found


def test_a_worker_killed_mid_bag_is_retried_and_nothing_differs(
    ray_cluster: Any,
    corpus: Path,
    serial: dict[str, Path],
    weights_dir: Path,
    cache_root: Path,
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    manifest, names = _manifest(tmp_path / "four.yaml", corpus, 4)
    args = ["fleet", "replay", str(manifest), "--out", str(run), "--address", ray_cluster.address]
    proc = subprocess.Popen(
        ray_cluster.popen_args([*args, *_engine_args(weights_dir, cache_root)]),
        env=ray_cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    killed: int | None = None
    deadline = time.monotonic() + 240
    while killed is None and proc.poll() is None and time.monotonic() < deadline:
        busy = _task_workers(ray_cluster.ns)
        if busy:
            busy[0].send_signal(signal.SIGKILL)
            killed = busy[0].pid
        time.sleep(0.05)
    out, _ = proc.communicate(timeout=300)
    assert killed is not None, f"no replay task was seen running:\n{out}"
    assert proc.returncode == 0, out
    doc = _summary(run)
    assert doc["totals"]["ok"] == len(names)
    assert killed not in {r["worker_pid"] for r in doc["bags"]}
    _assert_identical(run, serial, names)
    assert _hidden(run) == []


@pytest.mark.parametrize("storage", ["mcap"])
def test_a_manifest_with_unreadable_bags_service_events_and_goldens(
    ray_cluster: Any,
    corpus: Path,
    serial: dict[str, Path],
    service_event_bag: Path,
    weights_dir: Path,
    cache_root: Path,
    tmp_path: Path,
) -> None:
    """A truncated bag is reported with its reason while the rest replay; a bag with a
    service-event topic replays its clouds; a bag that differs from its golden output
    regresses, and the exit status says so (1)."""
    same, other = load_corpus(corpus)[:2]
    broken = tmp_path / "truncated"
    shutil.copytree(same.path, broken)
    data = next(broken.glob("*.mcap"))
    data.write_bytes(data.read_bytes()[:-5000])
    golden.write_golden(serial[same.name] / "output", tmp_path / "golden" / "same")
    # The other drive checked against the expectations of the first: a regression.
    golden.write_golden(serial[same.name] / "output", tmp_path / "golden" / "other")
    manifest = tmp_path / "corpus.yaml"
    manifest.write_text(
        "bags:\n"
        f"  - {{path: {same.path}, golden: golden/same, name: same, tags: [city, day]}}\n"
        f"  - {{path: {other.path}, golden: golden/other, name: other}}\n"
        f"  - truncated\n"
        f"  - {{path: {service_event_bag}, name: services}}\n"
    )
    run = tmp_path / "run"
    args = ["fleet", "replay", str(manifest), "--out", str(run), "--address", ray_cluster.address]
    proc = ray_cluster.cli([*args, *_engine_args(weights_dir, cache_root)])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    rows = {r["name"]: r for r in _summary(run)["bags"]}
    assert rows["truncated"]["status"] == "failed"
    assert f"cannot open bag {broken}: it is corrupt or truncated" in rows["truncated"]["reason"]
    assert f"truncated: failed: cannot open bag {broken}" in proc.stdout
    assert not (run / "bags" / "truncated").exists()
    assert rows["services"]["status"] == "ok" and rows["services"]["frames"] == 3
    metrics = json.loads((run / "bags" / "services" / "metrics.json").read_text())
    assert [s["topic"] for s in metrics["topics"]["skipped"]] == [
        "/planner/get_parameters/_service_event"
    ]
    assert rows["same"]["status"] == "ok" and rows["same"]["golden"] == "pass"
    assert rows["same"]["tags"] == ["city", "day"]
    assert rows["other"]["golden"] == "fail" and rows["other"]["status"] == "regressed"
    assert "other: regressed: fail" in proc.stdout
    outcome = json.loads((run / "bags" / "other" / RESULT_FILE).read_text())
    assert outcome["golden_lines"][0].startswith("golden check FAILED")
    totals = _summary(run)["totals"]
    assert (totals["ok"], totals["regressed"], totals["failed"]) == (2, 1, 1)


@pytest.fixture
def embedded_ns(namespaces: Any) -> Any:
    return namespaces.new()


def test_embedded_ray_stops_cleanly_on_ctrl_c_and_the_rerun_finishes(
    embedded_ns: Any,
    ray_env: dict[str, str],
    corpus: Path,
    serial: dict[str, Path],
    weights_dir: Path,
    cache_root: Path,
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    manifest, names = _manifest(tmp_path / "five.yaml", corpus, 5)
    # A sixth bag, last in the manifest, whose data file is a FIFO nobody writes: its task
    # waits in open() until Ctrl-C, so the signal always comes while the corpus runs, after
    # the five others are complete, however loaded the host.
    source = next(e.path for e in load_corpus(corpus) if e.name == names[-1])
    stalled = tmp_path / "stalled"
    shutil.copytree(source, stalled)
    data = next(stalled.glob("*.mcap"))
    data.unlink()
    os.mkfifo(data)
    with manifest.open("a") as text:
        text.write(f"  - {{path: {stalled}, name: stalled}}\n")
    argv = embedded_ns.command(
        [
            *(sys.executable, "-m", "dynshape_perception.cli.main"),
            *("fleet", "replay", str(manifest), "--out", str(run), "--workers", "1"),
            *_engine_args(weights_dir, cache_root),
        ]
    )
    log = tmp_path / "ctrl-c.log"
    # Output to a file, not a pipe: a process left behind would hold a pipe open and hang
    # the read, where the namespace check below names it.
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, env=ray_env, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        if len(list((run / "bags").glob(f"*/{RESULT_FILE}"))) >= len(names):
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the stalled bag keeps the corpus running"
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, log.read_text(errors="replace")
    assert embedded_ns.end_processes(grace_s=10.0) == [], "no Ray process outlives Ctrl-C"
    complete = {p.parent.name for p in (run / "bags").glob(f"*/{RESULT_FILE}")}
    assert complete == set(names) and _hidden(run) == []

    # A folder without its outcome (cut before fleet.json) and a killed task's hidden folder.
    partial = sorted(complete)[0]
    (run / "bags" / partial / RESULT_FILE).unlink()
    (run / "bags" / f".{partial}.dead").mkdir()
    data.unlink()
    shutil.copyfile(next(source.glob("*.mcap")), data)
    rerun = subprocess.run(argv, env=ray_env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    doc = _summary(run)
    assert {r["name"] for r in doc["bags"] if r["reused"]} == complete - {partial}
    assert doc["totals"]["ok"] == len(names) + 1 and doc["run"]["address"] == "embedded"
    assert (run / "report.html").is_file() and _hidden(run) == []
    _assert_identical(run, serial, names)
    assert embedded_ns.end_processes(grace_s=10.0) == []


SPACE = """
study: fleet-study
sampler: {startup_trials: 2}
fixed:
  tiers.comfort_deadline_ms: 1000.0
parameters:
  tracking.gate_distance_m: {low: 0.5, high: 4.0}
  tracking.min_hits_to_confirm: {low: 1, high: 4}
"""


def test_two_tune_processes_share_one_postgresql_study(
    ray_cluster: Any,
    postgres: dict[str, str],
    corpus: Path,
    weights_dir: Path,
    cache_root: Path,
    tmp_path: Path,
) -> None:
    """One process runs its trials as Ray tasks on the cluster, the other in process; both
    join the study in PostgreSQL at once, and every trial of both lands in it."""
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    common = [
        *("tune", "--space", str(space), "--corpus", str(corpus), "--sample", "2"),
        *("--trials", "3", "--max-frames", "3"),
        *("--weights-dir", str(weights_dir), "--cache-dir", str(cache_root)),
    ]
    on_ray = [*common, "--seed", "1", "--storage", postgres["socket"]]
    on_ray += ["--address", ray_cluster.address, "--out", str(tmp_path / "ray.param.yaml")]
    here = [*common, "--seed", "2", "--storage", postgres["tcp"]]
    here += ["--out", str(tmp_path / "here.param.yaml")]
    first = subprocess.Popen(
        ray_cluster.popen_args(on_ray),
        env=ray_cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    second = subprocess.Popen(
        [sys.executable, "-m", "dynshape_perception.cli.main", *here],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    outs = [p.communicate(timeout=400)[0] for p in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], "\n".join(outs)

    import optuna

    study = optuna.load_study(study_name="fleet-study", storage=postgres["tcp"])
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 6
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    drivers = sorted(str(t.user_attrs["driver"]).split(":")[1] for t in trials)
    assert drivers == sorted([str(first.pid)] * 3 + [str(second.pid)] * 3)
    assert all(t.user_attrs["frames"] == 6 for t in trials), "2 bags of 3 frames per trial"
    ray_nodes = {t.user_attrs.get("node_id") for t in trials if "node_id" in t.user_attrs}
    assert len(ray_nodes) >= 1 and None not in ray_nodes

    best = load_params_file(tmp_path / "ray.param.yaml")
    assert set(best) == {
        "tiers.comfort_deadline_ms",
        "tracking.gate_distance_m",
        "tracking.min_hits_to_confirm",
    }
    page = (tmp_path / "ray.param.html").read_text()
    assert page.count("<tr>") >= 7 and "Tuning study fleet-study" in page
