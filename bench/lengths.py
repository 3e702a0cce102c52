"""Benchmark: training on batches whose sequence length changes at every step.

    python bench/lengths.py [--model sample:gpt] [--batch-size 8] [--planned 128]
        [--lengths 40] [--longest 256] [--results bench/results]

A collator that pads each batch to its longest sequence gives another length at nearly every
step. The model is planned at `--planned` tokens (the front's fastest point within half the
activations), wrapped, and trained for `--lengths` steps, each at a length drawn in
[16, `--longest`] (the planned length first), beside the unmodified model on the same batches:
the seconds of every step, how many graphs were captured, and whether the two ended with the
same parameters (bitwise). Each new length's peak is predicted when it first runs; the table
gives what that costs, and the measured peak at three lengths beside the prediction (the
live-tensor meter, parameters and inputs added). One thread. Writes lengths.json into
--results.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import time
from pathlib import Path

import torch

import explorer
from explorer.backend import wrap_with_schedule
from explorer.memory import LiveBytesTracker, tensor_bytes
from explorer.models import build
from explorer.modelstate import held_state
from explorer.verify import training_step

RESULTS = Path(__file__).parent / "results"


def _lengths(planned: int, count: int, longest: int) -> list[int]:
    draw = random.Random(0)
    return [planned] + [draw.randint(16, longest) for _ in range(count - 1)]


def _train(model, tokens: torch.Tensor, lengths: list[int]) -> list[float]:
    """Seconds of each step (forward, backward, AdamW), one step per length."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    seconds = []
    for step, length in enumerate(lengths):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        training_step(model, (tokens[:, :length].clone(),), step)
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    return seconds


def _peak(wrapped, tokens: torch.Tensor, length: int) -> tuple[int, int | None]:
    """Measured peak of one step at `length` and the runtime's prediction for it."""
    batch = tokens[:, :length].clone()
    training_step(wrapped, (batch,), 0)  # may capture
    wrapped.zero_grad(set_to_none=True)
    with LiveBytesTracker() as meter:
        training_step(wrapped, (batch,), 0)
    wrapped.zero_grad(set_to_none=True)
    measured = tensor_bytes([*held_state(wrapped.model), batch]) + meter.peak_bytes
    predicted = None
    for plan in reversed(wrapped.plans):
        if plan.symbolic and (length,) in plan.peaks_at:
            predicted = plan.peaks_at[(length,)]
            break
    return measured, predicted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="sample:gpt")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--planned", type=int, default=128)
    parser.add_argument("--lengths", type=int, default=40)
    parser.add_argument("--longest", type=int, default=256)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)

    built = build(args.model, args.batch_size, args.planned)
    plan = explorer.Planner(built.model, built.example_inputs, spec=built.spec)
    schedule = plan.sweep(points=6).at_budget(0.5)
    lengths = _lengths(args.planned, args.lengths, args.longest)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 256, (args.batch_size, args.longest), generator=generator)
    reference = copy.deepcopy(plan.model)
    wrapped = wrap_with_schedule(copy.deepcopy(plan.model), plan.made_for(), schedule.to_dict())
    eager = _train(reference, tokens, lengths)
    ours = _train(wrapped, tokens, lengths)
    same = all(
        torch.equal(a, b)
        for a, b in zip(reference.parameters(), wrapped.model.parameters(), strict=True)
    )
    symbolic = next((p for p in wrapped.plans if p.symbolic), None)
    check = _time_size_check(wrapped, tokens)
    peaks = {n: _peak(wrapped, tokens, n) for n in (40, 100, 200)}
    later = range(3, len(lengths))
    result = {
        "model": args.model,
        "batch_size": args.batch_size,
        "planned_length": args.planned,
        "lengths": lengths,
        "distinct_lengths": len(set(lengths)),
        "captures": [[p.how, p.symbolic] for p in wrapped.plans],
        "bitwise_equal": same,
        "eager_seconds": eager,
        "ours_seconds": ours,
        "first_three_seconds": sum(ours[:3]),
        "later_step_ratio": statistics.median(ours[k] / eager[k] for k in later),
        "predicted_overhead": schedule.predicted_overhead,
        "size_check_seconds": check,
        "peaks": {str(n): {"measured": m, "predicted": p} for n, (m, p) in peaks.items()},
        "symbolic_peaks_checked": len(symbolic.peaks_at) if symbolic else 0,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "lengths.json").write_text(json.dumps(result, indent=1))
    print(
        f"{args.model}, batch {args.batch_size}, planned at {args.planned} tokens, "
        f"{len(lengths)} steps at {result['distinct_lengths']} lengths (16 to {args.longest})"
    )
    print("| | seconds |")
    print("|---|---:|")
    print(
        f"| first three steps (planned, first other length, any length) | "
        f"{result['first_three_seconds']:.1f} |"
    )
    print(
        f"| later steps, median over eager's (the plan predicts "
        f"{1 + schedule.predicted_overhead:.2f}x at {args.planned} tokens) | "
        f"{result['later_step_ratio']:.2f}x |"
    )
    print(f"| predicting the peak at a new length | {check * 1000:.1f} ms |")
    print(
        f"captures: {len(wrapped.plans)} ({', '.join(p.how for p in wrapped.plans)}); "
        f"parameters bitwise equal: {same}"
    )
    for n, (measured, predicted) in peaks.items():
        print(f"peak at {n} tokens: measured {measured} B, predicted {predicted} B")


def _time_size_check(wrapped, tokens: torch.Tensor) -> float:
    """Seconds the runtime takes to predict a graph's peak at a length it has not run at
    (median of five lengths: the check runs once per new length)."""
    backend = wrapped.backend
    symbolic = next(iter(backend._symbolic.values()), None)
    if symbolic is None:
        return 0.0
    seconds = []
    for length in range(tokens.shape[1] - 5, tokens.shape[1]):
        symbolic.plan.peaks_at.pop((length,), None)
        start = time.perf_counter()
        backend._check_sizes(symbolic, (length,))
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


if __name__ == "__main__":
    main()
