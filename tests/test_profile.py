"""Profiles: every operator timed, saved as JSON, refused for another graph or device."""

from __future__ import annotations

import json

import pytest
from helpers import planner

from explorer.errors import UserError
from explorer.graph import PLACEHOLDER
from explorer.profile import StepProfile


@pytest.fixture(scope="module")
def profiled():
    plan = planner("sample:tiny_cnn", 2, 16)
    return plan, plan.profile()


def test_every_operator_is_timed(profiled):
    plan, profile = profiled
    (graph,) = plan.capture()
    (timed,) = profile.graphs
    operators = [n.name for n in graph.nodes if n.phase != PLACEHOLDER]
    # breaks if a graph's operators are skipped: the solver would think them free
    assert sorted(timed.seconds) == sorted(operators)
    assert all(s >= 0 for s in timed.seconds.values()) and profile.total_seconds > 0
    assert profile.device == "cpu" and "cpu" in profile.device_name


def test_round_trip_and_refusals(profiled, tmp_path):
    plan, profile = profiled
    path = profile.save(tmp_path / "profile.json")
    fingerprint = plan.capture()[0].fingerprint()
    again = StepProfile.load(path, fingerprint=fingerprint, device="cpu")
    assert again.graphs[0].seconds == profile.graphs[0].seconds
    assert again.graphs[0].graph.fingerprint() == fingerprint
    with pytest.raises(UserError, match="profile is for graph"):
        StepProfile.load(path, fingerprint="0" * 16)
    data = json.loads(path.read_text())
    data["device"] = "cuda:0"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match="made on cuda:0"):
        StepProfile.load(path, device="cpu")
    path.write_text('{"schema": 2, "graphs": [{"fingerprint": 3}]}')
    with pytest.raises(UserError, match="not a valid profile"):
        StepProfile.load(path)
    path.write_text('{"schema": 1, "fingerprint": "x"}')
    with pytest.raises(UserError, match="schema 1 is not 2"):
        StepProfile.load(path)
