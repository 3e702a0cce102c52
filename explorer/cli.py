"""remat-explorer: fit a PyTorch training step into less memory by recomputing activations.

Exit codes: 0 done, 1 `verify` found a difference, 2 bad input (one line on stderr), 3 a
bug in remat-explorer, 130 interrupted (Ctrl+C), 141 the reader of stdout went away.
Files are written atomically and checked before any work, so an error never leaves a
half-written file or replaces one. The full contract: docs/DESIGN.md ("Command line").
"""

from __future__ import annotations

import os
import signal
import sys

EXIT_INTERRUPTED = 130  # 128 + SIGINT
INTERRUPTED = "remat-explorer: interrupted"


def _exit_interrupted(signum: int, frame: object) -> None:
    """Ctrl+C where nothing is to be cleaned up and no exception may be raised: while the
    program loads, or while torch runs (see _Interrupts). What was printed is kept."""
    try:
        sys.stdout.flush()
    except (OSError, RuntimeError, ValueError):  # a reader gone, a write the signal cut into
        pass
    clear = "\r\x1b[K" if sys.stderr.isatty() else ""  # a progress bar's line, on a terminal
    os.write(sys.stderr.fileno(), f"{clear}{INTERRUPTED}\n".encode())
    os._exit(EXIT_INTERRUPTED)


_AS_PROGRAM = __name__ == "__main__" or os.path.basename(sys.argv[0]) == "remat-explorer"
if _AS_PROGRAM and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _exit_interrupted)  # first, before the imports below

import argparse  # noqa: E402
import contextlib  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import multiprocessing  # noqa: E402
import threading  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from types import FrameType  # noqa: E402

from explorer.devices import device_names  # noqa: E402
from explorer.errors import (  # noqa: E402
    Cancelled,
    OtherStep,
    RematWarning,
    UserError,
    first_line,
    message_line,
)
from explorer.units import format_bytes, format_seconds  # noqa: E402

EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader left
_LIBRARIES = ("torch", "torchvision")  # loaded first, where Ctrl+C exits at once


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(f"{self.prog}: {message} (see --help)")


def _positive_int(text: str) -> int:
    """argparse type: a whole number of at least 1 ("1e9" and "2.5" are refused)."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {text!r}")
    return int(text)


def _points(text: str) -> int:
    value = _positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"a sweep needs at least 2 points, not {text!r}")
    return value


def _seconds(text: str) -> float:
    """argparse type: a finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, not {text!r}")
    return value


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _tqdm_progress(desc: str) -> tuple[Callable[[int, int, str], None], Callable[[], None]]:
    from tqdm import tqdm

    bar = tqdm(
        desc=desc, unit="step", file=sys.stderr, leave=False, dynamic_ncols=True, disable=None
    )  # None: shown on a terminal, silent in logs

    def update(done: int, total: int, message: str) -> None:
        bar.total = total
        bar.n = done
        if message:  # what the step under way is: a sweep's least peak takes seconds at 0
            bar.set_postfix_str(message, refresh=False)
        bar.refresh()

    return update, bar.close


