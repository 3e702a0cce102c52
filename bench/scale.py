"""Benchmark: planning sizes this machine cannot run, and how long the solver takes.

    python bench/scale.py [--device p100] [--points 12]

Each model is captured on the meta device (shapes only: nothing is allocated or run) and
costed with the analytic model (explorer.costmodel) for `--device`. The default solver then
sweeps `--points` budgets; a second solver built on the same profile with the same cache
file sweeps again (what a second `remat-explorer sweep` of that profile does). Times are
solver times (setup + sweep), on this machine's CPU. Writes bench/results/scale.json and
the "Solver scale" section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.optimality import write_section  # noqa: E402
from explorer.costmodel import analytic_profile, device, meta_graph  # noqa: E402
from explorer.solvers.registry import make_solver  # noqa: E402
from explorer.sweep import sweep_budgets  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SECTION = "## Solver scale"
# MONeT's (Shah et al., ICLR 2021) sizes, and the size this project's front benchmark uses
MODELS = [
    ("resnet50", 184, 224),
    ("googlenet", 320, 224),
    ("mobilenet_v2", 272, 224),
    ("vgg16", 176, 224),
    ("sample:unet", 11, 416),
    ("resnet50", 8, 128),
    # a model with dropouts: their masks must stay compact on the meta device too
    ("sample:gpt", 8, 256),
]


def sweep_once(graph, profile, points: int, cache: Path) -> tuple[dict, list]:
    started = time.perf_counter()
    solver = make_solver("chain", graph, profile, cache=cache)
    setup = time.perf_counter() - started
    front = sweep_budgets(solver, points)
    return {
        "setup_seconds": setup,
        "sweep_seconds": time.perf_counter() - started - setup,
        "total_seconds": time.perf_counter() - started,
        "stage_ilps": solver.setup.ilps,
        "table_schedules": solver.setup.table_schedules,
        "refines": solver.refines,
    }, [solver, front]


def measure(spec: str, batch: int, size: int, points: int, device_name: str) -> dict:
    started = time.perf_counter()
    graph = meta_graph(spec, batch, size)
    captured = time.perf_counter() - started
    profile = analytic_profile(graph, device_name)
    with tempfile.TemporaryDirectory() as folder:
        cache = Path(folder) / "solver_cache.json"
        first, (solver, front) = sweep_once(graph, profile, points, cache)
        second, (_, again) = sweep_once(graph, profile, points, cache)
    fixed = solver.fixed_bytes
    activations = solver.baseline.predicted_peak_bytes - fixed
    result = {
        "model": spec,
        "batch_size": batch,
        "input_size": size,
        "device": profile.device_name,
        "operators": sum(1 for n in graph.nodes if n.phase in ("forward", "backward")),
        # dropouts split into a compact mask and its draw (remat_explorer.*_dropout_mask)
        "dropouts": sum(1 for n in graph.nodes if n.target.endswith("_dropout_mask.default")),
        "capture_seconds": captured,
        "baseline_peak_bytes": solver.baseline.predicted_peak_bytes,
        "fixed_bytes": fixed,
        "first": first,
        "second": second,
        "front_points": len(front),
        "same_front_again": [p.predicted_peak_bytes for p in again]
        == [p.predicted_peak_bytes for p in front],
        "front": [
            {
                "share": (p.predicted_peak_bytes - fixed) / activations,
                "peak_bytes": p.predicted_peak_bytes,
                "overhead": p.predicted_overhead,
            }
            for p in front
        ],
    }
    print(
        f"{spec:14s} b{batch:<4d} {size:4d}px: {result['operators']} ops, capture "
        f"{captured:.1f} s, sweep {first['total_seconds']:.1f} s (again "
        f"{second['total_seconds']:.1f} s), {len(front)} points, lowest "
        f"{result['front'][0]['share']:.3f} at {result['front'][0]['overhead']:+.1%}",
        flush=True,
    )
    return result


def markdown(results: list[dict], device_name: str, points: int) -> str:
    lines = [
        SECTION,
        "",
        "Written by `bench/scale.py`: each model captured on the meta device (nothing",
        f"allocated) and costed for {device(device_name).name} by `explorer.costmodel`; the",
        f"default solver sweeps {points} budgets, then a second solver on the same profile",
        "and cache file sweeps again. Seconds are solver time on this machine (2 cores,",
        "one thread for CBC). *lowest*: the least peak found, as a share of activation memory,",
        "and its predicted overhead on that device. *dropouts*: those split as on the device",
        "(`meta_graph`'s `stands_for`): a 1-byte mask kept or drawn again from the generator",
        "state saved before it, and the float output recomputable from the mask.",
        "",
        "| model | batch | input | operators | dropouts | first sweep | second sweep | points "
        "| lowest |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        low = r["front"][0]
        lines.append(
            f"| {r['model']} | {r['batch_size']} | {r['input_size']} | {r['operators']} | "
            f"{r.get('dropouts', '')} | "
            f"{r['first']['total_seconds']:.1f} s | {r['second']['total_seconds']:.1f} s | "
            f"{r['front_points']} | {low['share']:.3f} at {low['overhead']:+.1%} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="p100")
    parser.add_argument("--points", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = [measure(*m, args.points, args.device) for m in MODELS]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "scale.json").write_text(json.dumps(results, indent=1))
    write_section(markdown(results, args.device, args.points), SECTION)
    print(f"wrote {RESULTS / 'scale.json'}")


if __name__ == "__main__":
    main()
