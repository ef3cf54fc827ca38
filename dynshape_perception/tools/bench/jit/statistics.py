"""What the bench's runs mean: p99 while compiling, paired ratios, extrapolation, rows."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

from dynshape_perception.stats import geomean_row, masked_percentile, median, percentile, verdict
from dynshape_perception.tools.bench.jit.stream import Call, Outcome

# The p99-while-compiling target: the runtime's p99 at most this times generic's.
P99_TARGET = 1.1


def paired_with_generic(
    stream: list[Call],
    jit_ms: np.ndarray,
    generic_ms: np.ndarray,
    served: np.ndarray,
    during: np.ndarray,
) -> dict[str, dict[str, float]]:
    """The runtime's service time over generic's on the very same calls, by model, by how the
    runtime served them and by whether a compile was pending: where a total difference lies."""
    predictor = np.asarray([c.model == "predictor" for c in stream])
    groups = {
        "predictor_specialised_idle": predictor & served & ~during,
        "predictor_specialised_compiling": predictor & served & during,
        "predictor_generic_idle": predictor & ~served & ~during,
        "predictor_generic_compiling": predictor & ~served & during,
        "segmenter_idle": ~predictor & ~during,
        "segmenter_compiling": ~predictor & during,
    }
    out: dict[str, dict[str, float]] = {}
    for name, mask in groups.items():
        if mask.any():
            out[name] = {
                "calls": int(mask.sum()),
                "generic_mean_ms": round(float(generic_ms[mask].mean()), 4),
                "ratio": round(float(jit_ms[mask].sum() / generic_ms[mask].sum()), 3),
            }
    return out


def while_compiling(
    jit_ms: np.ndarray,
    during: np.ndarray,
    whole_runs: Mapping[str, np.ndarray],
    adjacent_runs: Mapping[str, np.ndarray],
) -> dict[str, Any]:
    """p99 of the calls served while compiles were queued or running, beside the generic
    runs' p99 on the very same calls: the pair the "no worse while compiling" target compares.

    ``whole_runs`` are the generic passes over the whole stream, whose first calls ran minutes
    from the runtime's; two of them give this figure's own run-to-run spread.
    ``adjacent_runs`` replayed the stream's first calls just before and after it, and are
    compared over the pending calls among those (``calls_outside`` are not).
    """
    row: dict[str, Any] = {"calls": int(during.sum())}
    if not during.any():
        return row
    p99 = masked_percentile(jit_ms, during, 99)
    row["p99_ms"] = round(p99, 3)
    for name, ms in whole_runs.items():
        if len(ms) == len(jit_ms):
            ref = masked_percentile(ms, during, 99)
            row[f"{name}_p99_same_calls_ms"] = round(ref, 3)
            row[f"ratio_to_{name}"] = round(p99 / ref, 3)
    window = min((len(ms) for ms in adjacent_runs.values()), default=0)
    head = during[:window]
    if not head.any():
        return row
    near = masked_percentile(jit_ms, head, 99)
    adjacent: dict[str, Any] = {
        "window_calls": window,
        "calls": int(head.sum()),
        "calls_outside": int(during.sum() - head.sum()),
        "p99_ms": round(near, 3),
    }
    for name, ms in adjacent_runs.items():
        ref = masked_percentile(ms, head, 99)
        adjacent[f"{name}_p99_ms"] = round(ref, 3)
        adjacent[f"ratio_to_{name}"] = round(near / ref, 3)
    row["adjacent"] = adjacent
    return row


def while_compiling_repeated(
    runs: list[tuple[Outcome, np.ndarray]], generic_runs: list[Outcome]
) -> dict[str, Any]:
    """Cold starts of the runtime (outcome, pending mask) interleaved with generic passes over
    the same calls (one more, first and between every two).

    Each start's p99 over its pending calls is set against the mean of its two neighbours'
    p99 on those calls; the neighbours' own ratio is the figure's spread with no runtime in
    it. Over the starts, the geometric mean of the ratios and its 95 % bootstrap interval
    judge the target: met where the interval lies at or below ``P99_TARGET``, missed where
    it lies above, undecided where it straddles it. Service times (no queueing) are compared
    the same way: what compiling did to the calls themselves.
    """
    ratios: list[float] = []
    service: list[float] = []
    aa: list[float] = []
    calls: list[int] = []
    for i, (runtime, during) in enumerate(runs):
        calls.append(int(during.sum()))
        if not during.any():
            continue
        # The runtime's p99, then its two neighbours', over the pending calls.
        passes = (runtime, *generic_runs[i : i + 2])
        lat = [masked_percentile(np.asarray(o.latencies_ms), during, 99) for o in passes]
        svc = [masked_percentile(np.asarray(o.service_ms), during, 99) for o in passes]
        ratios.append(round(lat[0] / ((lat[1] + lat[2]) / 2), 3))
        service.append(round(svc[0] / ((svc[1] + svc[2]) / 2), 3))
        aa.append(round(lat[2] / lat[1], 3))
    row: dict[str, Any] = {
        "window_calls": len(generic_runs[0].latencies_ms),
        "pending_calls": calls,
        "ratios": ratios,
        "service_ratios": service,
        "generic_aa": aa,
    }
    if not ratios:
        return row
    row["median_ratio"] = round(median(ratios), 3)
    for name, values in (("", ratios), ("service_", service), ("generic_aa_", aa)):
        row.update({f"{name}{k}": v for k, v in geomean_row(values, 3).items()})
    row["target"] = P99_TARGET
    row["verdict"] = verdict(row["ci95"], P99_TARGET)
    row["service_verdict"] = verdict(row["service_ci95"], P99_TARGET)
    return row


def busy_repeated(runs: list[Outcome], generic_runs: list[Outcome]) -> dict[str, Any]:
    """Each cold start's busy time over the mean of its two generic neighbours', and the 95 %
    interval of their geometric mean: the total-time comparison, interleaved and repeated
    over the stream's first calls (where every compile of a cold start runs). ``verdict``
    says whether the runtime took less than generic: ``met`` only if the whole interval is
    below 1."""
    ratios = [
        round(run.total_s / ((before.total_s + after.total_s) / 2), 4)
        for run, before, after in zip(runs, generic_runs, generic_runs[1:], strict=False)
    ]
    row: dict[str, Any] = {"ratios": ratios}
    if ratios:
        row.update(geomean_row(ratios, 4))
        # Strictly below: a tie is not a win.
        row["verdict"] = verdict(row["ci95"], 1.0 - 1e-9)
    return row


def compile_summary(events: list[Any]) -> dict[str, dict[str, Any]]:
    """Per model: compiles published, rejected as not faster, failed; specialisations demoted
    after serving; mean compile time."""
    out: dict[str, dict[str, Any]] = {}
    for e in events:
        row = out.setdefault(
            e.model, {"ok": 0, "rejected": 0, "failed": 0, "demoted": 0, "compile_s": 0.0}
        )
        if e.reason.startswith("demoted"):
            row["demoted"] += 1
            continue
        kind = "failed" if not e.ok else "rejected" if e.rejected else "ok"
        row[kind] += 1
        row["compile_s"] += e.compile_s
    for row in out.values():
        n = row["ok"] + row["rejected"] + row["failed"]
        row["mean_compile_s"] = round(row.pop("compile_s") / max(n, 1), 3)
    return out


def extrapolate(
    outcome: Outcome,
    stream: list[Call],
    compile_s: Mapping[str, float],
    compiles: Mapping[str, int],
) -> Outcome:
    """Past the compile budget of exact compiles: project the remaining calls at the observed
    rates, with one more compile per exact signature not seen yet, at its model's measured
    mean compile time (models compile at different speeds, and in other shares later on).

    Latencies and hit rates stay those of the served calls (``measured_on_served_calls``).
    """
    served = outcome.served_calls
    per_call = (outcome.total_s - outcome.calling_thread_compile_s) / served
    remaining = len(stream) - served
    seen = {c.signature for c in stream[:served]}
    new = {c.signature for c in stream[served:]} - seen
    new_by_model = Counter(model for model, _ in new)
    overall = sum(compile_s.values()) / max(sum(compiles.values()), 1)
    extra_compile_s = sum(
        n * (compile_s[m] / compiles[m] if compiles.get(m) else overall)
        for m, n in new_by_model.items()
    )
    outcome.extra = {
        "served_calls": served,
        "extrapolated_remaining_calls": remaining,
        "extrapolated_new_signatures": len(new),
        "extrapolated_new_signatures_by_model": dict(sorted(new_by_model.items())),
        "mean_compile_s_by_model": {
            m: round(compile_s[m] / n, 3) for m, n in sorted(compiles.items()) if n
        },
        "measured_total_s": round(outcome.total_s, 3),
        "measured_wall_s": round(outcome.wall_s, 3),
        "measured_compile_s": round(outcome.calling_thread_compile_s, 3),
        "measured_on_served_calls": [
            "p50_ms",
            "p99_ms",
            "max_ms",
            "hit_rate",
            "hit_rate_ever_accepted",
            "specialised_share",
        ],
    }
    outcome.total_s += remaining * per_call + extra_compile_s
    outcome.wall_s += remaining * per_call + extra_compile_s
    outcome.calling_thread_compile_s += extra_compile_s
    outcome.compiles += len(new)
    outcome.extrapolated = True
    return outcome


def summarise(outcome: Outcome, jit: bool) -> dict[str, Any]:
    lat = np.asarray(outcome.latencies_ms)
    n = len(lat)
    half = slice(n // 2, None)
    accepted = np.asarray(outcome.accepted[half], bool)
    special = np.asarray(outcome.served_special[half], bool)
    # Undefined (None), not 0, where no call was accepted: nothing was there to hit.
    hit_rate = float(special[accepted].mean()) if accepted.any() else None
    ever = np.asarray((outcome.ever_accepted or outcome.accepted)[half], bool) | accepted
    hit_rate_ever = float(special[ever].mean()) if ever.any() else None
    row: dict[str, Any] = {
        "p50_ms": round(percentile(lat, 50), 3),
        "p99_ms": round(percentile(lat, 99), 3),
        "max_ms": round(float(lat.max()), 3),
        "total_s": round(outcome.total_s, 3),
        "wall_s": round(outcome.wall_s, 3),
        "busy_by_model_s": {m: round(v, 3) for m, v in outcome.busy_by_model_s.items()},
        "compiles": outcome.compiles,
        "calling_thread_compile_s": round(outcome.calling_thread_compile_s, 3),
        "hit_rate": None if hit_rate is None else round(hit_rate, 4),
        "hit_rate_ever_accepted": None if hit_rate_ever is None else round(hit_rate_ever, 4),
        "specialised_share": round(float(np.mean(outcome.served_special)), 4),
        "extrapolated": outcome.extrapolated,
    }
    row.update(outcome.extra)
    return row
