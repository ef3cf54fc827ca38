"""``bench jit`` end to end on a short stream: the report's shape and its invariants."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from dynshape_perception import stats
from dynshape_perception.errors import ConfigError
from dynshape_perception.runtime.metrics import CompileEvent, JitMetrics
from dynshape_perception.tools.bench import jit
from dynshape_perception.tools.bench.jit import probes, statistics
from dynshape_perception.tools.bench.jit import stream as jit_stream

KEYS = {"p50_ms", "p99_ms", "max_ms", "total_s", "compiles", "calling_thread_compile_s"}


def test_stream_is_seeded_long_tailed_and_never_repeats_a_point_count() -> None:
    stream = jit_stream.shape_stream(4000, seed=3)
    assert stream == jit_stream.shape_stream(4000, seed=3)
    points = [c.dims["P"] for c in stream if c.model == "segmenter"]
    assert len(points) == len(set(points)) and min(points) >= 5000 and max(points) <= 150000
    lengths = {c.dims["T"] for c in stream if c.model == "predictor"}
    assert len(lengths) >= 20


class SteppedClock:
    """A clock that moves only when the schedule sleeps or a step says so: the open loop's
    accounting, checked exactly and whatever else runs on the host."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += max(seconds, 0.0)

    def taking(self, seconds: float) -> Callable[..., None]:
        def step(*_: object) -> None:
            self.now_s += seconds

        return step


def test_open_loop_keeps_the_probe_off_the_clock() -> None:
    stream = jit_stream.shape_stream(6, seed=1)
    inputs: list[list[np.ndarray]] = [[] for _ in stream]
    clock = SteppedClock()
    probed: list[int] = []
    slow_probe = clock.taking(0.02)

    def probe() -> None:
        probed.append(1)
        slow_probe()

    def served(call: jit_stream.Call, args: list[np.ndarray]) -> tuple[bool, bool]:
        return False, False

    out = jit_stream.open_loop(
        stream, inputs, np.zeros(len(stream)), served, probe=probe, clock=clock, sleep=clock.sleep
    )
    assert len(probed) == len(stream) == out.served_calls
    # 0.12 s of probing; serving a no-op took no time on this clock.
    assert out.total_s == 0.0 and out.wall_s == 0.0


def test_bench_bookkeeping_delays_neither_latency_nor_the_next_call() -> None:
    """The probe stops the arrival schedule: latencies are those of the calls alone."""
    stream = jit_stream.shape_stream(8, seed=1)
    inputs: list[list[np.ndarray]] = [[] for _ in stream]
    clock = SteppedClock()
    call_takes = clock.taking(0.001)

    def served(call: jit_stream.Call, args: list[np.ndarray]) -> tuple[bool, bool]:
        call_takes()
        return False, False

    arrivals = np.arange(len(stream)) * 0.004
    out = jit_stream.open_loop(
        stream,
        inputs,
        arrivals,
        served,
        probe=clock.taking(0.04),
        clock=clock,
        sleep=clock.sleep,
    )
    # 40 ms of bookkeeping per call against 4 ms gaps: charged, it would queue every call.
    assert out.latencies_ms == pytest.approx([1.0] * len(stream))
    assert out.total_s == pytest.approx(0.008) and out.wall_s == pytest.approx(0.029)


def test_extrapolation_charges_each_model_its_own_compile_time() -> None:
    stream = [jit_stream.Call("predictor", {"A": 1, "T": t}, t) for t in range(1, 5)] + [
        jit_stream.Call("segmenter", {"P": p}, p) for p in range(5000, 5006)
    ]
    served = jit_stream.Outcome(total_s=5.0, calling_thread_compile_s=4.0, served_calls=4)
    out = statistics.extrapolate(served, stream, {"predictor": 4.0}, {"predictor": 4})
    # No segmenter compile was seen: the overall mean stands in for it (1 s each).
    assert out.calling_thread_compile_s == pytest.approx(4.0 + 6 * 1.0)
    served = jit_stream.Outcome(total_s=5.0, calling_thread_compile_s=4.5, served_calls=5)
    out = statistics.extrapolate(
        served, stream, {"predictor": 4.0, "segmenter": 0.5}, {"predictor": 4, "segmenter": 1}
    )
    assert out.extra["extrapolated_new_signatures_by_model"] == {"segmenter": 5}
    assert out.calling_thread_compile_s == pytest.approx(4.5 + 5 * 0.5)
    assert "p99_ms" in out.extra["measured_on_served_calls"]


