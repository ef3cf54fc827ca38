"""The cost model: amortise a measured compile over the calls a key's rate predicts."""

from __future__ import annotations

from typing import Any

import pytest

from dynshape_perception.errors import ConfigError
from dynshape_perception.runtime.policy import (
    IN_PLACE_MIN,
    CostModel,
    InterferenceMeter,
    JitConfig,
)
from dynshape_perception.runtime.specialisations import KeyState


def key(calls: int, span_s: float, generic_ms: float) -> KeyState:
    return KeyState(
        calls=calls, first_seen_s=100.0, last_seen_s=100.0 + span_s, generic_ms=generic_ms
    )


def test_expected_calls_follow_the_observed_rate() -> None:
    model = CostModel(prior_speedup=0.5, prior_compile_s=1.0, horizon_s=60.0)
    assert model.expected_calls(key(11, 10.0, 1.0)) == pytest.approx(60.0)
    assert model.expected_calls(key(1, 0.0, 1.0)) == 1.0
    assert model.expected_calls(key(500, 10.0, 1.0)) == pytest.approx(2994.0)


def test_a_burst_is_not_read_as_a_rate_of_thousands_a_second() -> None:
    model = CostModel(prior_speedup=0.5, prior_compile_s=1.0, horizon_s=600.0)
    # Eight calls 2 ms apart: over one second at most, not 3,500 calls a second for 600 s.
    assert model.expected_calls(key(8, 0.014, 1.0)) == pytest.approx(7 * 600.0)
    assert model.expected_calls(key(8, 0.0, 1.0)) == pytest.approx(7 * 600.0)


def test_benefit_is_positive_only_when_the_compile_pays_for_itself() -> None:
    model = CostModel(prior_speedup=0.5, prior_compile_s=1.0, horizon_s=60.0)
    assert model.benefit_ms(key(11, 10.0, 40.0)) == pytest.approx(60 * 20.0 - 1000.0)
    assert model.benefit_ms(key(11, 10.0, 0.05)) < 0.0


def test_measurements_replace_the_priors() -> None:
    model = CostModel(prior_speedup=0.5, prior_compile_s=1.0, horizon_s=60.0)
    model.observe_speedup(1.2)
    model.observe_compile(3.0)
    assert model.speedup == pytest.approx(1.2) and model.compile_s == pytest.approx(3.0)
    assert model.benefit_ms(key(11, 10.0, 40.0)) < 0.0, "a slower specialisation never pays"


def test_bad_jit_settings_are_rejected() -> None:
    with pytest.raises(ConfigError, match="horizon_s must be > 0"):
        JitConfig(horizon_s=0.0)
    with pytest.raises(ConfigError, match="jit mode must be one of"):
        JitConfig(mode="eager")
    with pytest.raises(ConfigError, match="unknown jit settings"):
        JitConfig.from_mapping({"hotnes_threshold": 3})
    # NaN passes every comparison it is put to: each float setting is checked finite.
    for name in ("accept_ratio", "prior_speedup", "validate_rtol", "min_benefit_ms"):
        setting: dict[str, Any] = {name: float("nan")}
        with pytest.raises(ConfigError, match=f"{name} must be finite"):
            JitConfig(**setting)
    not_positive: tuple[dict[str, Any], ...] = (
        {"accept_ratio": 0.0},
        {"prior_speedup": -0.5},
        {"prior_compile_s": -1.0},
    )
    for bad in not_positive:
        with pytest.raises(ConfigError, match="accept_ratio and prior_speedup must be > 0"):
            JitConfig(**bad)
    with pytest.raises(ConfigError, match="validate_rtol, validate_atol"):
        JitConfig(validate_atol=-1e-5)
    with pytest.raises(ConfigError, match="disk_max_bytes must be >= 1"):
        JitConfig(disk_max_bytes=0)
    for raw in (
        {"hotness_threshold": "eight"},
        {"weak_edges": {"predictor": {"A": ["one", 2]}}},
        {"weak_edges": {"predictor": [1, 2]}},
    ):
        with pytest.raises(ConfigError, match="invalid jit settings"):
            JitConfig.from_mapping(raw)


def test_degrade_judges_finished_compiles() -> None:
    from dynshape_perception.runtime.policy import DegradeGuard

    guard = DegradeGuard(JitConfig(degrade_min_misses=20))
    guard.requested = 12
    assert not any(guard.on_miss() for _ in range(100)), "a queue being worked off is no failure"
    guard.completed, guard.failed = 1, 2
    assert not guard.on_miss(), "one success in three finished compiles is above 30 %"
    guard.failed = 3
    assert guard.on_miss() and guard.active, "compiles that keep failing pause specialising"


def test_compile_cost_is_charged_at_its_calling_path_weight() -> None:
    weight = [1.0]
    model = CostModel(0.5, 1.0, 60.0, compile_weight=lambda: weight[0])
    state = key(11, 10.0, 2.0)
    assert model.benefit_ms(state) == pytest.approx(60 * 1.0 - 1000.0)
    weight[0] = 0.05
    assert model.benefit_ms(state) == pytest.approx(60 * 1.0 - 50.0)


