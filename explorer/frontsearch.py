"""A front's budget solved by itself, from the files a sweep wrote (`export --search`).

A sweep answers a large step's budgets from the chain table (explorer.solve.LARGE_SWEEP_TOTAL),
and any step's budget between two of its points with the point below. Asked by itself, a
budget is searched (`Planner.solve`): here the planner is made again from what front.json
records (the model's SPEC, batch and input size, autocast, loss, held gradients, the device
or the device planned for) and from the profile and solver cache the sweep left beside it,
so that the step solved is the one the front was made for, with the same operator times.
"""

from __future__ import annotations

import math
from pathlib import Path

from explorer.errors import BelowMinimum, UserError
from explorer.schedule import Schedule
from explorer.sweep import Front


def planner_of(front: Front, folder: Path):
    """The Planner of the step `front` was swept for, with the profile of `folder` (none for a
    front planned with --plan-for: its cost model predicts again) and its solver cache.
    Refuses, in one line, a front whose model cannot be rebuilt or whose step differs."""
    from explorer.profile import StepProfile
    from explorer.verify import AUTOCAST_DTYPES, recorded_spec

    made = front.model
    if not isinstance(made.get("model"), dict) or not made["model"].get("name"):
        raise UserError("the front does not record the model it was made for: sweep it again")
    model = recorded_spec(made, "the front", "solve the budget from Python with Planner.solve")
    _time_limit(front)  # a corrupt one refused before the model is built
    if made.get("autocast") not in (None, *AUTOCAST_DTYPES):
        raise UserError(f"the front was planned under an unknown autocast {made['autocast']!r}")
    plan_for = front.setup.get("plan_for")
    plan = _planned(made, model, plan_for) if plan_for else _measured(made)
    fingerprint = "+".join(g.fingerprint() for g in plan.capture())
    if fingerprint != front.fingerprint:
        raise UserError(
            f"{model['name']} now traces to graph {fingerprint}, the front was swept for "
            f"{front.fingerprint} (another version of the model or of torch): sweep it again"
        )
    if not plan_for:
        path = folder / "profile.json"
        if not path.exists():
            raise UserError(f"--search solves with the sweep's profile: {path} is missing")
        plan.use_profile(StepProfile.load(path, fingerprint=fingerprint, device=str(plan.device)))
    plan.solver_cache = folder / "solver_cache.json"
    return plan


def search_budget(front: Front, plan, budget: int | str | float) -> tuple[Schedule, bool]:
    """The fastest schedule within `budget`, solved by itself with `plan` (planner_of), and
    whether it beats the front's point within it (if not, that point is returned: never a
    slower schedule). A budget under the front's least peak is refused as `export` refuses
    it; one the front meets is never refused (a solver without the sweep's cache may not
    know the sweep's least peak)."""
    swept = front.at_budget(budget)
    time_limit = _time_limit(front)
    plan.solver(time_limit, name=front.setup.get("solver"))
    try:
        searched = plan.solve(budget, time_limit)
    except BelowMinimum:
        return swept, False
    if searched.predicted_overhead < swept.predicted_overhead:
        return searched, True
    return swept, False


def _time_limit(front: Front) -> float | None:
    """The time limit the front's solver had (sweep --time-limit), or None."""
    limit = front.setup.get("time_limit")
    if limit is not None and not (isinstance(limit, (int, float)) and 0 < limit < math.inf):
        raise UserError(f"the front's time limit {limit!r} is not a number of seconds")
    return limit


def _measured(made: dict):
    from explorer.planner import Planner
    from explorer.verify import build_recorded, recorded_autocast

    built = build_recorded(made)
    return Planner(
        built.model,
        built.example_inputs,
        built.example_kwargs,
        spec=built.spec,
        autocast=recorded_autocast(made),
        gradients_held=bool(made.get("gradients_held", False)),
        loss=made.get("loss"),
    )


def _planned(made: dict, model: dict, plan_for: str):
    from explorer.costmodel import meta_planner

    return meta_planner(
        model["name"],
        model.get("batch_size"),
        model.get("input_size"),
        str(plan_for),
        loss=made.get("loss"),
        gradients_held=bool(made.get("gradients_held", False)),
    )
