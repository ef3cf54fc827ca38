"""``bench e2e``'s pacing of scans, its parameter overrides, its count of the JIT's work, the
order and ratios of its rounds and what the scans' sizes explain of a run's times."""

from __future__ import annotations

import math
import time

import pytest

from dynshape_perception.errors import ConfigError
from dynshape_perception.tools.bench.e2e import (
    Pacer,
    jit_activity,
    parameter_overrides,
    print_rounds,
    round_order,
    round_summary,
    scan_size,
    setup_ratios,
)


class ManualClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_closed_loop_never_waits() -> None:
    clock = ManualClock()
    pacer = Pacer(0.0, clock)
    assert [pacer.wait_s() for _ in range(3)] == [0.0, 0.0, 0.0]


def test_scans_keep_the_period_and_a_late_one_goes_out_at_once_without_a_burst() -> None:
    clock = ManualClock()
    pacer = Pacer(10.0, clock)
    assert pacer.wait_s() == 0.0
    clock.now += 0.03  # the first frame took 30 ms
    assert pacer.wait_s() == pytest.approx(0.07)
    clock.now += 0.07 + 0.25  # sent on time; that frame then ran 250 ms, past its period
    assert pacer.wait_s() == 0.0
    # The period counts from the late scan: no catching up on the ones a driver skipped.
    clock.now += 0.01
    assert pacer.wait_s() == pytest.approx(0.09)


@pytest.mark.parametrize("rate", [-1.0, math.nan, math.inf])
def test_a_rate_that_is_none_is_refused(rate: float) -> None:
    with pytest.raises(ConfigError, match="rate-hz"):
        Pacer(rate)


def test_jit_activity_sums_every_engine_of_every_node() -> None:
    statuses = {
        "pointcloud_node": {
            "jit.compiles_ok": "1",
            "jit.compiles_failed": "0",
            "jit.compiles_rejected": "2",
            "jit.compile_worker_starts": "1",
            "jit_tier1.compiles_ok": "3",
            "jit_tier1.compile_time_s": "0.4",
            "frames_in": "104",
        },
        "tracker_node": {"jit.compiles_failed": "1", "jit.compile_worker_starts": "2"},
        "prediction_node": {},
    }
    assert jit_activity(statuses) == {"compiles": 7, "worker_starts": 3}
    assert jit_activity({}) == {"compiles": 0, "worker_starts": 0}


