"""Deadline-aware executors: tiered (strict priority, EDF, a reserved tier-1 lane) and FIFO."""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

from dynshape_perception.errors import SchedulingError
from dynshape_perception.scheduling.executor_base import ExecutorBase
from dynshape_perception.scheduling.tiers import TIERS, Tier
from dynshape_perception.scheduling.work import (
    COST_SMOOTHING,
    DROP_REASONS,
    Arrival,
    ExecutorOptions,
    Lane,
    Work,
)

# How many more replaced units than queued ones a heap may hold before it is rebuilt.
_HEAP_SLACK = 32

__all__ = [
    "COST_SMOOTHING",
    "DROP_REASONS",
    "Arrival",
    "ExecutorOptions",
    "FifoExecutor",
    "TieredExecutor",
    "diagnostic_status",
]


class TieredExecutor(ExecutorBase):
    """Strict priority across tiers, EDF within one; reserved lanes serve tier 1 only.

    Shared lanes serve every tier, tier 1 first. Work split into chunks (generators) goes
    back to the queue after every chunk, so a chunk is the longest a higher tier can wait
    on a shared lane. Tier-1 work pauses the background compile pools while it runs.
    """

    kind = "tiered"

    def _init_queue(self) -> None:
        self._heaps: dict[Tier, list[tuple[float, int, Work]]] = {t: [] for t in TIERS}
        # The queued units by sequence number: a replaced unit stays in its heap until a lane
        # pops it, and a tier that rarely runs would make every walk of its heap longer.
        self._live: dict[Tier, dict[int, Work]] = {t: {} for t in TIERS}
        self._by_stream: dict[str, Work] = {}
        self._latest: dict[str, int] = {}
        self._degraded = False
        self._degraded_since = 0.0
        self._degraded_total_s = 0.0
        self._degraded_entries = 0
        self._last_trouble_s = float("-inf")

    def _lanes(self) -> list[Lane]:
        reserved: list[Lane] = ["reserved"] * self.options.reserved_workers
        shared: list[Lane] = ["shared"] * self.options.shared_workers
        return reserved + shared

    @property
    def degraded(self) -> bool:
        with self._cv:
            self._update_degrade_locked(self._clock())
            return self._degraded

    def far_field_keep_fraction(self) -> float:
        return self.config.far_field_keep_fraction if self.degraded else 1.0

    def _push_locked(self, work: Work) -> None:
        work.state = "queued"
        heapq.heappush(self._heaps[work.tier], (work.deadline_s, work.seq, work))
        self._live[work.tier][work.seq] = work
        # A started unit finishes: were a newer frame to cancel it, a unit that takes longer
        # than the frame period would never complete. Only a waiting unit is replaced.
        if work.stream is not None and work.gen is None:
            self._by_stream[work.stream] = work

    def _unlink_locked(self, work: Work) -> None:
        del self._live[work.tier][work.seq]
        if work.stream is not None and self._by_stream.get(work.stream) is work:
            del self._by_stream[work.stream]

    def _compact_locked(self, tier: Tier) -> None:
        """Drop the replaced units from the tier's heap once they outnumber its queued ones by
        more than ``_HEAP_SLACK``."""
        heap, live = self._heaps[tier], self._live[tier]
        if len(heap) > 2 * len(live) + _HEAP_SLACK:
            heap[:] = [entry for entry in heap if entry[1] in live]
            heapq.heapify(heap)

    def _admit_locked(self, work: Work, now: float) -> tuple[str | None, list[Work]]:
        self._update_degrade_locked(now)
        if work.speculative and self._degraded:
            return "degraded", []
        old = self._by_stream.get(work.stream) if work.stream is not None else None
        if work.tier != Tier.COLLISION:
            depth = len(self._live[work.tier]) - (1 if old is not None else 0)
            if depth >= self.config.max_queue_depth:
                return "admission", []
            if (
                self.config.shed_infeasible
                and self._fits_alone_locked(work)
                and not self._starved_locked(work.tier)
            ):
                ahead = sum(
                    self._est_locked(w)
                    for w in self._queued_locked()
                    if w.tier != Tier.COLLISION and w.tier <= work.tier and w is not old
                )
                own_s = self._est_locked(work) / 1e3
                if now + ahead / self.options.shared_workers / 1e3 + own_s > work.deadline_s:
                    if now + own_s > work.deadline_s:
                        self._decay_locked(work)
                    return "admission", []
        displaced: list[Work] = []
        if old is not None:
            self._unlink_locked(old)
            self._compact_locked(old.tier)
            displaced.append(old)
        if work.stream is not None:
            self._latest[work.stream] = work.seq
        self._push_locked(work)
        return None, displaced

    def _pop_locked(self, lane: Lane, now: float) -> tuple[Work | None, list[tuple[Work, str]]]:
        self._update_degrade_locked(now)
        shed: list[tuple[Work, str]] = []
        if lane == "reserved":
            tiers: tuple[Tier, ...] = (Tier.COLLISION,)
        elif self._idle_reserved:
            # Tier 1 is woken for (every submit notifies all lanes): a shared lane that took
            # it would hold back the lower tier queued beside it while a reserved lane idles.
            tiers = TIERS[1:]
        else:
            tiers = TIERS
        for tier in tiers:
            heap = self._heaps[tier]
            while heap:
                _, _, work = heapq.heappop(heap)
                if work.state != "queued":
                    continue
                self._unlink_locked(work)
                reason = self._dispatch_drop_locked(work, now)
                if reason is None:
                    work.state = "running"
                    return work, shed
                work.state = "dropped"
                shed.append((work, reason))
        return None, shed

    def _dispatch_drop_locked(self, work: Work, now: float) -> str | None:
        if (
            work.gen is None
            and work.stream is not None
            and self._latest.get(work.stream, work.seq) > work.seq
        ):
            return "stale"
        if work.speculative and self._degraded:
            return "degraded"
        if (
            work.tier != Tier.COLLISION
            and self.config.shed_expired
            and work.gen is None
            and self._fits_alone_locked(work)
            and not self._starved_locked(work.tier)
            and now + self._est_locked(work) / 1e3 > work.deadline_s
        ):
            return "expired"
        return None

    def _fits_alone_locked(self, work: Work) -> bool:
        """Whether the unit meets its deadline when started on arrival.

        Feasibility shedding applies to these only. A unit whose estimate exceeds its whole
        budget would otherwise never run again (and never refresh its estimate); it runs
        late, counted as a miss, and newest-wins bounds how many wait. A started unit is
        never shed for time either: its cost is sunk, and a newer frame drops it as stale.
        """
        return self._est_locked(work) <= self.config.deadline_ms(work.tier)

    def _requeue_locked(self, work: Work, now: float) -> str | None:
        if self._closed:
            return "shutdown"
        self._push_locked(work)
        self._wake_locked(work.tier == Tier.COLLISION)
        return None

    def _queued_locked(self) -> list[Work]:
        return [w for live in self._live.values() for w in live.values()]

    def _drain_queue_locked(self) -> list[Work]:
        queued = self._queued_locked()
        for heap in self._heaps.values():
            heap.clear()
        for live in self._live.values():
            live.clear()
        self._by_stream.clear()
        return queued

    def _on_trouble_locked(self, tier: Tier, now: float) -> None:
        if tier != Tier.COLLISION:
            self._last_trouble_s = now
            self._update_degrade_locked(now)

    def _update_degrade_locked(self, now: float) -> None:
        backlog = sum(self._est_locked(w) for w in self._queued_locked() if w.tier > 1)
        backlog /= self.options.shared_workers
        recent = now - self._last_trouble_s < self.config.degrade_hold_s
        if not self._degraded and (backlog > self.config.degrade_enter_backlog_ms or recent):
            self._degraded = True
            self._degraded_since = now
            self._degraded_entries += 1
        elif self._degraded and backlog < self.config.degrade_exit_backlog_ms and not recent:
            self._degraded = False
            self._degraded_total_s += now - self._degraded_since

    def _extra_snapshot_locked(self) -> dict[str, Any]:
        now = self._clock()
        self._update_degrade_locked(now)
        total = self._degraded_total_s + (now - self._degraded_since if self._degraded else 0.0)
        return {
            "degraded": self._degraded,
            "degraded_entries": self._degraded_entries,
            "degraded_s": round(total, 3),
        }


