"""``dynshape-perception tune``: seeded TPE over a YAML space, shared studies, ROS params out."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy

from dynshape_perception.cli import tune as tune_cli
from dynshape_perception.cli.main import main
from dynshape_perception.errors import ConfigError
from dynshape_perception.models import MODEL_NAMES, model_definition
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.runtime.policy import JitConfig
from dynshape_perception.tools.replay import sources, tuning
from dynshape_perception.tools.replay.params import load_params_file
from dynshape_perception.tools.replay.tuning import Score, Space, load_space, tune, write_best

# Starts from a gate narrower than a pedestrian's step at 2.5 Hz: tracks break every frame,
# so nothing is predicted and every agent costs the penalty. Tuning must find wider gates.
SPACE = """
study: test-study
objective:
  deadline_misses: 1.0
  latency_ms: 0.001
  prediction_error_m: 1.0
  unpredicted_penalty_m: 10.0
sampler: {startup_trials: 3}
fixed:
  tiers.comfort_deadline_ms: 1000.0
start:
  tracking.gate_distance_m: 0.3
parameters:
  tracking.gate_distance_m: {low: 0.2, high: 4.0}
  tracking.min_hits_to_confirm: {low: 1, high: 4}
"""


@pytest.fixture(scope="module")
def engine(cache_root: Path) -> Iterator[Engine]:
    weights = {n: init_weights(parameter_shapes(model_definition(n)), seed=0) for n in MODEL_NAMES}
    with Engine("x86_64", JitConfig(mode="off"), cache_dir=cache_root, weights=weights) as e:
        yield e


@pytest.fixture
def setup(tmp_path: Path, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A crowd bag and the space; tune reuses one engine instead of building one per call."""
    monkeypatch.setattr(tune_cli, "build_engine", lambda *_: engine)
    bag = tmp_path / "crowd"
    sources.write_crowd(bag, "mcap", seed=3, frames=16, agents=10)
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    return bag, space


