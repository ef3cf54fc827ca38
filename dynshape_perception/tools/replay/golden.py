"""Golden regression: a run's output bag against stored expectations, within declared tolerances."""

from __future__ import annotations

import math
import shutil
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import linear_sum_assignment

from dynshape_perception.config import read_yaml
from dynshape_perception.errors import ConfigError, DataError, DynshapeError
from dynshape_perception.fsutil import StagedDir, atomic_write_text
from dynshape_perception.io import bags
from dynshape_perception.io.pointcloud2 import cloud_to_table
from dynshape_perception.perception.records import OBSTACLE_DTYPE, PREDICTION_DTYPE, TRACK_DTYPE
from dynshape_perception.tools.replay.rundir import OUTPUT_BAG

EXPECTED_BAG = "expected"
TOLERANCES_FILE = "tolerances.yaml"
TABLES = {
    "/obstacles": OBSTACLE_DTYPE,
    "/tracks": TRACK_DTYPE,
    "/predictions": PREDICTION_DTYPE,
}
FIELD_GROUPS = {
    "position_m": ("x", "y", "z"),
    "size_m": ("length", "width", "height"),
    "yaw_rad": ("yaw",),
    "score": ("score",),
    "velocity_mps": ("vx", "vy"),
    "prob": ("prob",),
}
EXACT_FIELDS = ("label", "num_points", "id", "age", "k", "step")
MAX_LINES_PER_TOPIC = 12
Tables = dict[int, np.ndarray]