class FifoExecutor(ExecutorBase):
    """The baseline: one first-in first-out queue, every lane serves it, no tiers.

    Units still carry a tier and a deadline so that misses are counted the same way; the
    only shedding is tail drop at ``max_queue_depth`` (the depth of a ROS subscription queue).
    """

    kind = "fifo"
    # FIFO knows no tiers: nothing boosts its lanes or pauses compiles.
    boosts_for_tier1 = False
    pauses_pools_for_tier1 = False

    def _init_queue(self) -> None:
        self._queue: deque[Work] = deque()

    def _lanes(self) -> list[Lane]:
        total = self.options.reserved_workers + self.options.shared_workers
        return ["shared"] * total

    def _chunked(self) -> bool:
        return False

    def _admit_locked(self, work: Work, now: float) -> tuple[str | None, list[Work]]:
        if len(self._queue) >= self.config.max_queue_depth:
            return "admission", []
        self._queue.append(work)
        return None, []

    def _pop_locked(self, lane: Lane, now: float) -> tuple[Work | None, list[tuple[Work, str]]]:
        if not self._queue:
            return None, []
        work = self._queue.popleft()
        work.state = "running"
        return work, []

    def _requeue_locked(self, work: Work, now: float) -> str | None:
        raise SchedulingError("the FIFO executor runs every unit to completion")

    def _queued_locked(self) -> list[Work]:
        return list(self._queue)

    def _drain_queue_locked(self) -> list[Work]:
        queued = list(self._queue)
        self._queue.clear()
        return queued


