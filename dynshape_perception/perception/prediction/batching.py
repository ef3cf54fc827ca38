"""Variable-length agent histories: pad to [A, T_max] or pack to [S], whichever measures faster."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from dynshape_perception.errors import ConfigError, InputValueError, ShapeError
from dynshape_perception.stats import median

ModelFn = Callable[..., list[np.ndarray]]
LAYOUTS = ("pad", "pack")


@dataclass
class LayoutStats:
    """The latest ``calibration`` timings per layout (bounded: a node runs for days), and
    how often each layout was timed in all."""

    calibration: int
    samples: dict[str, deque[float]] = field(init=False)
    timed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LAYOUTS, 0))
    calls: int = 0

    def __post_init__(self) -> None:
        self.samples = {k: deque(maxlen=self.calibration) for k in LAYOUTS}

    def add(self, layout: str, ms: float) -> None:
        self.samples[layout].append(ms)
        self.timed[layout] += 1

    def choice(self) -> str | None:
        """The faster layout once both have ``calibration`` samples; None while calibrating."""
        if any(len(v) < self.calibration for v in self.samples.values()):
            return None
        return min(LAYOUTS, key=lambda k: median(self.samples[k]))


class HistoryBatcher:
    """Encodes agent histories with the predictor's ``encode`` or ``encode_packed``.

    Batches are classed by agent count, padding waste (A x T_max / S) and size (S), each in
    powers of two: a layout timed on short histories says nothing of long ones. Each class
    alternates layouts until both have been timed ``calibration`` times, then uses the faster
    one, re-timing both every ``recalibrate_every`` calls so drift is caught.
    """

    def __init__(
        self, predictor: ModelFn, calibration: int = 3, recalibrate_every: int = 200
    ) -> None:
        if calibration < 1 or recalibrate_every < 1:
            raise ConfigError(
                f"calibration and recalibrate_every must be >= 1, got {calibration}, "
                f"{recalibrate_every}"
            )
        self._predictor = predictor
        self.calibration = calibration
        self.recalibrate_every = recalibrate_every
        self.stats: dict[tuple[int, int, int], LayoutStats] = {}

    @staticmethod
    def shape_class(lengths: np.ndarray) -> tuple[int, int, int]:
        total = int(lengths.sum())
        waste = lengths.size * int(lengths.max()) / max(total, 1)
        return (
            math.ceil(math.log2(max(lengths.size, 1))),
            round(math.log2(waste)),
            round(math.log2(max(total, 1))),
        )

    def layout_for(self, lengths: np.ndarray) -> str:
        stats = self.stats.setdefault(self.shape_class(lengths), LayoutStats(self.calibration))
        stats.calls += 1
        chosen = stats.choice()
        if chosen is None or stats.calls % self.recalibrate_every == 0:
            return min(LAYOUTS, key=lambda k: stats.timed[k])
        return chosen

    def encode(self, histories: Sequence[np.ndarray]) -> list[np.ndarray]:
        """State (hidden, last_pos, last_disp) of every history, oldest sample first."""
        histories = [np.asarray(h, np.float32) for h in histories]
        for h in histories:
            # Padding would broadcast a 1-D history into rows of one sample: a wrong answer.
            if h.ndim != 2 or h.shape[1] != 2:
                raise ShapeError(f"a history must be [n, 2] positions, got shape {h.shape}")
        lengths = np.asarray([len(h) for h in histories], np.int32)
        if lengths.size == 0:
            return self._predictor("encode", np.zeros((0, 1, 2), np.float32), lengths)
        if lengths.min() < 1:
            raise InputValueError("every history needs at least one sample")
        layout = self.layout_for(lengths)
        started = time.perf_counter()
        if layout == "pack":
            points = np.concatenate(histories)
            state = self._predictor("encode_packed", points, lengths)
        else:
            batch = np.zeros((lengths.size, int(lengths.max()), 2), np.float32)
            for a, h in enumerate(histories):
                batch[a, : len(h)] = h
            state = self._predictor("encode", batch, lengths)
        elapsed = (time.perf_counter() - started) * 1000.0
        self.stats[self.shape_class(lengths)].add(layout, elapsed)
        return state

    def report(self) -> dict[str, dict[str, float | str | None]]:
        out: dict[str, dict[str, float | str | None]] = {}
        for (a_cls, waste_cls, size_cls), st in sorted(self.stats.items()):
            out[f"A<=2^{a_cls},waste~2^{waste_cls},S~2^{size_cls}"] = {
                "pad_ms": median(st.samples["pad"]) if st.samples["pad"] else None,
                "pack_ms": median(st.samples["pack"]) if st.samples["pack"] else None,
                "choice": st.choice(),
            }
        return out