def test_the_compile_summary_counts_as_the_runtime_counters_do() -> None:
    """A build loaded from the artefact cache is ok (its reason says where it came from); only
    a build slower than generic is rejected; demotions are no compiles."""
    metrics = JitMetrics()
    metrics.record_compile(CompileEvent(0.0, "predictor", "a", True, 0.1))
    cached = CompileEvent(0.0, "predictor", "b", True, 0.1, "from the artefact cache")
    metrics.record_compile(cached)
    metrics.record_compile(CompileEvent(0.0, "predictor", "c", True, 0.1, "slower"), rejected=True)
    metrics.record_compile(CompileEvent(0.0, "predictor", "d", False, 0.1, "timeout"))
    metrics.record_event(CompileEvent(0.0, "predictor", "a", True, 0.0, "demoted: x1.2"))
    counters, events = metrics.record()
    row = statistics.compile_summary(events)["predictor"]
    assert (
        (row["ok"], row["rejected"], row["failed"])
        == (
            counters["compiles_ok"],
            counters["compiles_rejected"],
            counters["compiles_failed"],
        )
        == (2, 1, 1)
    )
    assert row["demoted"] == 1


def test_the_hit_rate_is_also_reported_over_keys_once_accepted() -> None:
    outcome = jit_stream.Outcome(
        latencies_ms=[1.0] * 8,
        served_special=[False] * 4 + [True, True, False, False],
        accepted=[False] * 4 + [True, True, False, False],
        ever_accepted=[False] * 4 + [True, True, True, True],
    )
    row = statistics.summarise(outcome, jit=True)
    assert row["hit_rate"] == 1.0 and row["hit_rate_ever_accepted"] == 0.5


def test_a_hit_rate_without_accepted_calls_is_undefined_not_zero() -> None:
    """A runtime that accepted nothing (every build slower than generic) missed nothing."""
    outcome = jit_stream.Outcome(
        latencies_ms=[1.0] * 4,
        served_special=[False] * 4,
        accepted=[False] * 4,
        ever_accepted=[False, False, True, False],
    )
    row = statistics.summarise(outcome, jit=True)
    assert row["hit_rate"] is None and row["hit_rate_ever_accepted"] == 0.0
    assert (
        statistics.summarise(
            jit_stream.Outcome(
                latencies_ms=[1.0] * 2, served_special=[False] * 2, accepted=[False] * 2
            ),
            jit=False,
        )["hit_rate"]
        is None
    )


def test_while_compiling_compares_the_same_calls_far_and_near() -> None:
    jit_ms = np.arange(1.0, 11.0)
    during = np.array([1, 1, 0, 0, 1, 0, 0, 0, 1, 0], bool)
    row = statistics.while_compiling(
        jit_ms,
        during,
        {"generic": jit_ms / 2, "generic_repeat": jit_ms, "cut_short": jit_ms[:3]},
        {"generic_before": jit_ms[:5] / 4, "generic_after": jit_ms[:5]},
    )
    assert row["calls"] == 4
    assert row["p99_ms"] == pytest.approx(np.percentile([1.0, 2.0, 5.0, 9.0], 99), abs=1e-3)
    assert row["ratio_to_generic"] == 2.0 and row["ratio_to_generic_repeat"] == 1.0
    # A run that did not serve every call has no same calls to compare.
    assert not any("cut_short" in key for key in row)
    near = row["adjacent"]
    assert (near["window_calls"], near["calls"], near["calls_outside"]) == (5, 3, 1)
    assert near["p99_ms"] == pytest.approx(np.percentile([1.0, 2.0, 5.0], 99), abs=1e-3)
    assert near["ratio_to_generic_before"] == 4.0 and near["ratio_to_generic_after"] == 1.0
    assert statistics.while_compiling(jit_ms, np.zeros(10, bool), {"generic": jit_ms}, {}) == {
        "calls": 0
    }
    # Nothing pending among the first calls: no near comparison to make.
    late = np.zeros(10, bool)
    late[9] = True
    assert "adjacent" not in statistics.while_compiling(
        jit_ms, late, {}, {"generic_before": jit_ms[:5]}
    )


def _pass(latency_ms: float, service_ms: float | None = None, calls: int = 4) -> jit_stream.Outcome:
    return jit_stream.Outcome(
        latencies_ms=[latency_ms] * calls, service_ms=[service_ms or latency_ms] * calls
    )