def test_set_types_each_value_as_its_parameter_is_typed() -> None:
    got = parameter_overrides(
        [
            "jit.start_workers=true",
            "jit.hotness_threshold=4",
            "jit.worker_idle_s=5",
            "jit.compile_mode=thread",
            "jit.warm_up_shapes=",
        ]
    )
    assert got == {
        "jit.start_workers": True,
        "jit.hotness_threshold": 4,
        "jit.worker_idle_s": 5.0,
        "jit.compile_mode": "thread",
        "jit.warm_up_shapes": "",
    }
    assert type(got["jit.worker_idle_s"]) is float


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("jit.start_workers", "NAME=VALUE"),
        ("no.such_parameter=1", "NAME=VALUE"),
        ("=true", "NAME=VALUE"),
        ("jit.start_workers=yes please", "must be bool"),
        ("jit.hotness_threshold=2.5", "must be int"),
        ("jit.compile_mode=[process]", "must be str"),
        ("jit.compile_mode={a", "not a YAML value"),
        ("jit.compile_mode=eager", "must be one of"),
        ("jit.hotness_threshold=0", "must be >= 1"),
    ],
)
def test_set_refuses_what_is_no_parameter_value(item: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parameter_overrides([item])


def test_an_arrival_is_when_the_middleware_took_the_message_in() -> None:
    from dynshape_perception.testing.probe import received_at

    before = time.perf_counter()
    taken = received_at({"received_timestamp": time.time_ns() - 5_000_000})
    # Five milliseconds back from the callback's time, give or take the clocks' reading.
    assert before - 0.006 < taken < time.perf_counter() - 0.004
    # No stamp (an rmw without one), or one ahead of the clock: the callback's time.
    for info in ({}, {"received_timestamp": 0}, {"received_timestamp": time.time_ns() + 10**9}):
        before = time.perf_counter()
        assert before <= received_at(info) <= time.perf_counter()


def test_rounds_take_the_setups_first_and_last_in_turn() -> None:
    setups = ["separate", "composed"]
    assert [round_order(setups, i) for i in range(3)] == [setups, setups[::-1], setups]
    assert round_order(["composed"], 1) == ["composed"]


def test_separate_over_composed_per_round_and_its_median() -> None:
    def runs(**p50: float) -> dict[str, dict[str, float]]:
        return {name.replace("_", "/"): {"p50_ms": v} for name, v in p50.items()}

    rounds = [
        runs(separate_kitti=12.0, composed_kitti=10.0, separate_drive=11.0, composed_drive=10.0),
        runs(composed_kitti=10.0, separate_kitti=11.0, composed_drive=11.0, separate_drive=11.0),
        runs(separate_kitti=15.0, composed_kitti=10.0, separate_drive=9.0),
    ]
    ratios = setup_ratios(rounds)
    # A round without the composed run of an input gives that input no ratio.
    assert ratios == {
        "kitti": {"per_round": [1.2, 1.1, 1.5], "median": 1.2},
        "drive": {"per_round": [1.1, 1.0], "median": 1.05},
    }
    assert setup_ratios([runs(composed_kitti=10.0)]) == {}
    # A run that lost every frame has no p50, and its round no ratio.
    lost = runs(separate_kitti=math.nan, composed_kitti=10.0, separate_drive=9.0)
    lost.update(runs(composed_drive=math.nan))
    assert setup_ratios([lost, rounds[0]]) == {
        "kitti": {"per_round": [1.2], "median": 1.2},
        "drive": {"per_round": [1.1], "median": 1.1},
    }


def frames_of(points: list[int], ms: list[float]) -> list[dict[str, object]]:
    return [
        {"points": n, "scan_to_ms": {"predicted_objects": t}}
        for n, t in zip(points, ms, strict=True)
    ]


def test_times_that_follow_the_scans_sizes_leave_no_tail_at_the_median_size() -> None:
    points = [10_000, 40_000, 20_000, 30_000, 20_000]
    size = scan_size(frames_of(points, [2.0 + 0.3 * n / 1000 for n in points]))
    assert size["points"] == {"min": 10_000, "p50": 20_000.0, "max": 40_000}
    assert size["fixed_ms"] == pytest.approx(2.0)
    assert size["ms_per_1k_points"] == pytest.approx(0.3)
    # Every frame, moved along the line to 20,000 points, takes 8 ms.
    assert size["at_median_points"] == pytest.approx({"p50_ms": 8.0, "p99_ms": 8.0})


def test_a_pause_stays_in_the_tail_at_the_median_size() -> None:
    points = [10_000, 20_000, 30_000] * 10
    ms = [1.0 + 0.2 * n / 1000 for n in points]
    ms[4] += 6.0  # a 20,000-point frame that waited
    size = scan_size(frames_of(points, ms))
    at = size["at_median_points"]
    assert at["p50_ms"] == pytest.approx(5.0, abs=0.3)
    assert at["p99_ms"] > at["p50_ms"] + 4.0


def test_scans_of_one_size_get_no_line() -> None:
    size = scan_size(frames_of([120_000] * 3, [9.0, 12.0, 10.0]))
    assert size == {"points": {"min": 120_000, "p50": 120_000.0, "max": 120_000}}
    assert scan_size(frames_of([5_000], [3.0])) == {
        "points": {"min": 5_000, "p50": 5_000.0, "max": 5_000}
    }
    assert scan_size([]) == {}


def test_a_rounds_summary_keeps_the_times_at_the_median_size_where_the_scans_differ() -> None:
    points = [10_000, 20_000, 30_000]
    frames = frames_of(points, [3.0, 5.0, 7.0])
    run = {"p50_ms": 5.0, "p99_ms": 7.0, "frames": 3, "lost": 0, "jit": {"compiles": 1}}
    drive = round_summary(run | {"per_hop": {"scan_size": scan_size(frames)}})
    assert drive["at_median_points"] == pytest.approx({"p50_ms": 5.0, "p99_ms": 5.0})
    same = scan_size(frames_of([20_000] * 3, [3.0, 5.0, 7.0]))
    kitti = round_summary(run | {"per_hop": {"scan_size": same}})
    assert kitti == {"p50_ms": 5.0, "p99_ms": 7.0, "frames": 3, "lost": 0, "compiles": 1}


def test_printed_rounds_mark_one_without_a_line_at_the_median_size(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sized = {"p50_ms": 10.0, "p99_ms": 12.0, "at_median_points": {"p50_ms": 9.9, "p99_ms": 11.5}}
    # The second round measured one frame: no line to move it on.
    single = {"p50_ms": 11.0, "p99_ms": 11.0}
    entry = {
        "rounds": [{"composed/drive": sized}, {"composed/drive": single}],
        "separate_over_composed": {},
    }
    print_rounds("incremental", entry)
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].split() == ["composed/drive", "10.0", "/", "12.0", "11.0", "/", "11.0"]
    assert printed[2].strip() == "at the median scan's size: 9.9 / 11.5  -"