@dataclass(frozen=True)
class Tolerances:
    """Largest accepted absolute differences; ``count`` is the row-count slack per frame.

    Integer fields (ids, labels, point counts, ages, hypothesis and step indices) must
    match exactly; ``exact_num_points: false`` relaxes the point counts of obstacles.
    """

    count: int = 0
    position_m: float = 0.01
    size_m: float = 0.01
    yaw_rad: float = 0.01
    score: float = 0.01
    velocity_mps: float = 0.01
    prob: float = 0.01
    exact_num_points: bool = True

    def __post_init__(self) -> None:
        # A NaN or a string limit would silently disable (or later crash) its comparison.
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "exact_num_points":
                if not isinstance(value, bool):
                    raise ConfigError(f"tolerance {f.name} must be true or false, got {value!r}")
            elif f.name == "count":
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ConfigError(f"tolerance count must be an integer >= 0, got {value!r}")
            elif (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                raise ConfigError(f"tolerance {f.name} must be a finite number >= 0, got {value!r}")

    @classmethod
    def load(cls, path: Path) -> Tolerances:
        raw = read_yaml(path, "tolerances") or {}
        known = {f.name for f in fields(cls)}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: tolerances must be a mapping of {sorted(known)}")
        unknown = set(raw) - known
        if unknown:
            raise ConfigError(f"{path}: unknown tolerances {sorted(unknown, key=str)}")
        try:
            return cls(**raw)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from err

    def dump(self) -> str:
        lines = [
            "# Golden regression tolerances (absolute). Edit to suit your vehicle's CI;",
            "# ids, labels, hypothesis and step indices always match exactly.",
        ]
        return "\n".join(lines) + "\n" + yaml.safe_dump(asdict(self), sort_keys=False)


@dataclass
class GoldenReport:
    passed: bool
    frames: int
    differing: int
    lines: list[str]

    def text(self, golden: Path) -> str:
        head = (
            f"golden check passed: {self.frames} frames match {golden}"
            if self.passed
            else f"golden check FAILED: {self.differing} of {self.frames} frames differ from "
            f"{golden} (tolerances in {golden / TOLERANCES_FILE})"
        )
        return "\n".join([head, *self.lines])


def read_outputs(bag: Path) -> dict[str, Tables]:
    """The output tables of a recorded bag by topic and header stamp."""
    out: dict[str, Tables] = {topic: {} for topic in TABLES}
    with bags.BagReader(bag) as reader:
        for message in reader.messages(list(TABLES)):
            msg = reader.deserialize(message)
            try:
                table = cloud_to_table(msg, TABLES[message.topic])
            except DynshapeError as err:
                raise DataError(f"{bag}: {message.topic} is not an output table: {err}") from err
            out[message.topic][bags.stamp_ns(msg.header.stamp)] = table
    return out


def write_golden(output_bag: Path, golden: Path, tolerances: Tolerances | None = None) -> Path:
    """Store a run's output bag as the expectation; existing tolerances are kept."""
    with StagedDir(golden / EXPECTED_BAG) as staged:
        shutil.copytree(output_bag, staged.path, dirs_exist_ok=True)
        staged.publish(replace=True)
    tol_path = golden / TOLERANCES_FILE
    if tolerances is not None or not tol_path.exists():
        atomic_write_text(tol_path, (tolerances or Tolerances()).dump())
    return golden


def _fmt_t(stamp_ns: int, t0: int) -> str:
    return f"t={(stamp_ns - t0) * 1e-9:.3f} s"


def _match_rows(topic: str, got: np.ndarray, want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row pairs: tracks by id, predictions by (id, k, step), obstacles by nearest centre."""
    if topic == "/obstacles":
        if not got.size or not want.size:
            return np.zeros(0, int), np.zeros(0, int)
        with np.errstate(invalid="ignore"):
            cost = np.hypot(
                got["x"][:, None].astype(np.float64) - want["x"][None, :],
                got["y"][:, None].astype(np.float64) - want["y"][None, :],
            )
        # A NaN or infinite centre still pairs (last), so its difference gets reported.
        finite = np.isfinite(cost)
        worst = 2.0 * float(cost[finite].max()) + 1.0 if finite.any() else 1.0
        return linear_sum_assignment(np.where(finite, cost, worst))
    keys = ("id",) if topic == "/tracks" else ("id", "k", "step")
    index = {tuple(int(row[k]) for k in keys): i for i, row in enumerate(want)}
    pairs = [
        (i, index[key])
        for i, row in enumerate(got)
        if (key := tuple(int(row[k]) for k in keys)) in index
    ]
    if not pairs:
        return np.zeros(0, int), np.zeros(0, int)
    a, b = zip(*pairs, strict=True)
    return np.asarray(a), np.asarray(b)


def _row_name(topic: str, row: np.void) -> str:
    if topic == "/tracks":
        return f"id {int(row['id'])}"
    if topic == "/predictions":
        return f"id {int(row['id'])} k {int(row['k'])} step {int(row['step'])}"
    return f"obstacle at ({float(row['x']):.2f}, {float(row['y']):.2f})"


def compare_frame(topic: str, got: np.ndarray, want: np.ndarray, tol: Tolerances) -> list[str]:
    """Human-readable differences of one topic in one frame (empty when within tolerance)."""
    problems: list[str] = []
    if abs(got.size - want.size) > tol.count:
        problems.append(f"{got.size} rows, expected {want.size} (count tolerance {tol.count})")
    gi, wi = _match_rows(topic, got, want)
    if topic != "/obstacles" and got.size == want.size and gi.size != want.size:
        missing = want.size - gi.size
        problems.append(f"{missing} expected row(s) have no counterpart (ids differ)")
    names = set(got.dtype.names or ())
    worst: list[tuple[float, str]] = []
    for group, columns in FIELD_GROUPS.items():
        limit = float(getattr(tol, group))
        for col in (c for c in columns if c in names):
            g, w = got[col][gi].astype(np.float64), want[col][wi].astype(np.float64)
            with np.errstate(invalid="ignore"):
                diff = np.abs(g - w)
                if col == "yaw":
                    diff = np.abs(np.angle(np.exp(1j * diff)))
            # NaN compares false against any limit: a non-finite value on either side that
            # is not the very same (NaN and NaN, or the same infinity) is a difference.
            same = (np.isnan(g) & np.isnan(w)) | (np.isinf(g) & (g == w))
            nonfinite = ~(np.isfinite(g) & np.isfinite(w)) & ~same
            diff = np.where(nonfinite, np.inf, np.where(same, 0.0, diff))
            for j in np.flatnonzero(diff > limit):
                worst.append(
                    (
                        float(diff[j] / max(limit, 1e-12)),
                        f"{_row_name(topic, want[wi[j]])}: {col} {float(got[col][gi[j]]):.4f}, "
                        f"expected {float(want[col][wi[j]]):.4f} "
                        f"(|diff| {float(diff[j]):.4f} > {limit:g})",
                    )
                )
    exact = [c for c in EXACT_FIELDS if c in names and c not in ("id", "k", "step")]
    if not tol.exact_num_points and topic == "/obstacles":
        exact = [c for c in exact if c != "num_points"]
    for col in exact:
        for j in np.flatnonzero(got[col][gi] != want[col][wi]):
            worst.append(
                (
                    float("inf"),
                    f"{_row_name(topic, want[wi[j]])}: {col} {int(got[col][gi[j]])}, "
                    f"expected {int(want[col][wi[j]])}",
                )
            )
    worst.sort(key=lambda item: -item[0])
    problems += [text for _, text in worst]
    return problems


def compare_outputs(
    got: dict[str, Tables], want: dict[str, Tables], tol: Tolerances
) -> GoldenReport:
    stamps = sorted(set().union(*(set(t) for t in want.values()), *(set(t) for t in got.values())))
    t0 = stamps[0] if stamps else 0
    bad_frames: set[int] = set()
    lines: list[str] = []
    for topic in TABLES:
        topic_lines: list[str] = []
        for stamp in stamps:
            g, w = got[topic].get(stamp), want[topic].get(stamp)
            if g is None and w is None:
                continue
            if g is None:
                problems = ["missing from the output"]
            elif w is None:
                problems = ["not in the golden expectations"]
            else:
                problems = compare_frame(topic, g, w, tol)
            if problems:
                bad_frames.add(stamp)
                where = f"{_fmt_t(stamp, t0)} (stamp {stamp})"
                topic_lines += [f"    {where}: {p}" for p in problems[:3]]
                if len(problems) > 3:
                    topic_lines.append(f"    {where}: ... and {len(problems) - 3} more")
        if topic_lines:
            lines.append(f"  {topic}:")
            lines += topic_lines[:MAX_LINES_PER_TOPIC]
            if len(topic_lines) > MAX_LINES_PER_TOPIC:
                lines.append(f"    ... {len(topic_lines) - MAX_LINES_PER_TOPIC} more lines")
    return GoldenReport(not bad_frames, len(stamps), len(bad_frames), lines)


def load_golden(golden: Path) -> Tolerances:
    """The tolerances of a golden folder, once its expectations bag opens and checks whole;
    run before a replay, so that a bad folder fails before the replay's work."""
    expected = golden / EXPECTED_BAG
    if not expected.exists():
        raise ConfigError(f"{golden} holds no golden expectations; write them with --write-golden")
    with bags.BagReader(expected) as reader:
        reader.verify()
    tol_path = golden / TOLERANCES_FILE
    return Tolerances.load(tol_path) if tol_path.exists() else Tolerances()


def check_golden(output_bag: Path, golden: Path) -> GoldenReport:
    tol = load_golden(golden)
    return compare_outputs(read_outputs(output_bag), read_outputs(golden / EXPECTED_BAG), tol)


def output_bag_of(run_dir: Path) -> Path:
    return Path(run_dir) / OUTPUT_BAG
