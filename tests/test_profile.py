"""Profiles: every operator timed, saved as JSON, refused for another graph or device."""

from __future__ import annotations

import json

import pytest
from helpers import planner

from explorer.errors import UserError
from explorer.graph import PLACEHOLDER
from explorer.profile import Profile


@pytest.fixture(scope="module")
def profiled():
    plan = planner("sample:tiny_cnn", 2, 16)
    return plan, plan.profile()


def test_every_operator_is_timed(profiled):
    plan, profile = profiled
    operators = [n.name for n in plan.capture().nodes if n.phase != PLACEHOLDER]
    assert sorted(profile.seconds) == sorted(operators)
    assert all(s >= 0 for s in profile.seconds.values()) and sum(profile.seconds.values()) > 0
    assert profile.device == "cpu" and "cpu" in profile.device_name


def test_round_trip_and_refusals(profiled, tmp_path):
    plan, profile = profiled
    path = profile.save(tmp_path / "profile.json")
    again = Profile.load(path, fingerprint=plan.capture().fingerprint(), device="cpu")
    assert again.seconds == profile.seconds
    assert again.graph.fingerprint() == plan.capture().fingerprint()
    with pytest.raises(UserError, match="profile is for graph"):
        Profile.load(path, fingerprint="0" * 16)
    data = json.loads(path.read_text())
    data["device"] = "cuda:0"
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match="made on cuda:0"):
        Profile.load(path, device="cpu")
    path.write_text('{"schema": 1, "fingerprint": 3}')
    with pytest.raises(UserError, match="not a valid profile"):
        Profile.load(path)
