"""Benchmark: the floors (explorer.solvers.floor) against what they bound.

    python bench/floors.py [--models SPEC:BATCH:SIZE,...] [--profile SPEC=profile.json ...]

Per model, one profile (or a saved one, refused if made for another graph), the default
solver's 12-point sweep (its labels as a user sees them), then:
- the least peak: the sweep's, the floor's, and on the small graphs (bench/small_graphs.py)
  the exact solver's (`--exact-seconds`, proven or not);
- at every point: its overhead and gap label, and the two lower bounds at its own budget, the
  whole-step MILP's LP relaxation (steps up to explorer.solve.MAX_WINDOWED_SIZE binaries,
  `--lp-seconds` each) and the floor's, each with the seconds its LP took.
Overheads and bounds are shares of the profiled step. Writes bench/results/floors.json and
the "Lower bounds" section of docs/BENCHMARKS.md.
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
from bench.small_graphs import SMALL_GRAPHS  # noqa: E402
from explorer.errors import UserError  # noqa: E402
from explorer.models import build  # noqa: E402
from explorer.planner import Planner  # noqa: E402
from explorer.profile import StepProfile  # noqa: E402
from explorer.solve import MAX_WINDOWED_SIZE  # noqa: E402
from explorer.solvers.floor import StepFloor  # noqa: E402
from explorer.solvers.registry import make_solver  # noqa: E402
from explorer.sweep import sweep_budgets  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SECTION = "## Lower bounds"
LARGE = [("resnet50", 8, 128), ("mobilenet_v2", 16, 96), ("sample:gpt", 8, 256)]


def measure(spec: str, batch: int, size: int, profile_path: str | None, args) -> dict:
    built = build(spec, batch, size)
    plan = Planner(built.model, built.example_inputs, spec=built.spec)
    graph = plan.capture()[0]
    if profile_path:
        try:
            plan.use_profile(StepProfile.load(profile_path, fingerprint=graph.fingerprint()))
        except UserError as exc:
            print(f"{exc}; profiling anew", flush=True)
    profile = plan.profile().graphs[0]
    started = time.perf_counter()
    solver = make_solver("chain", graph, profile)
    front = sweep_budgets(solver, args.points)
    sweep_seconds = time.perf_counter() - started
    fixed = solver.fixed_bytes
    activations = solver.baseline.predicted_peak_bytes - fixed
    base = solver.baseline.predicted_seconds
    floor = StepFloor(solver.milp)
    started = time.perf_counter()
    least_floor = floor.least_peak(None)
    least_floor_seconds = time.perf_counter() - started
    result = {
        "model": spec,
        "batch_size": batch,
        "input_size": size,
        "milp_binaries": solver.milp.size,
        "fixed_bytes": fixed,
        "activation_bytes": activations,
        "sweep_seconds": sweep_seconds,
        "least_peak_bytes": solver.lowest_known(),
        "floor_peak_bytes": least_floor,
        "floor_peak_seconds": least_floor_seconds,
        "exact_least_peak_bytes": None,
        "exact_least_proven": None,
    }
    if (spec, batch, size) in SMALL_GRAPHS:
        exact = make_solver("exact", graph, profile, time_limit=args.exact_seconds)
        result["exact_least_peak_bytes"] = exact.minimum().predicted_peak_bytes
        result["exact_least_proven"] = bool((exact.cache.label("least") or (False, None))[0])
    rows = []
    for point in front:
        budget = point.budget_bytes
        row = {
            "budget_share": (budget - fixed) / activations,
            "overhead": (point.schedule.predicted_seconds - base) / base,
            "status": point.status,
            "gap": point.gap,
            "lp_bound": None,
            "lp_seconds": None,
        }
        if solver.milp.size <= MAX_WINDOWED_SIZE and point.status != "optimal":
            started = time.perf_counter()
            solver.milp.use_budget(budget)
            relaxed = solver.milp.relaxation(args.lp_seconds)
            row["lp_seconds"] = time.perf_counter() - started
            row["lp_bound"] = None if relaxed is None else relaxed.bound / base
        started = time.perf_counter()
        own = floor.within(budget, None)
        row["floor_seconds"] = time.perf_counter() - started
        row["floor_bound"] = None if own is None else own.bound / base
        rows.append(row)
    result["rows"] = rows
    return result


def _pct(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{100 * value:.{digits}f}%"


def markdown(results: list[dict]) -> str:
    lines = [
        SECTION,
        "",
        "Written by `bench/floors.py`: the floors of explorer/solvers/floor.py against what "
        "they bound, on one profile per model (2 CPU cores, one thread). *least peak*: the "
        "default sweep's; *floor*: no schedule of the space peaks under it; *above*: how "
        "far the least peak found may be from the lowest possible. The exact solver's least "
        "peak is given where it ran (the small graphs).",
        "",
        "| model | binaries | least peak | exact least peak | floor | above | floor LP |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        least, floor = r["least_peak_bytes"], r["floor_peak_bytes"]
        exact = r["exact_least_peak_bytes"]
        exact_text = (
            ""
            if exact is None
            else f"{exact:,}" + ("" if r["exact_least_proven"] else " (not proven)")
        )
        above = None if floor in (None, 0) else (least - floor) / floor
        lines.append(
            f"| {r['model']} b{r['batch_size']} {r['input_size']} | {r['milp_binaries']:,} "
            f"| {least:,} | {exact_text} | {'' if floor is None else f'{floor:,}'} "
            f"| {_pct(above, 2)} | {r['floor_peak_seconds']:.2f} s |"
        )
    lines += [
        "",
        "Per point: the sweep's overhead and gap label, and the two lower bounds at its own "
        "budget: the whole-step MILP's LP relaxation (not run above "
        f"{MAX_WINDOWED_SIZE:,} binaries, nor where the point is proven) and the floor's "
        "LP. Shares of the profiled step.",
        "",
        *_summary(results),
    ]
    for r in results:
        lines += [
            "",
            f"### {r['model']} b{r['batch_size']} {r['input_size']} "
            f"(sweep {r['sweep_seconds']:.1f} s)",
            "",
            "| budget share | overhead | label | whole-step LP | floor LP |",
            "|---:|---:|---|---:|---:|",
        ]
        for row in r["rows"]:
            label = row["status"] if row["status"] == "optimal" else f"gap {_pct(row['gap'], 0)}"
            lp = (
                ""
                if row["lp_bound"] is None
                else f"{_pct(row['lp_bound'], 2)} ({row['lp_seconds']:.1f} s)"
            )
            if row["lp_bound"] is None and row["lp_seconds"] is not None:
                lp = f"not solved in {row['lp_seconds']:.0f} s"
            lines.append(
                f"| {row['budget_share']:.3f} | {_pct(row['overhead'], 2)} | {label} | {lp} "
                f"| {_pct(row['floor_bound'], 2)} ({row['floor_seconds']:.2f} s) |"
            )
    return "\n".join(lines) + "\n"


def _summary(results: list[dict]) -> list[str]:
    """What the rows show, counted from them."""
    both = [
        row
        for r in results
        for row in r["rows"]
        if row["lp_bound"] is not None and row["floor_bound"] is not None and row["lp_bound"] > 0
    ]
    above = sum(1 for row in both if row["floor_bound"] > row["lp_bound"])
    valid = all(  # autograd's own order (no recomputation) is outside the space
        row["floor_bound"] is None or row["floor_bound"] <= row["overhead"] + 1e-12
        for r in results
        for row in r["rows"]
        if row["overhead"] > 0
    )
    exact = [r for r in results if r["exact_least_peak_bytes"] is not None]
    under = [r["exact_least_peak_bytes"] - r["floor_peak_bytes"] for r in exact]
    lines = [
        f"- The floor's seconds are above the whole-step LP's at {above} of the {len(both)} "
        "budgets where both ran and the LP proves more than nothing, and are solved in a "
        "fraction of its time.",
        "- Every floor is at most the overhead found at its budget where that recomputes"
        + (" (as it must be: a bound)." if valid else ": NOT SO, a bug."),
    ]
    outside = [
        (row["floor_bound"], r["model"])
        for r in results
        for row in r["rows"]
        if row["overhead"] <= 0 and (row["floor_bound"] or 0.0) > 0
    ]
    if outside:
        most, model = max(outside)
        lines.append(
            "- Where nothing is recomputed, autograd's own order may peak under what the "
            "space's order reaches without recomputing, so the floor there can be above "
            f"zero ({model}: {_pct(most, 4)} of the step)."
        )
    if exact:
        lines.append(
            f"- The least-peak floor is {min(under)} to {max(under)} bytes under the exact "
            f"solver's least peak on the {len(exact)} small graphs."
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    everything = [f"{s}:{b}:{n}" for s, b, n in [*SMALL_GRAPHS, *LARGE]]
    parser.add_argument("--models", default=",".join(everything))
    parser.add_argument("--profile", action="append", default=[], help="SPEC=profile.json")
    parser.add_argument("--points", type=int, default=12)
    parser.add_argument("--exact-seconds", type=float, default=60.0)
    parser.add_argument("--lp-seconds", type=float, default=30.0)
    parser.add_argument(
        "--rewrite", action="store_true", help="only rewrite the docs from the results file"
    )
    args = parser.parse_args()
    path = RESULTS / "floors.json"
    if args.rewrite:
        write_section(markdown(json.loads(path.read_text())), SECTION)
        return
    torch.set_num_threads(1)
    profiles = dict(item.split("=", 1) for item in args.profile)
    RESULTS.mkdir(exist_ok=True)
    # models not measured this time keep their earlier rows, in order; each model's rows are
    # written as soon as it is done
    results = json.loads(path.read_text()) if path.exists() else []
    for item in args.models.split(","):
        spec, batch, size = item.rsplit(":", 2)
        found = measure(spec, int(batch), int(size), profiles.get(spec), args)
        print(json.dumps({k: v for k, v in found.items() if k != "rows"}), flush=True)
        same = [k for k, r in enumerate(results) if _key(r) == _key(found)]
        if same:
            results[same[0]] = found
        else:
            results.append(found)
        path.write_text(json.dumps(results, indent=1))
        write_section(markdown(results), SECTION)
    print(f"wrote {path} and the {SECTION!r} section of docs/BENCHMARKS.md")


def _key(result: dict) -> tuple:
    return result["model"], result["batch_size"], result["input_size"]


if __name__ == "__main__":
    main()
