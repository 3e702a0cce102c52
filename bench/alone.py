"""Benchmark: a budget asked by itself against the same budget asked as one of a sweep's.

    python bench/alone.py [--models SPEC:BATCH:SIZE,...] [--profile SPEC=profile.json ...]

On a step too large to refine every budget of a sweep (explorer.solve.MAX_WINDOWED_SIZE),
a sweep's budget takes the chain table's answer, while a budget asked by itself
(`Planner.solve`, the dashboard's "Solve this budget") is searched with windows for
explorer.solve.LARGE_ALONE_SECONDS (Solver.solve_alone). Per model, one profile (or a saved
one, refused if made for another graph) and one solver; at each share of the activations,
the budget asked as a sweep asks it, then by itself: the predicted overhead and gap label
of each, and the seconds the second took. Writes bench/results/alone.json and the "One
budget asked by itself" section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.optimality import write_section  # noqa: E402
from explorer.errors import UserError  # noqa: E402
from explorer.models import build  # noqa: E402
from explorer.planner import Planner  # noqa: E402
from explorer.profile import StepProfile  # noqa: E402
from explorer.solve import LARGE_ALONE_SECONDS  # noqa: E402
from explorer.units import parse_budget  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SECTION = "## One budget asked by itself"
MODELS = [("resnet50", 8, 128), ("mobilenet_v2", 16, 96)]
SHARES = (0.3, 0.5, 0.7)


def measure(spec: str, batch: int, size: int, profile_path: str | None) -> dict:
    built = build(spec, batch, size)
    plan = Planner(built.model, built.example_inputs, spec=built.spec)
    graph = plan.capture()[0]
    if profile_path:
        try:
            plan.use_profile(StepProfile.load(profile_path, fingerprint=graph.fingerprint()))
        except UserError as exc:
            print(f"{exc}; profiling anew", flush=True)
    plan.profile()
    solver = plan.solver()
    rows = []
    for share in SHARES:
        budget = parse_budget(share, solver.baseline.predicted_peak_bytes, solver.fixed_bytes)
        swept = solver.solve(budget)
        started = time.perf_counter()
        alone = solver.solve(budget, alone=True)
        rows.append(
            {
                "share": share,
                "budget_bytes": budget,
                "sweep_overhead": swept.predicted_overhead,
                "sweep_gap": swept.gap,
                "alone_overhead": alone.predicted_overhead,
                "alone_gap": alone.gap,
                "alone_peak_bytes": alone.predicted_peak_bytes,
                "alone_seconds": time.perf_counter() - started,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return {
        "model": spec,
        "batch_size": batch,
        "input_size": size,
        "milp_binaries": solver.setup.milp_size,
        "rows": rows,
    }


def markdown(results: list[dict]) -> str:
    lines = [
        SECTION,
        "",
        "Written by `bench/alone.py`: on a step too large to refine every budget of a sweep, "
        "a sweep's budget takes the chain table's answer; the same budget asked by itself "
        f"(`Planner.solve`) is searched with windows for {LARGE_ALONE_SECONDS:g} s "
        "(explorer.solve.LARGE_ALONE_SECONDS) and bounded by the floor's LP at it. One solver "
        "per model, each budget asked as a sweep asks it, then by itself (2 CPU cores, one "
        "thread). Overheads are predicted, the runtime's own cost included; *seconds*: the "
        "second ask, the model's writing included where it is the first. A label as a "
        "sweep's is what the floors' LPs solved before it carry to its budget (none before "
        "the first: gap unknown).",
        "",
        "| model | binaries | budget share | as a sweep's | label | by itself | label | seconds |",
        "|---|---:|---:|---:|---|---:|---|---:|",
    ]
    for result in results:
        name = f"{result['model']} b{result['batch_size']} {result['input_size']}"
        for row in result["rows"]:
            lines.append(
                f"| {name} | {result['milp_binaries']:,} | {row['share']:.2f} | "
                f"{row['sweep_overhead']:+.2%} | {_label(row['sweep_gap'])} | "
                f"{row['alone_overhead']:+.2%} | {_label(row['alone_gap'])} | "
                f"{row['alone_seconds']:.1f} s |"
            )
    return "\n".join(lines) + "\n"


def _label(gap: float) -> str:
    if gap >= 1.0:
        return "gap unknown"
    return "optimal" if gap <= 0.0 else f"gap {gap:.0%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    everything = [f"{spec}:{batch}:{size}" for spec, batch, size in MODELS]
    parser.add_argument("--models", default=",".join(everything))
    parser.add_argument("--profile", action="append", default=[], help="SPEC=profile.json")
    parser.add_argument(
        "--rewrite", action="store_true", help="only rewrite the docs from the results file"
    )
    args = parser.parse_args()
    path = RESULTS / "alone.json"
    if args.rewrite:
        write_section(markdown(json.loads(path.read_text())), SECTION)
        return
    torch.set_num_threads(1)
    profiles = dict(item.split("=", 1) for item in args.profile)
    RESULTS.mkdir(exist_ok=True)
    results = []
    for item in args.models.split(","):
        spec, batch, size = item.rsplit(":", 2)
        results.append(measure(spec, int(batch), int(size), profiles.get(spec)))
        path.write_text(json.dumps(results, indent=1))
        write_section(markdown(results), SECTION)
    print(f"wrote {path} and the {SECTION!r} section of docs/BENCHMARKS.md")


if __name__ == "__main__":
    main()
