"""Benchmark: sweeps of steps that Dynamo splits into several graphs.

    python bench/several_graphs.py [--points N] [--models SPEC,...]

A step of several graphs has one solver per graph, and each budget of the step is shared out
among them (explorer.stepsolver). Per model: its graphs, the sweep's seconds on a CPU profile
(the solvers' time rules as a user gets them), and the front (peak, predicted overhead, gap
label). Writes bench/results/several_graphs.json and the "Steps of several graphs" section of
docs/BENCHMARKS.md. The models are factories here (`bench.several_graphs:NAME`), built from
small configs (nothing is downloaded).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import transformers
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.optimality import write_section  # noqa: E402
from explorer.models import build  # noqa: E402
from explorer.planner import Planner  # noqa: E402
from explorer.units import format_bytes  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SECTION = "## Steps of several graphs"


def gpt2_with_labels() -> tuple[nn.Module, dict]:
    """A 2-layer GPT-2 given its labels: the loss inside the model is a second graph, which
    reads the logits the first makes."""
    config = transformers.GPT2Config(
        vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64, use_cache=False
    )
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 100, (2, 12), generator=generator)
    labels = torch.randint(0, 100, (2, 12), generator=generator)
    return transformers.GPT2LMHeadModel(config), {"input_ids": tokens, "labels": labels}


def wav2vec2_with_layerdrop() -> tuple[nn.Module, tuple]:
    """A 4-layer Wav2Vec2 whose encoder draws a number at every layer (LayerDrop): a graph
    break in the encoder's loop, whose layers' graph runs once per layer kept."""
    config = transformers.Wav2Vec2Config(
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=128,
        conv_dim=(32, 32, 32),
        conv_stride=(5, 2, 2),
        conv_kernel=(10, 3, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        layerdrop=0.1,
        mask_time_prob=0.0,
    )
    audio = torch.randn(2, 4000, generator=torch.Generator().manual_seed(0))
    return transformers.Wav2Vec2Model(config), (audio,)


MODELS = [
    f"bench.several_graphs:{name}" for name in ("gpt2_with_labels", "wav2vec2_with_layerdrop")
]


def measure(spec: str, points: int) -> dict:
    transformers.logging.set_verbosity_error()
    built = build(spec, None)
    plan = Planner(built.model, built.example_inputs, built.example_kwargs, spec=built.spec)
    plan.profile()
    solver = plan.solver()
    started = time.perf_counter()
    front = plan.sweep(points=points)
    seconds = time.perf_counter() - started
    baseline = solver.baseline.predicted_seconds
    return {
        "model": spec.split(":")[-1],
        "graphs": len(solver.graphs),
        "solvers": len(solver.solvers),
        "sweep_seconds": seconds,
        "baseline_peak_bytes": solver.baseline.predicted_peak_bytes,
        "points": [
            {
                "peak_bytes": p.predicted_peak_bytes,
                "overhead": p.schedule.predicted_seconds / baseline - 1,
                "gap": p.gap,
            }
            for p in front.points
        ],
    }


def markdown(results: list[dict], points: int) -> str:
    lines = [
        SECTION,
        "",
        f"`python bench/several_graphs.py`: a {points}-point sweep of each step on a CPU profile, "
        "the solvers' default time rules, this 2-core machine. *graphs*: the step's graph runs "
        "(solvers: its distinct graphs). Each point: peak, predicted overhead, gap label.",
        "",
        "Before 2026-12-07 (f8f63b3) every share a budget's bisection tried was searched, each "
        "a budget its graph's solver had not seen: the lowest budget took all of the first "
        "graph's refinement time. On one saved profile per step, both trees twice each (the "
        "same answers both times): wav2vec2's sweep took 35 s then and 16 s now, with the same "
        "front; GPT-2's 61.5 s then and 56.6 s now, the same front but between 300 and 332 "
        "KiB, where it read +3.8% at 309 KiB and +3.2% at 317 KiB, now +2.8% at 314 KiB and "
        "+1.9% at 320 KiB. Fronts from fresh profiles differ by several points from one "
        "profile to the next (the table's runs each profile anew).",
        "",
        "| model | graphs (solvers) | sweep | front |",
        "|---|---:|---:|---|",
    ]
    for r in results:
        front = ", ".join(
            f"{format_bytes(p['peak_bytes'])} {p['overhead']:+.1%} (gap {p['gap']:.0%})"
            for p in r["points"]
        )
        lines.append(
            f"| {r['model']} | {r['graphs']} ({r['solvers']}) | {r['sweep_seconds']:.1f} s "
            f"| {front} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=6)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument(
        "--rewrite", action="store_true", help="only rewrite the docs from the results file"
    )
    args = parser.parse_args()
    if args.rewrite:
        saved = json.loads((RESULTS / "several_graphs.json").read_text())
        write_section(markdown(saved["models"], saved["points"]), SECTION)
        return
    results = []
    for spec in args.models.split(","):
        results.append(measure(spec, args.points))
        r = results[-1]
        print(f"{r['model']}: {r['graphs']} graphs, sweep {r['sweep_seconds']:.1f} s", flush=True)
        for p in r["points"]:
            print(f"  {p['peak_bytes']:>12,}  {p['overhead']:+8.2%}  gap {p['gap']:.3f}")
    RESULTS.mkdir(exist_ok=True)
    saved = {"points": args.points, "models": results}
    (RESULTS / "several_graphs.json").write_text(json.dumps(saved, indent=1) + "\n")
    write_section(markdown(results, args.points), SECTION)


if __name__ == "__main__":
    main()
