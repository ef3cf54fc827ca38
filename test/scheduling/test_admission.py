"""Admission under a changing load: no tier is refused for good, on a fake clock."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynshape_perception.scheduling.executor import Arrival, TieredExecutor, diagnostic_status
from dynshape_perception.scheduling.lidar_tiers import since
from dynshape_perception.scheduling.tiers import Tier, TierConfig
from dynshape_perception.testing.clocks import FakeClock

# The lidar node's shape of work: a frame's tier-1 job runs first, then its tier-2 job is
# submitted with the frame's arrival; the tier-2 job runs in chunks of about this length.
SUBMIT_AFTER_MS = 15.0
CHUNK_MS = 5.0
FULL_CLOUD = "full_cloud"


def chunked_cloud(clock: FakeClock, ms: float) -> Callable[[], Generator[None, None, float]]:
    """A full-cloud job of ``ms`` (fake time) in chunks of ``CHUNK_MS``."""

    def job() -> Generator[None, None, float]:
        left = ms
        while left > 0.0:
            step = min(CHUNK_MS, left)
            clock.advance_ms(step)
            left -= step
            yield
        return ms

    return job


def near_field(clock: FakeClock) -> Callable[[], None]:
    def job() -> None:
        clock.advance_ms(SUBMIT_AFTER_MS)

    return job


class LidarLoop:
    """Frames at a fixed period through one reserved and one shared lane, on one fake clock.

    The shared lane works until the next frame is due; a frame's tier-1 job then runs at
    once, and its tier-2 job is submitted ``SUBMIT_AFTER_MS`` after its arrival.
    """

    def __init__(self, executor: TieredExecutor, clock: FakeClock, period_ms: float) -> None:
        self.executor = executor
        self.clock = clock
        self.period_ms = period_ms
        self.due = clock.now
        self.futures: list[Future[float]] = []

    def frame(self, cost_ms: float, points: int | None) -> Future[float]:
        ex, clock = self.executor, self.clock
        while clock.now < self.due and ex.run_one("shared"):
            pass
        clock.now = max(clock.now, self.due)
        arrival = Arrival("points", clock.now)
        ex.submit(near_field(clock), Tier.COLLISION, arrival=arrival, name="near_field")
        assert ex.run_one("reserved")
        future = ex.submit(
            chunked_cloud(clock, cost_ms),
            Tier.PLANNING,
            arrival=arrival,
            name=FULL_CLOUD,
            size=points,
        )
        self.futures.append(future)
        self.due += self.period_ms / 1000.0
        return future

    def finish(self) -> None:
        while self.clock.now < self.due and self.executor.run_one("shared"):
            pass

    def completed(self, futures: Sequence[Future[float]]) -> list[bool]:
        return [f.done() and not f.cancelled() and f.exception() is None for f in futures]


def tiered(clock: FakeClock, **changes: object) -> TieredExecutor:
    return TieredExecutor(TierConfig().with_changes(changes), clock=clock, start=False)


@pytest.mark.parametrize(
    "sizes",
    [(None, None, None), (150_000, 100_000, 60_000)],
    ids=["one-estimate-for-all-sizes", "sizes-given"],
)
def test_cheap_frames_are_admitted_again_after_a_run_of_expensive_ones(
    sizes: tuple[int | None, int | None, int | None],
) -> None:
    """Three 200 ms clouds, six of 60 ms, then twenty of 40 ms, one frame every 0.5 s.

    The 60 ms clouds bring a single estimate to about 97 ms: just under the 100 ms budget,
    so the 15 ms before submission made every later frame look late, however cheap, and
    a refused frame never ran to correct it.
    """
    clock = FakeClock()
    ex = tiered(clock)
    loop = LidarLoop(ex, clock, period_ms=500.0)
    big, medium, small = sizes
    for _ in range(3):
        loop.frame(200.0, big)
    for _ in range(6):
        loop.frame(60.0, medium)
    cheap = [loop.frame(40.0, small) for _ in range(20)]
    loop.finish()
    done = loop.completed(cheap)
    refused = done.index(True) if True in done else len(done)
    assert refused <= ex.config.starvation_frames, f"40 ms clouds served: {done}"
    assert all(done[refused:]), f"40 ms clouds served: {done}"
    assert ex.estimate_ms(FULL_CLOUD, small) == pytest.approx(40.0, abs=5.0)


def test_a_tier_refused_for_n_frames_gets_its_newest_frame_and_an_error() -> None:
    """An estimate the caller pins (never learnt) cannot decay: the starvation rule alone
    must let the tier run, and the diagnostics say which tier starved."""
    clock = FakeClock()
    ex = tiered(clock, starvation_frames=4)
    before = ex.snapshot()
    outcomes = []
    for _ in range(10):
        arrival = Arrival("points", clock.now)
        clock.advance_ms(SUBMIT_AFTER_MS)
        future = ex.submit(
            chunked_cloud(clock, 20.0), Tier.PLANNING, arrival=arrival, name=FULL_CLOUD, est_ms=99.0
        )
        while ex.run_one("shared"):
            pass
        outcomes.append(not future.cancelled() and future.exception() is None)
        clock.advance_ms(500.0)
    # Refused while the tier has completed something within the last 4 frames.
    assert outcomes == [False] * 4 + [True] + [False] * 4 + [True]
    tier2 = ex.snapshot()["tiers"]["2"]
    assert tier2["starvations"] == 2 and tier2["dropped_by"]["admission"] == 8
    level, message, values = diagnostic_status(since(ex.snapshot(), before))
    assert level == 2 and "tier 2 (planning) starved" in message
    assert ("tier2.planning.starvations", "2") in values
    # A period in which the tier completed its frames is no error.
    quiet = ex.snapshot()
    assert diagnostic_status(since(ex.snapshot(), quiet))[0] < 2


def test_a_starving_tier_is_an_error_while_it_lasts() -> None:
    clock = FakeClock()
    ex = tiered(clock, starvation_frames=3, max_queue_depth=1)
    # No lane runs: one unit waits, and the three after it find the queue full.
    for _ in range(4):
        ex.submit(lambda: None, Tier.COMFORT)
    assert ex.snapshot()["tiers"]["3"]["starved"]
    level, message, _ = diagnostic_status(ex.snapshot())
    assert level == 2 and "tier 3 (comfort) starved" in message


LOADS = st.lists(
    st.tuples(st.integers(1_000, 150_000), st.floats(0.0, 2.0)), min_size=1, max_size=40
)


@settings(max_examples=150, deadline=None)
@given(
    overload=LOADS,
    recovery=st.lists(
        st.tuples(st.integers(1_000, 150_000), st.floats(0.05, 0.6)), min_size=30, max_size=30
    ),
    period_ms=st.sampled_from([50.0, 100.0, 200.0, 500.0]),
    sized=st.booleans(),
)
def test_tier_two_completes_again_soon_after_any_overload(
    overload: list[tuple[int, float]],
    recovery: list[tuple[int, float]],
    period_ms: float,
    sized: bool,
) -> None:
    """Random cloud sizes and costs at loads up to 2x the frame period, then a load that fits
    the budget (1x): within a bounded number of frames tier 2 completes, and keeps doing so."""
    clock = FakeClock()
    ex = tiered(clock)
    loop = LidarLoop(ex, clock, period_ms)
    budget_ms = ex.config.planning_deadline_ms - SUBMIT_AFTER_MS
    overloaded = [
        loop.frame(load * period_ms, points if sized else None) for points, load in overload
    ]
    # 1x: each frame's cost fits both its period and its budget after submission.
    fits_ms = min(period_ms - SUBMIT_AFTER_MS, budget_ms)
    after: list[Future[float]] = []
    # The first frame submitted once no overloaded unit runs: those before it can only wait
    # behind one and give way to the next (stale), which no starvation count can shorten.
    free: int | None = None
    for points, share in recovery:
        after.append(loop.frame(share * fits_ms, points if sized else None))
        if free is None and all(f.done() for f in overloaded):
            free = len(after) - 1
    loop.finish()
    done = loop.completed(after)
    bound = ex.config.starvation_frames + 1
    assert free is not None, "an overloaded unit still ran after every recovery frame"
    assert any(done[free : free + bound]), (
        f"no tier-2 completion in {bound} frames from frame {free}: {done}"
    )
    runs = "".join("x" if ok else "-" for ok in done).split("x")
    assert max(len(r) for r in runs) <= bound, f"tier 2 refused a run of frames: {done}"
