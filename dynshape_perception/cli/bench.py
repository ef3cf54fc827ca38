"""``dynshape-perception bench <name>``: run one benchmark of dynshape_perception.tools.bench."""

from __future__ import annotations

import argparse
import importlib

# name -> one-line help. Each module has add_arguments(parser), with --json OUT, and
# run(args) -> int; it is imported only when chosen, so no benchmark pays for another's imports.
BENCHMARKS: dict[str, str] = {
    "kernels": "the generic TVM builds of the models against ONNX Runtime, PyTorch eager, "
    "torch.compile and NumPy at fixed sizes: every output checked against TVM, then timed",
    "jit": "the shape-specialising JIT: hit rates, compile costs, speedups",
    "e2e": "end-to-end latency over DDS, separate nodes and the composed pipeline",
    "deadlines": "deadline-aware scheduling under load",
    "fleet": "a generated corpus replayed on embedded Ray with 1 and 2 workers: bags per "
    "minute, the engine's per-bag overhead, peak RSS per worker",
    "soak": "the nodes at 10 Hz on a generated drive for a set time: process-tree RSS, "
    "descriptors, threads, latency percentiles and misses over time, plotted in HTML",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("benchmark", choices=sorted(BENCHMARKS), help="benchmark to run")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="options of that benchmark")
    parser.epilog = "benchmarks: " + "; ".join(f"{k}: {v}" for k, v in BENCHMARKS.items())


def run(args: argparse.Namespace) -> int:
    module = importlib.import_module(f"dynshape_perception.tools.bench.{args.benchmark}")
    parser = argparse.ArgumentParser(
        prog=f"dynshape-perception bench {args.benchmark}",
        description=BENCHMARKS[args.benchmark],
    )
    module.add_arguments(parser)
    return int(module.run(parser.parse_args(args.rest)))