def test_repeated_cold_starts_are_judged_against_their_neighbours() -> None:
    during = np.array([1, 1, 0, 0], bool)
    generic = [_pass(10.0, 2.0), _pass(30.0, 2.0), _pass(20.0, 4.0), _pass(20.0, 4.0)]
    runs = [
        (_pass(40.0, 3.0), during),
        (_pass(5.0), np.zeros(4, bool)),
        (_pass(10.0, 4.0), during),
    ]
    row = statistics.while_compiling_repeated(runs, generic)
    # 40 against (10 + 30) / 2; the start with nothing pending has no ratio; 10 against 20.
    assert row["ratios"] == [2.0, 0.5] and row["generic_aa"] == [3.0, 1.0]
    assert row["service_ratios"] == [1.5, 1.0]
    assert row["pending_calls"] == [2, 0, 2] and row["window_calls"] == 4
    assert row["median_ratio"] == 1.25
    assert row["geomean"] == 1.0 and row["service_geomean"] == pytest.approx(1.225, abs=1e-3)
    # Two starts, one each side of 1: resampled, the mean spans both.
    assert row["ci95"] == [0.5, 2.0] and row["verdict"] == "undecided"
    assert row["service_ci95"] == [1.0, 1.5] and row["service_verdict"] == "undecided"
    one = statistics.while_compiling_repeated(runs[:1], generic[:2])
    assert one["ci95"] is None and one["verdict"] == "undecided"
    assert "median_ratio" not in statistics.while_compiling_repeated(runs[1:2], generic[:2])


def test_busy_time_of_each_start_is_set_against_its_neighbours() -> None:
    def took(seconds: float) -> jit_stream.Outcome:
        return jit_stream.Outcome(total_s=seconds)

    row = statistics.busy_repeated([took(9.0), took(10.0)], [took(10.0), took(8.0), took(12.0)])
    assert row["ratios"] == [1.0, 1.0] and row["geomean"] == 1.0
    # A tie is no win: the target wants the runtime below generic.
    assert row["ci95"] == [1.0, 1.0] and row["verdict"] == "missed"
    either = statistics.busy_repeated([took(9.0), took(11.0)], [took(10.0)] * 3)
    assert either["ci95"] == [0.9, 1.1] and either["verdict"] == "undecided"
    faster = statistics.busy_repeated([took(9.0)] * 3, [took(10.0)] * 4)
    assert faster["ci95"] == [0.9, 0.9] and faster["verdict"] == "met"
    assert statistics.busy_repeated([], [took(10.0)]) == {"ratios": []}


def test_the_p99_target_is_judged_on_the_interval_not_the_mean() -> None:
    near_one = [0.9, 0.95, 1.0, 1.05, 0.92, 0.98, 1.02, 0.97] * 4
    mean, low, high = stats.geomean_ci(near_one)
    assert low is not None and high is not None
    assert low < mean < high and high < 1.1
    assert stats.geomean_ci(near_one) == (mean, low, high), "seeded: the same report each time"
    assert stats.verdict([low, high], 1.1) == "met"
    assert stats.verdict([1.12, 1.5], 1.1) == "missed"
    assert stats.verdict([0.8, 1.3], 1.1) == "undecided"
    assert stats.verdict([0.8, 1.1], 1.1) == "met"
    assert stats.verdict(None, 1.1) == "undecided"
    # Wide spread, as two generic passes alone can differ threefold: no verdict either way.
    _, low, high = stats.geomean_ci([0.37, 3.4, 0.5, 2.0, 1.6])
    assert stats.verdict([low or 0.0, high or 0.0], 1.1) == "undecided"


