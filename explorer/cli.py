"""The `remat-explorer` command line (contract in DESIGN.md).

Bad input (unknown model, infeasible budget, corrupt or mismatched file) prints one line on
stderr and exits 2; files are written atomically, so nothing is left half-written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from explorer.errors import Cancelled, UserError
from explorer.units import format_bytes

EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {message} (see --help)")


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _tqdm_progress(desc: str) -> tuple[Callable[[int, int, str], None], Callable[[], None]]:
    from tqdm import tqdm

    bar = tqdm(
        desc=desc, unit="step", file=sys.stderr, leave=False, dynamic_ncols=True, disable=None
    )  # None: shown on a terminal, silent in logs

    def update(done: int, total: int, _message: str) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    return update, bar.close


def _planner(args: argparse.Namespace):
    from explorer.models import build
    from explorer.planner import Planner

    device = args.device or _default_device()
    built = build(args.model, args.batch_size, args.input_size, device=device)
    return Planner(built.model, built.example_inputs, spec=built.spec)


def _profile(plan, out: Path):
    """Profile into OUT/profile.json, or reuse the one there. One made for another graph or
    device, or a corrupt one, is refused rather than overwritten."""
    from explorer.profile import Profile

    path = out / "profile.json"
    graph = plan.capture()
    if path.exists():
        plan.use_profile(
            Profile.load(path, fingerprint=graph.fingerprint(), device=str(plan.device))
        )
        print(f"reusing {path}", file=sys.stderr)
        return plan.profile()
    update, close = _tqdm_progress("profile")
    try:
        profile = plan.profile(progress=update)
    finally:
        close()
    profile.save(path)
    return profile


def cmd_models(_args: argparse.Namespace) -> int:
    from explorer.models import list_specs

    print("\n".join(list_specs()))
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    plan = _planner(args)
    out = Path(args.out)
    profile = _profile(plan, out)
    total = sum(profile.seconds.values())
    print(
        f"profiled {len(profile.seconds)} operators on {profile.device_name}: "
        f"{total:.3f} s per step; wrote {out / 'profile.json'}"
    )
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    import time

    plan = _planner(args)
    out = Path(args.out)
    started = time.perf_counter()
    _profile(plan, out)
    plan.solver_cache = out / "solver_cache.json"
    update, close = _tqdm_progress("stage ILPs")
    try:
        solver = plan.solver(args.time_limit, progress=update, name=args.solver)
    finally:
        close()
    setup = solver.setup
    print(
        f"chain of {setup.stages} stages, {setup.distinct_stages} distinct: {setup.ilps} ILPs "
        f"(CBC) in {setup.ilp_seconds:.2f} s, table in {setup.table_seconds:.2f} s"
    )
    print(
        f"{'budget':>12} {'predicted peak':>15} {'overhead':>9} {'solve s':>8} {'gap':>6}  status"
    )
    update, close = _tqdm_progress("sweep")

    def row(point) -> None:
        print(
            f"{format_bytes(point.budget_bytes):>12} "
            f"{format_bytes(point.predicted_peak_bytes):>15} "
            f"{point.predicted_overhead:>+9.1%} {point.solve_seconds:>8.3f} "
            f"{point.gap:>6.2%}  {point.status}",
            flush=True,
        )

    try:
        front = plan.sweep(args.points, args.time_limit, progress=update, on_point=row)
    finally:
        close()
    front.save(out / "front.json")
    print(
        f"front: {len(front.points)} Pareto points; no recomputation "
        f"{format_bytes(front.baseline_peak_bytes)}; "
        f"sweep took {time.perf_counter() - started:.1f} s; wrote {out / 'front.json'}"
    )
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from explorer.export import write_module
    from explorer.sweep import Front

    front = Front.load(args.front)
    schedule = front.at_budget(args.budget)
    path = write_module(schedule, front.model, args.out)
    print(
        f"wrote {path}: predicted peak {format_bytes(schedule.predicted_peak_bytes)}, "
        f"overhead {schedule.predicted_overhead:+.1%}"
    )
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from explorer.verify import verify

    report = verify(args.file, device=args.device)
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.format_table())
    return 0 if report.ok else 1


def cmd_app(args: argparse.Namespace) -> int:
    from apps.launch import serve

    return serve(args.port, args.model, args.batch_size, args.input_size)


def _model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", required=required, help="resnet50, sample:unet, or pkg.mod:factory")
    p.add_argument("--batch-size", type=int, required=required)
    p.add_argument(
        "--input-size",
        type=int,
        default=None,
        help="image side or sequence length (default: the model's own)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="remat-explorer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("app", help="serve the dashboard on 127.0.0.1")
    p.add_argument("--port", type=int, default=None)
    _model_args(p, required=False)
    p.set_defaults(func=cmd_app)

    p = sub.add_parser("models", help="list the model SPECs available here")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("profile", help="time every operator of a training step")
    _model_args(p)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None)
    p.add_argument("--out", required=True, help="folder for profile.json")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("sweep", help="solve budgets from the minimum to no recomputation")
    _model_args(p)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None)
    p.add_argument("--points", type=int, default=12)
    p.add_argument("--time-limit", type=float, default=None, help="seconds per ILP solve")
    p.add_argument(
        "--solver",
        choices=["chain", "exact", "table"],
        default="chain",
        help="chain (default), exact (whole-step MILP, small models), table (fastest)",
    )
    p.add_argument("--out", required=True, help="folder for profile.json and front.json")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("export", help="write the schedule for a budget as a Python module")
    p.add_argument("--front", required=True, help="a front.json written by sweep")
    p.add_argument(
        "--budget",
        required=True,
        help="bytes (4GB, 512MiB) or a fraction of the activation memory (0.5)",
    )
    p.add_argument("--out", required=True, help="the .py file to write")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("verify", help="check an exported schedule against the unmodified model")
    p.add_argument("file")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_verify)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except UserError as err:
        print(f"remat-explorer: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (Cancelled, KeyboardInterrupt):
        print("remat-explorer: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a bug: say so in one line, the traceback on request
        if os.environ.get("REMAT_EXPLORER_DEBUG"):
            raise
        print(
            f"remat-explorer: internal error: {type(err).__name__}: {err} "
            "(set REMAT_EXPLORER_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
