"""The printed report of ``bench jit``."""

from __future__ import annotations

import json
from typing import Any


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _interval(mean: float, ci95: list[float] | None) -> str:
    spread = "no interval from one start" if ci95 is None else f"x{ci95[0]:.3f}-x{ci95[1]:.3f}"
    return f"x{mean:.3f} (95 % CI {spread})"


def print_report(results: dict[str, Any], strategies: tuple[str, ...]) -> None:
    """The results as text: a row per strategy, then what each figure beside them says."""
    print(json.dumps(results["stream"]))
    print(
        f"{'strategy':<15}{'p50_ms':>9}{'p99_ms':>9}{'max_ms':>10}{'total_s':>9}{'compiles':>9}"
        f"{'thread_compile_s':>17}{'hit_rate':>9}{'spec_share':>11}"
    )
    for name in strategies:
        r = results[name]
        mark = (
            f" (extrapolated; latencies and hit rate over its {r['served_calls']} served calls)"
            if r["extrapolated"]
            else ""
        )
        print(
            f"{name:<15}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}{r['max_ms']:>10.1f}{r['total_s']:>9.1f}"
            f"{r['compiles']:>9}{r['calling_thread_compile_s']:>17.1f}{_rate(r['hit_rate']):>9}"
            f"{r['specialised_share']:>11.3f}{mark}"
        )
    for name in strategies:
        busy = ", ".join(f"{m} {v:.2f}" for m, v in results[name]["busy_by_model_s"].items())
        print(f"busy s {name:<15}{busy}")
    for name in ("jit", "jit_warm"):
        if name in results:
            now, ever = results[name]["hit_rate"], results[name]["hit_rate_ever_accepted"]
            print(
                f"hit rate {name:<9}{_rate(now)} over keys accepted at the call, "
                f"{_rate(ever)} counting keys whose compile later failed, lost or was demoted"
                + (" (n/a: no such call in the second half)" if None in (now, ever) else "")
            )
    for model, belief in results.get("jit", {}).get("cost_model", {}).items():
        in_place = belief["in_place_speedup"]
        print(
            f"cost model {model:<10}expects x{belief['speedup']:.3f}: workers timed "
            f"x{belief['validated_speedup']:.3f} over {belief['validated']} builds, "
            + (
                f"x{in_place:.3f} judged in place over {belief['judged_in_place']}"
                if in_place is not None
                else "none judged in place"
            )
        )
    pending = results.get("jit", {}).get("while_compiling", {})
    if "p99_ms" in pending:
        refs = ", ".join(
            f"{name} {pending[f'{name}_p99_same_calls_ms']:.1f} ms "
            f"(x{pending[f'ratio_to_{name}']:.3f})"
            for name in ("generic", "generic_repeat")
            if f"ratio_to_{name}" in pending
        )
        print(
            f"while compiling ({pending['calls']} calls): runtime p99 "
            f"{pending['p99_ms']:.1f} ms; {refs}"
        )
        near = pending.get("adjacent")
        if near:
            print(
                f"  first {near['window_calls']} calls replayed generic just before and after "
                f"({near['calls']} pending calls, {near['calls_outside']} later ones left out): "
                f"runtime p99 {near['p99_ms']:.1f} ms, x{near['ratio_to_generic_before']:.3f} "
                f"and x{near['ratio_to_generic_after']:.3f}"
            )
    repeated = results.get("jit", {}).get("while_compiling_repeated")
    if repeated:
        ratios = ", ".join(f"x{r:.3f}" for r in repeated["ratios"]) or "none (nothing pending)"
        aa = ", ".join(f"x{r:.3f}" for r in repeated["generic_aa"]) or "none"
        median = f" (median x{repeated['median_ratio']:.3f})" if "median_ratio" in repeated else ""
        print(
            f"while compiling, repeated: {len(repeated['pending_calls'])} cold starts over the "
            f"first {repeated['window_calls']} calls at {repeated['rate_hz']} Hz (generic load "
            f"{repeated['generic_load']:.3f}), each between generic passes: runtime p99 "
            f"over the mean of its neighbours' {ratios}{median}; the neighbours' own ratio {aa}"
        )
        busy = repeated["busy"]
        if "geomean" in busy:
            print(
                f"  busy time over generic's on those calls, geometric mean "
                f"{_interval(busy['geomean'], busy['ci95'])}: below generic {busy['verdict']}"
            )
        if "geomean" in repeated:
            latency, service, spread = (
                _interval(repeated[f"{name}geomean"], repeated[f"{name}ci95"])
                for name in ("", "service_", "generic_aa_")
            )
            print(
                f"  p99 while compiling over generic's, geometric mean {latency}: "
                f"<= x{repeated['target']} {repeated['verdict']}; service time alone {service}: "
                f"{repeated['service_verdict']}; generic A/A {spread}"
            )
    for group, row in results.get("jit", {}).get("paired_with_generic", {}).items():
        print(f"same calls {group:<32}runtime/generic x{row['ratio']:.3f} ({row['calls']} calls)")
    if "jit_warm" in results:
        for order, row in results["jit_warm"]["locality"].items():
            print(f"locality {order:<18}runtime/generic predictor busy x{row['ratio']:.3f}")
        cost = results["jit_warm"]["dispatch_overhead"]
        if "cold" in cost:
            print(
                f"dispatch overhead ({cost['calls']} generic-served predictor calls, "
                f"{cost['signatures']} signatures): "
                f"cold x{cost['cold']:.3f} ({cost['cold_extra_us']:+.1f} us), "
                f"warm x{cost['warm']:.3f} ({cost['warm_extra_us']:+.1f} us)"
            )
    if "segmenter_exact" in results:
        ratios = ", ".join(f"P={p} x{r:.3f}" for p, r in results["segmenter_exact"].items())
        print(f"segmenter static exact-P build / generic: {ratios}")
    if "segmenter_roofline" in results:
        roof = results["segmenter_roofline"]
        print(
            f"segmenter generic build at P={roof['P']}: {roof['generic_gflops']:.1f} GFLOP/s on "
            f"{roof['tvm_threads']} TVM thread(s), x{roof['share_of_peak']:.3f} of this CPU's "
            f"measured float32 FMA peak ({roof['fma_peak_gflops']:.1f} GFLOP/s): no "
            f"specialisation doing its multiply-adds can be more than x{roof['headroom']:.3f} "
            "faster"
        )
    if "generic" in results and "generic_repeat" in results:
        first, again = results["generic"]["total_s"], results["generic_repeat"]["total_s"]
        print(
            f"generic A/A (run-to-run noise): total {first:.2f} then {again:.2f} s, "
            f"x{again / first:.3f}"
        )
        if "jit" in results:
            runtime = results["jit"]["total_s"]
            print(
                f"runtime busy {runtime:.2f} s between them: x{runtime / first:.3f} and "
                f"x{runtime / again:.3f}, x{2 * runtime / (first + again):.3f} of their mean"
            )