def test_seeded_tuning_improves_and_two_workers_share_a_study(
    tmp_path: Path, setup: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    bag, space = setup
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    out = tmp_path / "best.param.yaml"
    args = ["tune", "--space", str(space), "--bags", str(bag), "--seed", "1", "--out", str(out)]
    assert main([*args, "--trials", "4", "--storage", storage]) == 0
    first_worker = capsys.readouterr().out
    assert "trial   0:" in first_worker and "'tracking.gate_distance_m': 0.3" in first_worker
    assert main([*args, "--trials", "3", "--storage", storage]) == 0
    assert "7 trials in study 'test-study'" in capsys.readouterr().out

    study = optuna.load_study(study_name="test-study", storage=storage)
    values = [t.value for t in study.trials]
    assert len(values) == 7 and all(v is not None for v in values)
    start = study.trials[0]
    assert start.params == {"tracking.gate_distance_m": 0.3, "tracking.min_hits_to_confirm": 3}
    assert values[0] is not None and study.best_value < 0.8 * values[0], "tuning improved"
    attrs = start.user_attrs
    assert values[0] == pytest.approx(
        attrs["miss_rate"] + 0.001 * attrs["latency_p95_ms"] + attrs["prediction_error_m"]
    )
    second = [t.params for t in study.trials[4:]]
    assert all(p not in [t.params for t in study.trials[:4]] for p in second)

    best = load_params_file(out)
    assert set(best) == {
        "tiers.comfort_deadline_ms",
        "tracking.gate_distance_m",
        "tracking.min_hits_to_confirm",
    }
    assert best["tracking.gate_distance_m"] == study.best_params["tracking.gate_distance_m"]
    assert isinstance(best["tracking.min_hits_to_confirm"], int)
    assert out.read_text().startswith("# Tuned by dynshape-perception tune")
    assert "/**:\n  ros__parameters:\n" in out.read_text()

    # The same seed replays the same search in a fresh study.
    again = tmp_path / "again.param.yaml"
    rerun = ["tune", "--space", str(space), "--bags", str(bag), "--seed", "1", "--out", str(again)]
    assert main([*rerun, "--trials", "4"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("trial")]
    params = [ln.split(") ", 1)[1] for ln in lines]
    assert params == [str(t.params) for t in study.trials[:4]]


def test_parameters_replay_cannot_use_are_refused(
    tmp_path: Path, setup: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    bag, _ = setup
    space = tmp_path / "markers.yaml"
    space.write_text("parameters:\n  markers.box_alpha: {low: 0.1, high: 0.9}\n")
    out = tmp_path / "never.yaml"
    code = main(["tune", "--space", str(space), "--bags", str(bag), "--out", str(out)])
    assert code == 2
    assert "does not use ['markers.box_alpha']" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("parameters: {a.b: {low: 2, high: 1}}", "low < high"),
        ("parameters: {a.b: {low: 0, high: 1, log: true}}", "log range"),
        ("parameters: {jit.hotness_threshold: {low: 1, high: 9}}", "JIT off"),
        ("parameters: {a.b: {low: 0.1, high: 1.0}}\nfixed: {a.b: 0.5}", "both fixed and tuned"),
        ("parameters: {a.b: {low: 0.1, high: 1.0}}\nstart: {a.b: 2.0}", "outside their ranges"),
        ("parameters: {a.b: {choices: []}}", "non-empty list"),
        ("parameters: {}\nobjective: {speed: 1}", "objective takes"),
        ("parameters: {}\nsurprise: 1", "unknown keys"),
        ("fixed: {}", "needs a 'parameters' mapping"),
        ("sampler: 5\nparameters: {a.b: {low: 0, high: 1}}", "sampler must be a mapping"),
        ("sampler: {startup_trials: many}\nparameters: {}", "startup_trials must be an integer"),
        ("sampler: {startup_trials: 2.5}\nparameters: {}", "startup_trials must be an integer"),
        ("sampler: {startup_trials: true}\nparameters: {}", "startup_trials must be an integer"),
        ("sampler: {seed: 5}\nparameters: {}", r"sampler: unknown keys \['seed'\]"),
        ("fixed: [1, 2]\nparameters: {}", "fixed must be a mapping"),
        ("fixed: {a.b: [1]}\nparameters: {}", "fixed.a.b must be a boolean"),
        ("fixed: {a.b: .nan}\nparameters: {}", "fixed.a.b must be a boolean"),
        ("start: abc\nparameters: {}", "start must be a mapping"),
        ("start: {c.d: 1}\nparameters: {a.b: {low: 0, high: 2}}", "not tuned: \\['c.d'\\]"),
        ("parameters: {a.b: {low: -.inf, high: .inf}}", "finite numbers low < high"),
        ("parameters: {a.b: {low: 0, high: .nan}}", "finite numbers low < high"),
        ("parameters: {a.b: {low: '0', high: 1}}", "finite numbers low < high"),
        ("parameters: {a.b: {choices: [null]}}", "choices must be booleans, numbers or strings"),
        ("parameters: {a.b: {choices: [[1, 2]]}}", "choices must be booleans, numbers or strings"),
        ("parameters: {a.b: {choices: [1], low: 0}}", "choices take no low"),
        ("parameters: {a.b: {low: 0.1, high: 1, log: 'false'}}", "log must be true or false"),
        ("parameters: {a.b: {low: 0.1, high: 1, log: 1}}", "log must be true or false"),
        ("parameters: {5: {low: 0, high: 1}}", "parameter names must be strings"),
        ("study: [1]\nparameters: {}", "study must be a non-empty name"),
        ("objective: {latency_ms: true}\nparameters: {}", "objective.latency_ms"),
    ],
)
def test_bad_spaces(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_space(path)


def test_example_space_loads() -> None:
    example = Path(__file__).resolve().parents[2] / "config" / "tune_space.example.yaml"
    space = load_space(example)
    assert {d.name for d in space.dimensions} >= {
        "segmentation.cell_size_m",
        "tracking.gate_distance_m",
    }
    assert space.weights.unpredicted_penalty_m == 2.0


def _constant_score(_: object) -> Score:
    return Score(miss_rate=0.0, latency_p95_ms=1.0, prediction_error_m=None, frames=1)


def _small_space(tmp_path: Path) -> Space:
    path = tmp_path / "small.yaml"
    path.write_text("study: small\nparameters: {a.b: {low: 0.1, high: 1.0}}\n")
    return load_space(path)


def test_seeds_must_fit_optuna(tmp_path: Path) -> None:
    space = _small_space(tmp_path)
    for seed in (-1, 2**32, True):
        with pytest.raises(ConfigError, match="--seed"):
            tune(space, _constant_score, 1, seed)  # type: ignore[arg-type]
    storage = f"sqlite:///{tmp_path / 'seeds.db'}"
    tune(space, _constant_score, 2, 2**32 - 3, storage)
    with pytest.raises(ConfigError, match="plus the 2 trials"):
        tune(space, _constant_score, 1, 2**32 - 2, storage)


def _engine_fault_injector(*_: object) -> Engine:
    raise AssertionError("the engine must not be built for a bad command line")


@pytest.fixture
def space_without_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A search space file, with the engine replaced by a fault injector: the command line
    is to fail before any engine is built."""
    monkeypatch.setattr(tune_cli, "build_engine", _engine_fault_injector)
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    return space


def test_tune_cli_refuses_a_negative_seed(
    tmp_path: Path, space_without_engine: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    space = space_without_engine
    args = ["tune", "--space", str(space), "--bags", str(tmp_path), "--seed", "-1"]
    assert main(args) == 2
    assert "--seed must be an integer >= 0" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["plain path", "garbage file", "other sqlite", "bad scheme"])
def test_a_storage_that_is_no_study_fails_before_the_engine(
    tmp_path: Path,
    kind: str,
    space_without_engine: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    space = space_without_engine
    db = tmp_path / "x.db"
    if kind == "garbage file":
        db.write_bytes(b"garbage!")
    if kind == "other sqlite":
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE studies (name TEXT)")
            conn.execute("INSERT INTO studies VALUES ('x')")
    storage = {"plain path": str(db), "bad scheme": "nosuch://host/db"}.get(kind, f"sqlite:///{db}")
    args = ["tune", "--space", str(space), "--bags", str(tmp_path), "--storage", storage]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot open Optuna storage") and err.count("\n") == 1, err


def test_write_best_without_a_completed_trial(tmp_path: Path) -> None:
    space = _small_space(tmp_path)
    study = optuna.create_study()
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)
    out = tmp_path / "best.yaml"
    with pytest.raises(ConfigError, match="no completed trial"):
        write_best(study, space, out, [])
    assert not out.exists()


def test_a_shared_study_whose_first_trial_failed(
    tmp_path: Path, setup: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    bag, space = setup
    storage = f"sqlite:///{tmp_path / 'failed.db'}"
    study = optuna.create_study(study_name="test-study", storage=storage)
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)
    out = tmp_path / "best.param.yaml"
    args = ["tune", "--space", str(space), "--bags", str(bag), "--out", str(out)]
    assert main([*args, "--trials", "1", "--max-frames", "4", "--storage", storage]) == 0
    printed = capsys.readouterr().out
    assert "(first completed trial 1: " in printed and "2 trials in study" in printed
    assert out.is_file()


def _bad_bag(tmp_path: Path, kind: str) -> Path:
    bag = tmp_path / kind.replace(" ", "_")
    if kind == "missing":
        return bag
    if kind == "empty folder":
        bag.mkdir()
        return bag
    if kind == "garbage file":
        bag.write_bytes(b"\x89MCAP0\r\n" + b"garbage" * 100)
        return bag
    if kind == "nothing to replay":
        sources.write_crowd(bag, "mcap", seed=3, frames=4, agents=2)
        (bag / "metadata.yaml").write_text(
            (bag / "metadata.yaml").read_text().replace("/obstacles", "/elsewhere")
        )
        return bag
    sources.write_crowd(bag, "mcap", seed=3, frames=16, agents=10)
    data = bag / f"{bag.name}.mcap"
    raw = bytearray(data.read_bytes())
    middle = len(raw) // 2
    raw[middle : middle + 64] = bytes(b ^ 0xFF for b in raw[middle : middle + 64])
    data.write_bytes(bytes(raw))
    return bag


@pytest.mark.parametrize(
    "kind", ["missing", "empty folder", "garbage file", "nothing to replay", "damaged chunk"]
)
def test_bad_bags_are_refused_before_the_shared_study_runs_a_trial(
    tmp_path: Path,
    kind: str,
    space_without_engine: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    space = space_without_engine
    good = tmp_path / "good"
    sources.write_crowd(good, "mcap", seed=3, frames=4, agents=2)
    bad = _bad_bag(tmp_path, kind)
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    args = ["tune", "--space", str(space), "--bags", str(good), str(bad), "--storage", storage]
    assert main([*args, "--out", str(tmp_path / "best.yaml")]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: ") and captured.err.count("\n") == 1, captured.err
    assert str(bad) in captured.err and "Traceback" not in captured.err + captured.out
    study = optuna.load_study(study_name="test-study", storage=storage)
    assert study.trials == []


class PostgresErrorFault(Exception):
    """The driver's error that an injected fault carries: only its SQLSTATE is read."""

    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"SQLSTATE {sqlstate}")
        self.sqlstate = sqlstate


def _schema_race_fault_injector(sqlstate: str, failures: int, calls: list[int]) -> Any:
    """``optuna.create_study`` that first fails ``failures`` times as PostgreSQL fails a
    process whose schema statement another process beat (or with another error)."""
    create = optuna.create_study

    def create_study(*args: Any, **kwargs: Any) -> optuna.Study:
        calls.append(1)
        if len(calls) <= failures:
            raise sqlalchemy.exc.ProgrammingError(
                "CREATE TABLE studies", {}, PostgresErrorFault(sqlstate)
            )
        return create(*args, **kwargs)

    return create_study


@pytest.mark.parametrize("sqlstate", ["42P07", "42710", "23505"])
def test_a_process_that_loses_the_race_for_the_schema_joins_the_study(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sqlstate: str
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(tuning, "SCHEMA_RETRY_S", 0.0)
    monkeypatch.setattr(optuna, "create_study", _schema_race_fault_injector(sqlstate, 2, calls))
    assert tuning.open_study(f"sqlite:///{tmp_path / 'study.db'}", "raced") == 0
    assert len(calls) == 3


def test_other_database_errors_are_no_race_and_fail_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(tuning, "SCHEMA_RETRY_S", 0.0)
    # 42501: insufficient privilege.
    monkeypatch.setattr(optuna, "create_study", _schema_race_fault_injector("42501", 9, calls))
    with pytest.raises(ConfigError, match="cannot open Optuna storage"):
        tuning.open_study(f"sqlite:///{tmp_path / 'study.db'}", "refused")
    assert len(calls) == 1
