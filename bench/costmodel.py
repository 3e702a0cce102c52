"""Benchmark: the analytic cost model against a measured profile, on the device at hand.

    python bench/costmodel.py [--device cuda|cpu] [--model-device h100] [--points 8]
        [--models resnet50:8:128 sample:gpt:8:256 mobilenet_v2:16:96]

For each model: profile every operator on `--device` (CUDA events on a GPU), cost the same
graph with the analytic model for `--model-device` (explorer.costmodel), and print seconds
per kind of operator side by side. Then sweep `--points` budgets with the measured profile
and re-score each front point's schedule with the analytic profile: the overhead each
predicts for the same schedule. The solver weighs seconds only against other seconds, so
what matters for planning is the second comparison; the first shows where the model's
absolute seconds go wrong (on a fast GPU at small sizes, each operator's host-side cost).
Writes bench/results/costmodel_<model-device>.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import explorer  # noqa: E402
from explorer.costmodel import analytic_profile  # noqa: E402
from explorer.graph import PLACEHOLDER, Graph  # noqa: E402
from explorer.models import build  # noqa: E402
from explorer.profile import Profile  # noqa: E402
from explorer.schedule import Schedule  # noqa: E402
from explorer.solve import evaluate  # noqa: E402

RESULTS = ROOT / "bench" / "results"
KINDS = ("convolution_backward", "convolution", "addmm", "bmm", "mm", "native_batch_norm")


def kind(target: str) -> str:
    """The operator family a node belongs to, for the per-kind table."""
    op = target.removeprefix("aten.").split(".")[0]
    return next((k for k in KINDS if op.startswith(k)), "other")


def by_kind(
    graphs: list[Graph], measured: list[Profile], analytic: list[Profile]
) -> dict[str, list]:
    """Per kind, over every graph of the step: [operators, measured seconds, analytic
    seconds]."""
    table: dict[str, list] = defaultdict(lambda: [0, 0.0, 0.0])
    for graph, m, a in zip(graphs, measured, analytic, strict=True):
        for node in graph.nodes:
            if node.phase == PLACEHOLDER:
                continue
            row = table[kind(node.target)]
            row[0] += 1
            row[1] += m.time_of(node.name)
            row[2] += a.time_of(node.name)
    return dict(table)


def rescored_seconds(graphs: list[Graph], profiles: list[Profile], schedule: Schedule) -> float:
    """The schedule's step seconds under other profiles (one per graph)."""
    return sum(
        evaluate(g, p, copy.deepcopy(s)).predicted_seconds
        for g, p, s in zip(graphs, profiles, schedule.graphs, strict=True)
    )


def measure(spec: str, batch: int, size: int, device: str, model_device: str, points: int):
    built = build(spec, batch, size, device=device)
    plan = explorer.Planner(built.model, built.example_inputs, spec=built.spec)
    measured = plan.profile()
    graphs = plan.capture()
    analytic = [analytic_profile(g, model_device) for g in graphs]
    kinds = by_kind(graphs, measured.graphs, analytic)
    front = plan.sweep(points=points)
    base = rescored_seconds(graphs, analytic, plan.baseline())
    rows = [
        {
            "predicted_peak_bytes": p.predicted_peak_bytes,
            "measured_profile_overhead": p.predicted_overhead,
            "analytic_overhead": rescored_seconds(graphs, analytic, p.schedule) / base - 1,
        }
        for p in front.points
    ]
    return {
        "model": spec,
        "batch_size": batch,
        "input_size": size,
        "device": measured.device_name,
        "model_device": model_device,
        "kinds": kinds,
        "points": rows,
    }


def report(result: dict) -> None:
    print(
        f"== {result['model']} b{result['batch_size']} {result['input_size']} on "
        f"{result['device']}, against the analytic {result['model_device']}"
    )
    print(f"  {'kind':22s} {'ops':>5s} {'profiled ms':>12s} {'analytic ms':>12s}  ratio")
    kinds = sorted(result["kinds"].items(), key=lambda kv: -kv[1][1])
    for name, (count, measured, analytic) in kinds:
        ratio = measured / max(analytic, 1e-12)
        print(f"  {name:22s} {count:5d} {measured * 1e3:12.3f} {analytic * 1e3:12.3f} {ratio:6.2f}")
    total_m = sum(v[1] for v in result["kinds"].values())
    total_a = sum(v[2] for v in result["kinds"].values())
    ratio = total_m / max(total_a, 1e-12)
    print(f"  {'total':22s} {'':5s} {total_m * 1e3:12.3f} {total_a * 1e3:12.3f} {ratio:6.2f}")
    print(f"  {'peak MiB':>10s} {'overhead, profiled':>20s} {'overhead, analytic':>20s}")
    for p in result["points"]:
        print(
            f"  {p['predicted_peak_bytes'] / 2**20:10.1f} "
            f"{p['measured_profile_overhead']:+20.1%} {p['analytic_overhead']:+20.1%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="where to profile (default: cuda where there is one)",
    )
    parser.add_argument("--model-device", default="h100", help="the analytic model's device")
    parser.add_argument("--points", type=int, default=8)
    parser.add_argument(
        "--models", nargs="+", default=["resnet50:8:128", "sample:gpt:8:256", "mobilenet_v2:16:96"]
    )
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    results = []
    for item in args.models:
        spec, batch, size = item.rsplit(":", 2)
        result = measure(spec, int(batch), int(size), args.device, args.model_device, args.points)
        report(result)
        results.append(result)
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / f"costmodel_{args.model_device}.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