Executor = TieredExecutor | FifoExecutor


def diagnostic_status(snapshot: dict[str, Any]) -> tuple[int, str, list[tuple[str, str]]]:
    """``/diagnostics`` level (0 OK, 1 WARN, 2 ERROR), message and key-value pairs."""
    values: list[tuple[str, str]] = []
    tier1_misses = 0
    lower_losses = 0
    starved: list[str] = []
    keys = ("deadline_ms", "completed", "misses", "dropped", "failed", "queued", "p99_ms")
    for key, st in snapshot["tiers"].items():
        prefix = f"tier{key}.{st['name']}"
        for name in (*keys, "starvations"):
            values.append((f"{prefix}.{name}", str(st.get(name, 0))))
        if st.get("starved") or st.get("starvations"):
            starved.append(f"tier {key} ({st['name']}) starved")
        for reason, count in st["dropped_by"].items():
            values.append((f"{prefix}.dropped.{reason}", str(count)))
        if key == "1":
            tier1_misses = st["misses"] + st["failed"]
        else:
            lower_losses += st["misses"] + st["dropped"] - st["dropped_by"]["stale"]
    for topic, tr in snapshot.get("transport", {}).items():
        values.append((f"transport.{topic}.p99_ms", str(tr["p99_ms"])))
    if "degraded" in snapshot:
        values.append(("degraded", str(snapshot["degraded"])))
    errors = [f"tier 1 missed or failed {tier1_misses} deadline(s)"] if tier1_misses else []
    if starved:
        errors.append(", ".join(starved) + ": refused or expired frames with none completed")
    if errors:
        return 2, "; ".join(errors), values
    if lower_losses or snapshot.get("degraded"):
        return 1, f"lower tiers shed or missed {lower_losses} unit(s)", values
    return 0, "all deadlines met", values
