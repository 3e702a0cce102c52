"""Run CBC (the binary that ships inside PuLP) and read back what it proved.

PuLP reports whether a solution is optimal or only feasible, but not the lower bound CBC
had proven when its time limit stopped it; CBC prints that bound in its log, so the log is
written to a temporary file and read here.
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from dataclasses import dataclass

import pulp


@dataclass
class Outcome:
    """What one CBC run found: a solution (or none), whether it is proven optimal, and the
    best lower bound on the objective that CBC proved (None: none known)."""

    found: bool
    optimal: bool
    objective: float | None
    bound: float | None
    infeasible: bool = False


def solve(
    prob: pulp.LpProblem, time_limit: float | None, warm_start: bool = False, relax: bool = False
) -> Outcome:
    """Solve `prob` (its LP relaxation if `relax`) with CBC on one thread."""
    handle, log_path = tempfile.mkstemp(prefix="cbc_", suffix=".log")
    os.close(handle)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PuLP 3.3 warns the bundled CBC moves in 4.0
            solver = pulp.PULP_CBC_CMD(
                msg=False,
                timeLimit=time_limit,
                threads=1,
                warmStart=warm_start,
                logPath=log_path,
                mip=not relax,
                timeMode="elapsed",
            )
            prob.solve(solver)
        with open(log_path, encoding="utf-8", errors="replace") as log:
            text = log.read()
    finally:
        os.unlink(log_path)
    found = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    optimal = prob.sol_status == pulp.LpSolutionOptimal
    objective = pulp.value(prob.objective) if found else None
    if objective is None and found:
        objective = 0.0
    bound = _proven_bound(text)
    if optimal:
        bound = objective
    infeasible = prob.status == pulp.LpStatusInfeasible and not found
    return Outcome(found, optimal, objective, bound, infeasible)


def _proven_bound(log: str) -> float | None:
    """The 'Lower bound:' CBC prints when it stops before proving optimality."""
    match = re.search(r"^Lower bound:\s+(-?[0-9.eE+-]+)", log, re.MULTILINE)
    return float(match.group(1)) if match else None
