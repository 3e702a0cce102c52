"""Run CBC (the binary that ships inside PuLP) and read back what it proved.

PuLP reports whether a solution is optimal or only feasible, but not the lower bound CBC had
proven when its time limit stopped it; CBC prints that bound in its log, so the log is
written to a private temporary folder and read here. The bundled CBC (2.10.3) sometimes
crashes when its time runs out just after it has read a MIP start; such a run counts as one
that found nothing new (the start is already known to the caller).

CBC is run without a `-threads` option, which keeps it on its serial code path: it is one
thread either way, but with `-threads 1` it goes through its threaded branch-and-bound, which
now and then waits on a lock until the time limit ends it (coin-or/Cbc issue 640). On
resnet50's 150 tiny stage ILPs (40 to 90 variables, each solved in 0.03 s) one to four runs
a setup sat out twice their 5 s limit that way: setup took 12 to 24 s instead of 1.4 s.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import pulp

# PuLP 3.3 warns at every command made that its bundled CBC moves to an extra in 4.0. One
# filter for that message, set once: `warnings.catch_warnings` around each run would swap the
# process's filters from every thread that solves (stage ILPs run side by side), and threads
# that restore them out of order leave them changed
warnings.filterwarnings("ignore", message="PULP_CBC_CMD is deprecated", category=DeprecationWarning)


@dataclass
class Outcome:
    """What one CBC run found: a solution (or none), whether it is proven optimal, and the
    best lower bound on the objective that CBC proved (None: none known)."""

    found: bool
    optimal: bool
    objective: float | None
    bound: float | None


def solve(
    prob: pulp.LpProblem, time_limit: float | None, warm_start: bool = False, relax: bool = False
) -> Outcome:
    """Solve `prob` (its LP relaxation if `relax`) with CBC on one thread."""
    folder = Path(tempfile.mkdtemp(prefix="remat_cbc_"))
    log_path = folder / "cbc.log"
    try:
        solver = command(time_limit, warm_start, relax, log_path)
        solver.tmpDir = str(folder)
        try:
            prob.solve(solver)
        except pulp.PulpSolverError:
            return Outcome(False, False, None, None)
        text = log_path.read_text(encoding="utf-8", errors="replace")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    found = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    optimal = prob.sol_status == pulp.LpSolutionOptimal
    objective = (pulp.value(prob.objective) or 0.0) if found else None
    bound = objective if optimal else _proven_bound(text)
    return Outcome(found, optimal, objective, bound)


def command(
    time_limit: float | None, warm_start: bool, relax: bool, log_path: Path
) -> pulp.PULP_CBC_CMD:
    """PuLP's CBC command for one run: serial (no `-threads`: see the module docstring),
    elapsed-time limit, log kept for the proven bound."""
    return pulp.PULP_CBC_CMD(
        msg=False,
        timeLimit=time_limit,
        warmStart=warm_start,
        logPath=str(log_path),
        mip=not relax,
        timeMode="elapsed",
    )


def _proven_bound(log: str) -> float | None:
    """The bound CBC had proven when it stopped before proving optimality: the last "best
    possible" of its progress lines (eight digits), else its summary's "Lower bound:", which
    it rounds to three decimals (0.0603 printed 0.060; a 0.0016 would read 0.002, a bound
    above what was proven, enough to call a slower schedule optimal at the cheap end)."""
    precise = re.findall(r"best possible (-?[0-9.]+(?:[eE][+-]?[0-9]+)?)", log)
    if precise:
        return float(precise[-1])
    match = re.search(r"^Lower bound:\s+(-?[0-9.eE+-]+)", log, re.MULTILINE)
    return float(match.group(1)) if match else None
