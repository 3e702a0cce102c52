"""Benchmark: a change to the refiner judged budget by budget, every search from a fixed start.

    python bench/search_from_starts.py [--model SPEC --batch B --size S] [--profile FILE]
        [--starts FILE] [--against FILE] [--seconds S] [--out FILE]

A sweep is deterministic on a profile, and each budget's search starts from what the budgets
below it found, so a change that alters one answer reroutes every later budget: two sweeps
compared mix what a search gained with where the path went (docs/BENCHMARKS.md, "Narrower
windows of full reach": window runs of 0.5 s missed the goal at 5 budgets of four profiles'
sweeps where the current code missed 7, and searched from the same starts they were equal at
every budget but one). Here the code under test sweeps once, for the state its refiner
learns there (whether whole-step runs pay off, what CBC takes to start); then every budget
of the front but the least peak is searched again from that state, for the median time the
sweep took a budget, from a fixed start: the fastest schedule the sweep knows within the
budget below, or, with `--starts`, the budgets and starts of an earlier results file, made
by any version of the code on the same profile (`--profile` keeps it). Writes the results
(the starts among them) and prints each budget's overhead, an `--against` file's beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from explorer.errors import UserError  # noqa: E402
from explorer.files import read_json, write_atomic  # noqa: E402
from explorer.graph import Graph  # noqa: E402
from explorer.models import build  # noqa: E402
from explorer.planner import Planner  # noqa: E402
from explorer.profile import Profile, StepProfile  # noqa: E402
from explorer.solvers.registry import make_solver  # noqa: E402
from explorer.sweep import sweep_budgets  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def load_step(spec: str, batch: int, size: int, saved: Path | None) -> tuple[Graph, Profile]:
    """The model's step and its profile: read from `saved` when it exists (so that two
    versions of the code search the same costs), else measured and, given `saved`, kept."""
    built = build(spec, batch, size)
    plan = Planner(built.model, built.example_inputs, spec=built.spec)
    if saved is not None and saved.exists():
        plan.use_profile(StepProfile.load(saved))  # refuses one of another step
    step = plan.profile()  # the saved profile, or one measured now
    if saved is not None and not saved.exists():
        step.save(saved)
    return plan.capture()[0], step.graphs[0]


def search_all(
    graph: Graph, profile: Profile, points: int, starts: dict | None, seconds: float | None
) -> dict:
    """Sweep, then search each budget once from its start (see the module docstring)."""
    solver = make_solver("chain", graph, profile)
    front = sweep_budgets(solver, points)
    refiner = solver.refiner
    if refiner is None:
        raise UserError("this step's sweep searched nothing: there is no search to judge")
    seconds = seconds or statistics.median(p.solve_seconds for p in front)
    learned = (Counter(refiner.fruitless), dict(refiner.startup))
    fixed = solver.fixed_bytes
    activations = solver.baseline.predicted_peak_bytes - fixed
    if starts is None:
        budgets = sorted({p.budget_bytes for p in front})
        # autograd's own order (no recomputation) is outside the space: its empty point
        pairs = [
            (high, solver.space.windows_of(solver.answers.best_within(low)) or solver.space.empty())
            for low, high in zip(budgets[:-1], budgets[1:], strict=True)
        ]
    else:
        pairs = [(row["budget_bytes"], row["start"]) for row in starts["rows"]]
    print(f"{len(pairs)} searches of {seconds:.2f} s from fixed starts", flush=True)
    rows = []
    for budget, windows in pairs:
        start = solver.schedule_of(windows)
        refiner.fruitless, refiner.startup = Counter(learned[0]), dict(learned[1])
        found = refiner.fastest(budget, start, seconds).schedule
        rows.append(
            {
                "budget_bytes": budget,
                "budget_share": (budget - fixed) / activations,
                "start": windows,
                "start_overhead": start.predicted_overhead,
                "overhead": found.predicted_overhead,
            }
        )
        print(f"{rows[-1]['budget_share']:.3f} {found.predicted_overhead:+8.2%}", flush=True)
    return {"fingerprint": graph.fingerprint(), "seconds": seconds, "rows": rows}


def compare(results: dict, against: dict) -> list[str]:
    """Each budget's overhead beside the other run's, and how many are lower, equal, higher."""
    theirs = {r["budget_bytes"]: r["overhead"] for r in against["rows"]}
    lines, tally = [], Counter()
    for row in results["rows"]:
        other = theirs.get(row["budget_bytes"])
        if other is None:
            lines.append(f"{row['budget_share']:.3f} {row['overhead']:+8.2%}   (not in the other)")
            continue
        diff = row["overhead"] - other
        tally["lower" if diff < -1e-9 else "higher" if diff > 1e-9 else "equal"] += 1
        lines.append(
            f"{row['budget_share']:.3f} {row['overhead']:+8.2%} {other:+8.2%} {diff:+8.3%}"
        )
    lines.append(
        f"against the other: {tally['lower']} lower, {tally['equal']} equal, "
        f"{tally['higher']} higher"
    )
    return lines


def check_results(name: str, results: dict, fingerprint: str) -> None:
    """Refuse a file that is not this benchmark's results, or is for another step."""
    rows = results.get("rows")
    keys = {"budget_bytes", "start", "overhead"}
    if not isinstance(rows, list) or not all(
        isinstance(r, dict) and keys <= r.keys() for r in rows
    ):
        raise UserError(f"{name}: not a results file of this benchmark")
    if results.get("fingerprint") != fingerprint:
        raise UserError(f"{name}: results made for another model or shape")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bench.small_graphs:gpt_2_layers")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--points", type=int, default=12)
    parser.add_argument("--profile", type=Path, help="profile.json to read, or to write if new")
    parser.add_argument("--starts", type=Path, help="a results file whose starts to search from")
    parser.add_argument("--against", type=Path, help="a results file to compare with")
    parser.add_argument("--seconds", type=float, help="per search (default: a sweep's median)")
    parser.add_argument("--out", type=Path, default=RESULTS / "search_from_starts.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    try:
        graph, profile = load_step(args.model, args.batch, args.size, args.profile)
        starts = None if args.starts is None else read_json(args.starts, what="starts")
        against = None if args.against is None else read_json(args.against, what="results")
        for name, other in (("--starts", starts), ("--against", against)):
            if other is not None:
                check_results(name, other, graph.fingerprint())
        results = search_all(graph, profile, args.points, starts, args.seconds)
    except UserError as error:
        sys.exit(f"search_from_starts: {error}")
    results.update(model=args.model, batch_size=args.batch, input_size=args.size)
    write_atomic(args.out, json.dumps(results, indent=1))
    if against is not None:
        print("\n".join(compare(results, against)))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