def _planner(args: argparse.Namespace):
    import torch

    from explorer.files import check_writable_folder
    from explorer.models import build
    from explorer.planner import Planner

    check_writable_folder(Path(args.out))  # before minutes of work, and before writing

    if getattr(args, "plan_for", None):  # sweep's alone
        return _meta_planner(args)
    device = args.device or _default_device()
    built = build(args.model, args.batch_size, args.input_size, device=device)
    if built.kind == "custom" and args.batch_size not in (None, built.spec.batch_size):
        raise UserError(
            f"{args.model} returns example inputs of batch {built.spec.batch_size}, not "
            f"--batch-size {args.batch_size}: leave --batch-size out (its inputs decide)"
        )
    return Planner(
        built.model,
        built.example_inputs,
        built.example_kwargs,
        spec=built.spec,
        autocast={"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp),
        gradients_held=getattr(args, "gradients_held", False),  # sweep's alone
        loss=args.loss,
    )


def _meta_planner(args: argparse.Namespace):
    """`sweep --plan-for DEVICE`: the step captured on the meta device, its operators'
    seconds predicted for DEVICE (explorer.costmodel): nothing is allocated, run or timed."""
    from explorer.costmodel import meta_planner

    if args.device:
        raise UserError("--plan-for captures on the meta device: leave --device out")
    if args.amp not in (None, "none"):
        raise UserError("--plan-for plans steps without autocast: leave --amp out")
    if args.batch_size is None:
        raise UserError("--plan-for needs --batch-size: the size to plan for")
    return meta_planner(
        args.model,
        args.batch_size,
        args.input_size,
        args.plan_for,
        loss=args.loss,
        gradients_held=args.gradients_held,
    )


def _profile(plan, out: Path):
    """Profile into OUT/profile.json, or reuse the one there. One made for another step or
    device, or a corrupt one, is refused rather than overwritten."""
    from explorer.losses import loss_name
    from explorer.profile import StepProfile

    path = out / "profile.json"
    if path.exists():
        try:
            profile = StepProfile.load(path, device=str(plan.device))
            plan.use_profile(profile)
        except OtherStep:  # both steps in words, not their graphs' fingerprints
            spec = plan.spec
            this = _step_words(
                spec.name, spec.batch_size, spec.input_size, plan.autocast, loss_name(plan.loss)
            )
            refused = (
                f"{path} was profiled for another step{_step_in(out, profile.fingerprint)} "
                f"than this one ({this})"
            )
        except UserError as exc:
            refused = str(exc)
        else:
            print(f"reusing {path}", file=sys.stderr)
            return plan.profile()
        # kept, not overwritten: say how to profile this step
        raise UserError(
            f"{refused}; to profile this step, give --out another folder or delete {path}"
        )
    update, close = _tqdm_progress("profile")
    try:
        profile = plan.profile(progress=update)
    finally:
        close()
    profile.save(path)
    return profile


def _step_words(
    name: object, batch_size: object, input_size: object, autocast: object, loss: object
) -> str:
    """A step in a few words: "sample:tiny_cnn, batch 4, input 32, bf16, loss cross_entropy"."""
    words = [str(name)]
    if batch_size is not None:
        words.append(f"batch {batch_size}")
    if input_size is not None:
        words.append(f"input {input_size}")
    if autocast is not None:
        words.append(
            {"torch.bfloat16": "bf16", "torch.float16": "fp16"}.get(str(autocast), str(autocast))
        )
    if loss:
        words.append(f"loss {loss}")
    return ", ".join(words)


def _step_in(out: Path, fingerprint: str) -> str:
    """The step the front.json in `out` was swept for, as " (SPEC, batch B, ...)", where it
    was swept from the profile of `fingerprint`; "" where there is no such front to read."""
    from explorer.sweep import Front

    try:
        front = Front.load(out / "front.json")
    except UserError:
        return ""
    model = front.model.get("model")
    if front.fingerprint != fingerprint or not isinstance(model, dict) or "name" not in model:
        return ""
    made = front.model
    words = _step_words(
        model["name"],
        model.get("batch_size"),
        model.get("input_size"),
        made.get("autocast"),
        made.get("loss"),
    )
    return f" ({words})"


def cmd_models(_args: argparse.Namespace) -> int:
    from explorer.models import list_specs

    print("\n".join(list_specs()))
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from explorer.timingrounds import timing_seconds

    timing_seconds()  # a bad $REMAT_EXPLORER_TIMING_SECONDS: refused before any work
    plan = _planner(args)
    out = Path(args.out)
    profile = _profile(plan, out)
    graphs = {p.fingerprint: p for p in profile.graphs}  # a graph run several times: once
    operators = sum(len(p.seconds) for p in graphs.values())
    runs = f" ({len(profile.graphs)} runs)" if len(profile.graphs) > len(graphs) else ""
    print(
        f"profiled {operators} operators in {len(graphs)} graph(s){runs} on "
        f"{profile.device_name}: {format_seconds(profile.total_seconds)} per step; "
        f"wrote {out / 'profile.json'}"
    )
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    import time

    from explorer.solvers.registry import search_seconds
    from explorer.timingrounds import timing_seconds

    search_seconds()  # a bad $REMAT_EXPLORER_SEARCH_SECONDS: refused before any work
    if not args.plan_for:  # a predicted profile times nothing
        timing_seconds()
    plan = _planner(args)
    out = Path(args.out)
    started = time.perf_counter()
    if args.plan_for:  # predicted, not measured: no profile.json a later sweep would reuse
        print(f"planning for {plan.profile().device_name}: nothing is run", file=sys.stderr)
    else:
        _profile(plan, out)
    plan.solver_cache = out / "solver_cache.json"
    update, close = _tqdm_progress("stage ILPs")
    try:
        solver = plan.solver(args.time_limit, progress=update, name=args.solver)
    finally:
        close()
    setup = solver.setup
    print(
        f"{setup.graphs} graph(s), chain of {setup.stages} stages, "
        f"{setup.distinct_stages} distinct: {setup.ilps} ILPs "
        f"(CBC) in {setup.ilp_seconds:.2f} s, table in {setup.table_seconds:.2f} s"
    )
    print(
        f"{'budget':>12} {'predicted peak':>15} {'overhead':>9} {'solve s':>8} {'gap':>6}  status"
    )
    update, close = _tqdm_progress("sweep")
    printed: dict[int, float] = {}  # id of each point printed: the gap it showed
    budgets: set[int] = set()  # of the points printed

    def row(point) -> None:
        if point.budget_bytes in budgets and id(point) not in printed:
            print("  faster within that budget, found by a later search:")
        budgets.add(point.budget_bytes)
        printed[id(point)] = point.gap
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
    bounded = [p for p in front.points if printed.get(id(p), p.gap) != p.gap]
    if bounded:
        print("gaps bounded afterwards, with the time the sweep left:")
        for point in bounded:
            row(point)
    front.save(out / "front.json")
    count = len(front.points)
    print(
        f"front: {count} Pareto point{'s' if count != 1 else ''}; no recomputation "
        f"{format_bytes(front.baseline_peak_bytes)}; "
        f"sweep took {time.perf_counter() - started:.1f} s; wrote {out / 'front.json'}"
    )
    for line in (front.nothing_lower(), *front.notes()):
        if line:
            print(line)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from explorer.export import write_module
    from explorer.sweep import Front

    front = Front.load(args.front)
    if args.search:
        schedule, made_for = _searched(front, args)
    else:
        schedule, made_for = front.at_budget(args.budget), front.model
    path = write_module(schedule, made_for, args.out, force=args.force)
    print(
        f"wrote {path}: predicted peak {format_bytes(schedule.predicted_peak_bytes)}, "
        f"overhead {schedule.predicted_overhead:+.1%}"
    )
    if front.above_unmodified(schedule):
        line = format_bytes(front.unmodified_peak_bytes)
        why = "; ".join(front.why_above_unmodified())
        print(
            f"remat-explorer: warning: it peaks above the unmodified model's {line}"
            " (measured when profiling): the model run as it is needs less memory"
            + (f" ({why})" if why else ""),
            file=sys.stderr,
        )
    return 0


def _searched(front, args: argparse.Namespace):
    """`export --search`: the budget solved by itself (explorer.frontsearch), said on stderr
    against the front's point within it; the schedule and what its file records."""
    import time

    from tqdm import tqdm

    from explorer.export import is_schedule_file
    from explorer.files import check_module_target
    from explorer.frontsearch import planner_of, search_budget
    from explorer.solvers.registry import search_seconds

    search_seconds()  # a bad $REMAT_EXPLORER_SEARCH_SECONDS: refused before any work
    check_module_target(Path(args.out), force=args.force, is_schedule=is_schedule_file)
    swept = front.at_budget(args.budget)  # under the front's least peak: refused at once
    started = time.perf_counter()
    update, close = _tqdm_progress("export --search")
    try:
        update(0, 2, "building the model again and tracing its step")  # seconds, said
        plan = planner_of(front, Path(args.front).parent)  # refusals: one line, before this
        times = "the cost model's times" if front.setup.get("plan_for") else "the sweep's profile"
        tqdm.write(f"solving the budget by itself with {times}", file=sys.stderr)
        update(1, 2, "searching the budget")
        schedule, better = search_budget(front, plan, args.budget)
    finally:
        close()
    took = time.perf_counter() - started
    if not better:
        print(
            f"searched in {took:.1f} s: nothing faster than the front's point within the budget",
            file=sys.stderr,
        )
        return schedule, front.model
    print(
        f"searched in {took:.1f} s: overhead {schedule.predicted_overhead:+.1%} where the "
        f"front's point within the budget has {swept.predicted_overhead:+.1%} "
        f"({schedule.status}, gap {schedule.gap:.2%})",
        file=sys.stderr,
    )
    return schedule, schedule.context.made_for()


def cmd_verify(args: argparse.Namespace) -> int:
    from explorer.verify import verify

    report = verify(args.file, device=args.device)
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.format_table())
    return 0 if report.ok else 1