def test_interference_meter_keeps_its_prior_until_both_sides_are_measured() -> None:
    busy = [0.0]
    meter = InterferenceMeter(prior_weight=0.5, min_samples=5, busy_s=lambda: busy[0])
    for _ in range(50):
        meter.observe(0.001, 0.001, compiling=None)
    assert meter.slowdown("process") is None and meter.weight("process") == 0.5
    for _ in range(5):
        meter.observe(0.0013, 0.001, compiling="process")
    assert meter.slowdown("process") == pytest.approx(0.3)
    assert meter.utilisation == 0.0 and meter.weight("process") == 0.0, "an idle path pays none"
    assert meter.weight("thread") == 0.5, "each compile mode is measured on its own"
    busy[0] = 3600.0
    assert meter.utilisation == 1.0
    assert meter.weight("process") == pytest.approx(0.3)


def test_interference_meter_ignores_preemption_outliers_and_never_goes_negative() -> None:
    meter = InterferenceMeter(prior_weight=0.5, min_samples=3)
    for _ in range(3):
        meter.observe(0.0012, 0.001, compiling=None)
        meter.observe(0.0010, 0.001, compiling="thread")
    meter.observe(0.08, 0.001, compiling="thread")
    assert meter.slowdown("thread") == 0.0 and meter.weight("thread") == 0.0
    assert meter.snapshot("thread")["calls_while_compiling"] == {"thread": 3}


def test_interference_is_weighted_by_time_not_by_call() -> None:
    meter = InterferenceMeter(prior_weight=0.5, min_samples=2)
    for _ in range(2):
        meter.observe(0.020, 0.020, compiling=None)
        meter.observe(0.00005, 0.00005, compiling=None)
    for _ in range(10):
        meter.observe(0.00005, 0.00005, compiling="thread")
    meter.observe(0.030, 0.020, compiling="thread")
    assert meter.slowdown("thread") == pytest.approx((0.0305 / 0.0205) - 1.0)


def test_a_function_whose_specialisations_miss_the_acceptance_ratio_is_never_compiled() -> None:
    model = CostModel(0.8, 1.0, 60.0, compile_weight=lambda: 0.0, accept_ratio=0.95)
    state = key(11, 10.0, 20.0)
    assert model.benefit_ms(state) > 0.0
    model.observe_speedup(0.97)
    assert model.benefit_ms(state) == 0.0, "free compiles still gain nothing"


def test_in_place_judgements_replace_the_workers_timing_once_settled() -> None:
    model = CostModel(0.8, 1.0, 60.0, compile_weight=lambda: 0.0, accept_ratio=0.95)
    state = key(11, 10.0, 10.0)
    model.observe_speedup(0.5)
    assert model.speedup == pytest.approx(0.5) and model.measured and not model.settled
    for _ in range(IN_PLACE_MIN - 1):
        model.observe_in_place(0.9)
    assert model.speedup == pytest.approx(0.5), "too few judged keys to speak for a function"
    model.observe_in_place(0.9)
    assert model.settled and model.speedup == pytest.approx(0.9)
    assert model.benefit_ms(state) == pytest.approx(60 * 10.0 * 0.1)
    model.observe_speedup(0.2)
    assert model.speedup == pytest.approx(0.9), "a warm timing no longer moves the estimate"
    snap = model.snapshot()
    assert snap["judged_in_place"] == IN_PLACE_MIN and snap["validated"] == 2
    assert snap["in_place_speedup"] == pytest.approx(0.9)


def test_a_function_whose_kernels_compile_the_same_at_every_shape_is_never_compiled() -> None:
    model = CostModel(0.5, 0.0, 600.0, compile_weight=lambda: 0.0, accept_ratio=0.95, floor=1.0)
    state = key(1000, 10.0, 20.0)
    assert model.speedup == 1.0 and model.benefit_ms(state) == 0.0, "free compiles gain nothing"
    model.observe_speedup(0.5)
    assert model.speedup == 1.0, "a timing below what the loops allow is noise"
    assert model.snapshot()["floor"] == 1.0
    assert not model.can_pay(0.0), "no key's benefit can exceed the least one accepted"
    assert model.can_pay(-1.0), "unless a loss is accepted too"
    assert CostModel(0.5, 0.0, 600.0, accept_ratio=0.95).can_pay(0.0), "no floor, no verdict"


def test_a_warm_ratio_applies_to_the_warm_latency_an_in_place_one_to_the_streams() -> None:
    model = CostModel(0.8, 1.0, 60.0, compile_weight=lambda: 0.0, accept_ratio=0.95)
    state = key(11, 10.0, 0.065)
    assert model.benefit_ms(state) == pytest.approx(60 * 0.065 * 0.2), "no warm call seen yet"
    state.fastest_ms = 0.015
    assert model.benefit_ms(state) == pytest.approx(60 * 0.015 * 0.2)
    for _ in range(IN_PLACE_MIN):
        model.observe_in_place(0.9)
    assert model.benefit_ms(state) == pytest.approx(60 * 0.065 * 0.1)