@pytest.mark.slow
def test_bench_jit_reports_every_strategy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "jit.json"
    parser = argparse.ArgumentParser()
    jit.add_arguments(parser)
    args = parser.parse_args(
        ["--calls", "400", "--budget-s", "2", "--pending-repeats", "2", "--json", str(out)]
    )
    assert jit.run(args) == 0
    report = json.loads(out.read_text())
    for name in jit.STRATEGIES:
        assert KEYS <= set(report[name]) and "hit_rate" in report[name]
    assert report["generic"]["compiles"] == 0
    assert report["jit"]["calling_thread_compile_s"] == 0.0
    # Keys once accepted include those accepted now: that rate can only be lower. Either is
    # undefined where no call of the second half was accepted.
    for name in ("jit", "jit_warm"):
        now, ever = report[name]["hit_rate"], report[name]["hit_rate_ever_accepted"]
        assert now is None or ever is not None
        if now is not None:
            assert 0.0 <= ever <= now + 1e-9
    # Calls are served one at a time: their service time never exceeds the wall time.
    assert 0.0 < report["stream"]["generic_load"] <= 1.0
    sync = report["sync_exact"]
    assert sync["extrapolated"], "a 2 s budget cannot compile every exact shape"
    assert sync["served_calls"] < 400 and "p99_ms" in sync["measured_on_served_calls"]
    assert sync["compiles"] > report["static_buckets"]["compiles"] > 0
    assert sync["calling_thread_compile_s"] > 2.0
    assert set(report["jit"]["busy_by_model_s"]) == {"segmenter", "predictor"}
    assert report["jit"]["while_compiling"]["calls"] >= 0
    repeated = report["jit"]["while_compiling_repeated"]
    assert repeated["window_calls"] == 400
    assert len(repeated["pending_calls"]) == 2
    assert len(repeated["ratios"]) == sum(n > 0 for n in repeated["pending_calls"])
    assert len(repeated["service_ratios"]) == len(repeated["ratios"])
    assert repeated["rate_hz"] > 0 and 0.0 < repeated["generic_load"] <= 1.0
    if repeated["ratios"]:
        assert {repeated["verdict"], repeated["service_verdict"]} <= {"met", "missed", "undecided"}
    assert len(repeated["busy"]["ratios"]) == 2 and repeated["busy"]["verdict"] in (
        "met",
        "missed",
        "undecided",
    )
    belief = report["jit"]["cost_model"]["predictor"]
    built = report["jit"]["compile_summary"].get("predictor", {"ok": 0, "rejected": 0})
    assert belief["validated"] == built["ok"] + built["rejected"], "each validated build counts"
    assert belief["judged_in_place"] <= built["ok"] and belief["speedup"] > 0.0
    paired = report["jit"]["paired_with_generic"]
    assert sum(g["calls"] for g in paired.values()) == 400
    assert all(g["ratio"] > 0 for g in paired.values())
    warm = report["jit_warm"]
    assert warm["calling_thread_compile_s"] == 0.0 and warm["warm_up_s"] > 0.0
    # The shape log's hot keys are built (or loaded) and judged before the warm run's first
    # call. Which are kept is the workers' measured verdict on the host: none, where a
    # specialisation with its padding is no faster than the generic build.
    judged = warm["compile_summary"]
    assert warm["compiles"] > 0
    assert warm["compiles"] == sum(s["ok"] + s["rejected"] + s["failed"] for s in judged.values())
    assert warm["warm_specialisations"] <= sum(s["ok"] for s in judged.values())
    if warm["warm_specialisations"]:
        assert warm["hit_rate"] is not None and warm["hit_rate"] > 0.0
    assert set(warm["locality"]) == {"grouped_by_key", "stream_order", "with_point_clouds"}
    assert all(row["generic_s"] > 0 and row["jit_s"] > 0 for row in warm["locality"].values())
    cost = warm["dispatch_overhead"]
    assert cost["calls"] > 0 and cost["cold"] > 0 and cost["warm"] > 0
    assert 0 < cost["signatures"] <= cost["calls"]
    assert report["generic_repeat"]["compiles"] == 0
    assert set(report["segmenter_exact"]) == {str(p) for p in probes.EXACT_POINTS}
    assert all(ratio > 0 for ratio in report["segmenter_exact"].values())
    roof = report["segmenter_roofline"]
    assert roof["P"] == max(probes.EXACT_POINTS) and roof["tvm_threads"] >= 1
    # A share of a timed peak: how far below it the build runs depends on the host and its
    # load, so only its sign is checked (a peak kernel that overflowed is a BenchError).
    assert roof["share_of_peak"] > 0.0
    assert roof["headroom"] == pytest.approx(1 / roof["share_of_peak"], rel=0.01)
    printed = capsys.readouterr().out
    assert "measured float32 FMA peak" in printed
    assert "cost model predictor" in printed
    assert "generic A/A" in printed and "runtime busy" in printed
    assert "dispatch overhead" in printed and "while compiling, repeated" in printed
    assert "extrapolated" in printed


def test_bench_jit_refuses_bad_arguments() -> None:
    parser = argparse.ArgumentParser()
    jit.add_arguments(parser)
    with pytest.raises(ConfigError, match="--strategies"):
        jit.run(parser.parse_args(["--strategies", "jit,eager"]))
    with pytest.raises(ConfigError, match="jit_warm"):
        jit.run(parser.parse_args(["--strategies", "generic,jit_warm"]))
    with pytest.raises(ConfigError, match="--rate"):
        jit.run(parser.parse_args(["--rate", "0"]))
    with pytest.raises(ConfigError, match="--pending-repeats"):
        jit.run(parser.parse_args(["--pending-repeats", "-1"]))