def cmd_app(args: argparse.Namespace) -> int:
    from remat_explorer.apps.launch import serve

    return serve(args.port, args.model, args.batch_size, args.input_size)


def _model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", required=required, help="resnet50, sample:unet, or pkg.mod:factory")
    p.add_argument(
        "--batch-size",
        type=_positive_int,
        default=None,
        help=("needed unless a model factory returns its own example inputs" if required else None),
    )
    p.add_argument(
        "--input-size",
        type=_positive_int,
        default=None,
        help="image side or sequence length (default: the model's own)",
    )


def _step_args(p: argparse.ArgumentParser) -> None:
    """What the planned step is, beyond the model: autocast, and the loss it backpropagates."""
    p.add_argument(
        "--amp",
        choices=["none", "bf16", "fp16"],
        default="none",
        help="plan the step under torch.autocast with this dtype (a plan of its own)",
    )
    p.add_argument(
        "--loss",
        choices=["cross_entropy"],
        default=None,
        help="backpropagate this loss of the output, on fixed random classes (default: a "
        "random gradient for every output)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="remat-explorer",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n")[1],
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("app", help="serve the dashboard on 127.0.0.1")
    p.add_argument("--port", type=int, default=None)
    _model_args(p, required=False)
    p.set_defaults(func=cmd_app)

    p = sub.add_parser("models", help="list the model SPECs available here")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("profile", help="time every operator of a training step")
    _model_args(p)
    _step_args(p)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None)
    p.add_argument("--out", required=True, help="folder for profile.json")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("sweep", help="solve budgets from the minimum to no recomputation")
    _model_args(p)
    _step_args(p)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None)
    p.add_argument("--points", type=_points, default=12, help="budgets to solve (at least 2)")
    p.add_argument("--time-limit", type=_seconds, default=None, help="seconds per ILP solve")
    p.add_argument(
        "--solver",
        choices=["chain", "exact", "table"],
        default="chain",
        help="chain (default), exact (whole-step MILP, small models), table (fastest)",
    )
    p.add_argument(
        "--gradients-held",
        action="store_true",
        help="each step starts with the last one's gradients (gradient accumulation): "
        "count them in every peak",
    )
    p.add_argument(
        "--plan-for",
        metavar="DEVICE",
        default=None,
        help=f"plan for a device this machine need not have ({', '.join(device_names())}), "
        "at any --batch-size, with predicted operator times: the model is captured on the "
        "meta device and nothing runs; writes no profile.json",
    )
    p.add_argument("--out", required=True, help="folder for profile.json and front.json")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("export", help="write the schedule for a budget as a Python module")
    p.add_argument("--front", required=True, help="a front.json written by sweep")
    p.add_argument(
        "--budget",
        required=True,
        help="a size with a unit (4GB, 512MiB, 300000B) or a fraction with a decimal point "
        "(0.5: half of the activation memory, 1.0: no recomputation); a bare whole number "
        "such as 1 is refused as ambiguous",
    )
    p.add_argument(
        "--out",
        required=True,
        help="the .py file to write; an existing file is replaced only if it is a schedule",
    )
    p.add_argument("--force", action="store_true", help="replace --out whatever it holds")
    p.add_argument(
        "--search",
        action="store_true",
        help="solve the budget by itself rather than take the front's point within it: the "
        "model is built again from its SPEC and solved with the profile.json and solver cache "
        "beside --front (seconds; on a large step the front's points are the chain table's)",
    )
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("verify", help="check an exported schedule against the unmodified model")
    p.add_argument("file")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_verify)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit code (see the module docstring).

    Everything that takes time, torch's import included, happens in here, under the Ctrl+C
    handler: so an interrupt at any moment is one line and exit code 130.
    """
    interrupts = _Interrupts()
    with interrupts.handled():
        try:
            args = build_parser().parse_args(argv)
            if args.func is not cmd_app:  # the dashboard loads torch in its own kernel
                interrupts.load(_LIBRARIES)
            code = args.func(args)
            sys.stdout.flush()  # here, not at exit: a reader that left is a BrokenPipeError now
            return code
        except UserError as err:
            if interrupts.seen:  # e.g. a capture that failed as the Ctrl+C unwound it
                return _interrupted()
            return _fail(str(err))
        except (Cancelled, KeyboardInterrupt):
            return _interrupted()
        except BrokenPipeError:
            return _broken_pipe()
        except Exception as err:
            if interrupts.seen:  # e.g. CBC, killed by the same Ctrl+C, seen as its error
                return _interrupted()
            if _out_of_memory(err):
                return _fail(
                    f"out of memory ({message_line(err)}); "
                    "use a smaller --batch-size or --input-size"
                )
            if os.environ.get("REMAT_EXPLORER_DEBUG"):  # a bug: one line, traceback on request
                raise
            return _fail(
                f"internal error: {first_line(err)} (set REMAT_EXPLORER_DEBUG=1 for the traceback)",
                EXIT_INTERNAL,
            )


class _Interrupts:
    """Ctrl+C while a command runs: the first raises KeyboardInterrupt (so temporary files
    are removed on the way out), a second one exits at once."""

    def __init__(self) -> None:
        self.seen = False
        self.loading = False

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # a program leaves at once where raising is unsafe; a caller's process is theirs
        if _AS_PROGRAM and (self.loading or _unsafe_to_raise_in(frame)):
            _exit_interrupted(signum, frame)
        if self.seen:
            os._exit(EXIT_INTERRUPTED)
        self.seen = True
        raise KeyboardInterrupt

    def load(self, modules: tuple[str, ...]) -> None:
        """Import `modules` with Ctrl+C exiting the program at once. Their C++ initialisers
        call back into Python, and a KeyboardInterrupt raised there cannot cross C++: the
        process aborted (exit -6, a C++ trace). Nothing is written before this."""
        self.loading = True
        try:
            for name in modules:
                importlib.import_module(name)
        finally:
            self.loading = False

    @contextlib.contextmanager
    def handled(self) -> Iterator[None]:
        """Install the handler for the block (main thread only, and not where SIGINT is
        ignored, as in a background job); put the previous one back after."""
        previous = signal.getsignal(signal.SIGINT)
        install = threading.current_thread() is threading.main_thread() and previous in (
            signal.default_int_handler,
            _exit_interrupted,
        )
        if install:
            signal.signal(signal.SIGINT, self._on_signal)
        show_warning = warnings.showwarning
        warnings.showwarning = self._quiet_once_interrupted(show_warning)
        try:
            yield
        finally:
            warnings.showwarning = show_warning
            if install:
                signal.signal(signal.SIGINT, previous)

    def _quiet_once_interrupted(self, show_warning: Callable[..., None]) -> Callable[..., None]:
        """Warnings pass through until Ctrl+C, the tool's own as one line; after it they are
        dropped. What torch warns while the interrupt unwinds is noise: anomaly mode, under
        which AOTAutograd traces a backward, reports the KeyboardInterrupt as an error with
        the forward's whole stack."""

        def show(
            message: Warning | str, category: type[Warning], *args: object, **kwargs: object
        ) -> None:
            if self.seen:
                return
            if issubclass(category, RematWarning):  # ours: one line, as errors are
                text = str(message).removeprefix("remat-explorer: ")
                print(f"remat-explorer: warning: {text}", file=sys.stderr)
            else:
                show_warning(message, category, *args, **kwargs)

        return show


