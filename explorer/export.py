"""Write a schedule as a plain Python module that wraps the model.

The module holds only literals (what it was made for, and the schedule) and a `wrap`
function that hands them to `explorer.backend`, the torch-only runtime. It is written
atomically: an interrupted export never leaves a half-written file. `read_module` reads those
literals back without running the file (ast.literal_eval), so a corrupt file is reported, not
executed.
"""

from __future__ import annotations

import ast
import pprint
from pathlib import Path

from explorer.errors import UserError
from explorer.files import check_module_target, write_atomic
from explorer.schedule import Schedule
from explorer.units import format_bytes

_TEMPLATE = '''"""Rematerialization schedule written by remat-explorer.

Model: {model}
Planned for inputs: {inputs}{autocast}
Budget: {budget}; predicted peak {peak} (no recomputation: {baseline});
predicted step time {overhead:+.1%} against the unmodified model.

Use it like the model itself:

    import {module}
    model = {module}.wrap(model)   # the same parameters, trained as usual
    loss = criterion(model(x), y); loss.backward(); optimizer.step()

`wrap` refuses a model with other parameters. Other input shapes (a smaller last batch,
another sequence length) reuse the plan, with a warning if they would exceed the budget.
Check it with `remat-explorer verify {filename}`.
"""

from explorer.backend import wrap_with_schedule

MADE_FOR = {made_for}

SCHEDULE = {schedule}


def wrap(model):
    """Return `model` wrapped so that its training step follows SCHEDULE."""
    return wrap_with_schedule(model, MADE_FOR, SCHEDULE)
'''


def write_module(
    schedule: Schedule, made_for: dict, path: str | Path, *, force: bool = False
) -> Path:
    """Write the schedule module to `path` (a .py file).

    An existing file is replaced only if it is itself a schedule, or with `force`; names that
    would shadow another module are refused (see `explorer.files.check_module_target`).
    """
    path = Path(path)
    check_module_target(path, force=force, is_schedule=is_schedule_file)
    model = made_for.get("model", {})
    text = _TEMPLATE.format(
        model=f"{model.get('name')} (batch {model.get('batch_size')}, input size "
        f"{model.get('input_size')})",
        inputs=_inputs_line(made_for.get("inputs", {})),
        autocast=f" under autocast {made_for['autocast']}" if made_for.get("autocast") else "",
        budget=format_bytes(schedule.budget_bytes) if schedule.budget_bytes else "none",
        peak=format_bytes(schedule.predicted_peak_bytes),
        baseline=format_bytes(made_for.get("baseline_peak_bytes", 0)),
        overhead=schedule.predicted_overhead,
        module=path.stem,
        filename=path.name,
        made_for=pprint.pformat(made_for, width=100, sort_dicts=False),
        schedule=pprint.pformat(_plain(schedule), width=100, compact=True, sort_dicts=False),
    )
    return write_atomic(path, text)


def _plain(schedule: Schedule) -> dict:
    return schedule.to_dict()


def _inputs_line(inputs: dict) -> str:
    def one(x: object) -> str:
        return f"{tuple(x['shape'])} {x['dtype']}" if isinstance(x, dict) else str(x)

    parts = [one(a) for a in inputs.get("args", [])]
    parts += [f"{k}={one(v)}" for k, v in inputs.get("kwargs", {}).items()]
    return ", ".join(parts) or "none"


def is_schedule_file(path: Path) -> bool:
    """Whether `path` reads as a schedule module (without running it)."""
    try:
        read_module(path)
    except (UserError, OSError):
        return False
    return True


def read_module(path: str | Path) -> tuple[dict, dict]:
    """(MADE_FOR, SCHEDULE) of an exported file, read without executing it."""
    path = Path(path)
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except FileNotFoundError as exc:
        raise UserError(f"{path}: no such file") from exc
    except (SyntaxError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"{path}: corrupt schedule file ({type(exc).__name__})") from exc
    found: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in ("MADE_FOR", "SCHEDULE"):
                try:
                    found[target.id] = ast.literal_eval(node.value)
                except ValueError as exc:
                    raise UserError(f"{path}: corrupt {target.id} in schedule file") from exc
    if not isinstance(found.get("MADE_FOR"), dict) or not isinstance(found.get("SCHEDULE"), dict):
        raise UserError(f"{path}: not a remat-explorer schedule (no MADE_FOR / SCHEDULE)")
    try:
        Schedule.from_dict(found["SCHEDULE"])  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise UserError(f"{path}: corrupt SCHEDULE in schedule file ({exc})") from exc
    return found["MADE_FOR"], found["SCHEDULE"]  # type: ignore[return-value]