def _unsafe_to_raise_in(frame: FrameType | None) -> bool:
    """Whether a KeyboardInterrupt raised at `frame` could reach torch's C++ and must not be
    raised: torch's Python is on the stack, and no child process waits to be ended.

    torch calls Python from C++ (Dynamo's fake-tensor rules, dispatch, hooks). An exception
    raised there either aborts the process with a C++ trace (1 interrupt in 300 during a
    capture, exit -6) or comes back as another error (once in CI, "cannot capture the
    model: BackendCompilerFailed"). Leaving at once is safe there: files are written whole
    (explorer.files) and never while torch runs. The solver's window worker is ended by the
    KeyboardInterrupt's unwinding, so with it alive the interrupt is raised as before (the
    solver runs no torch; its background search is ended by the same unwinding)."""
    torch = sys.modules.get("torch")
    if torch is None or multiprocessing.active_children():
        return False
    package = os.path.dirname(torch.__file__) + os.sep
    while frame is not None:
        if frame.f_code.co_filename.startswith(package):
            return True
        frame = frame.f_back
    return False


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> int:
    print(f"remat-explorer: error: {message}", file=sys.stderr, flush=True)
    return code


def _interrupted() -> int:
    """One line, exit 130. As a program, leave at once: an interrupt that landed inside code
    torch runs through the interpreter's C API leaves CPython marked as killed by SIGINT, and
    its normal exit would then end the process by that signal (exit -2) instead of 130."""
    print(INTERRUPTED, file=sys.stderr, flush=True)
    if _AS_PROGRAM:
        sys.stdout.flush()
        os._exit(EXIT_INTERRUPTED)
    return EXIT_INTERRUPTED


def _broken_pipe() -> int:
    """stdout's reader left (`remat-explorer models | head`): stop quietly. Point stdout at
    /dev/null so that the interpreter's own flush at exit does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


def _out_of_memory(err: Exception) -> bool:
    """torch.OutOfMemoryError (CUDA) or a CPU allocation that failed."""
    text = str(err)
    return type(err).__name__ == "OutOfMemoryError" or (
        isinstance(err, RuntimeError)
        and ("can't allocate memory" in text or "out of memory" in text)
    )


if __name__ == "__main__":
    sys.exit(main())
