"""The unmodified model's own peak, measured when profiling (explorer.unmodified): a front says
where its points peak above it, and export warns, so that no plan larger than no plan at all
is taken for a saving. With gradients held (gradient accumulation) the compiled backward
hands every new gradient back at its end, so whole fronts can lie above it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from helpers import planner
from test_cli import run
from torch import nn

import explorer
from explorer.capture import capture
from explorer.cli import main
from explorer.errors import UserError
from explorer.models import build
from explorer.profile import StepProfile

HELD = ["--model", "sample:tiny_mlp", "--batch-size", "4", "--gradients-held"]


@pytest.fixture(scope="module")
def held(tmp_path_factory):
    """sample:tiny_mlp at batch 4, planned for gradient accumulation: every point of its
    front peaks above the model run as it is (316,856 bytes against 282,512)."""
    built = build("sample:tiny_mlp", 4, None)
    plan = explorer.Planner(built.model, built.example_inputs, gradients_held=True)
    return plan, plan.sweep(points=3)


def test_the_measured_peak_is_verifys_unmodified_peak(held):
    # catches: a line measured on another step than verify's (without the held gradients,
    # another seed or loss), against which the front's points would be misjudged
    plan, front = held
    report = front.points[0].schedule.verify()
    assert report.ok, report.format_table()
    measured = report.measurements["peak memory, unmodified model (bytes)"]
    assert front.unmodified_peak_bytes == plan.profile().unmodified_peak_bytes == measured
    assert min(p.predicted_peak_bytes for p in front.points) > measured
    assert "every point peaks above the unmodified model's" in front.unmodified_note()
    assert ".grad as it is made" in front.unmodified_note()


def test_the_note_and_export_name_recomputing_points_above_the_line_and_nothing_else(
    tmp_path, capsys
):
    # catches: a note on every front, or a warning on exporting its no-recompute point (a
    # few bytes above the model's own peak: the compiled step's layout; sample:tiny_cnn b4
    # 32 px, 896 bytes), or none where points that recompute lie above it
    front = planner("sample:tiny_cnn", 4, 32).sweep(points=4)
    assert front.unmodified_peak_bytes is not None and front.unmodified_note() is None
    plain = front.points[-1].schedule
    assert not plain.recomputed and plain.predicted_peak_bytes > front.unmodified_peak_bytes
    assert not front.above_unmodified(plain)
    code, err = run(capsys, "export", "--front", str(front.save(tmp_path / "front.json")),
                    "--budget", "1.0", "--out", str(tmp_path / "plain.py"))  # fmt: skip
    assert code == 0 and err == [], err
    recomputing = sorted((p for p in front.points if p.recomputed), key=_peak)
    between = replace(front, unmodified_peak_bytes=_peak(recomputing[-1]) - 1)
    assert between.unmodified_note().startswith("points above")
    assert ".grad" not in between.unmodified_note()  # not a step that holds gradients
    assert between.above_unmodified(recomputing[-1].schedule)
    assert not between.above_unmodified(recomputing[0].schedule)
    under = replace(front, unmodified_peak_bytes=_peak(recomputing[0]) - 1)
    assert under.unmodified_note().startswith("every point peaks above")
    assert under.above_unmodified(plain)
    assert replace(front, unmodified_peak_bytes=None).unmodified_note() is None


def _peak(point: explorer.FrontPoint) -> int:
    return point.predicted_peak_bytes


def test_a_profile_measured_without_held_gradients_gives_no_line(tmp_path):
    # catches: the peak of a step from no gradients taken as the line of one that holds them
    alone = planner("sample:tiny_mlp", 4, None)
    path = alone.profile().save(tmp_path / "profile.json")
    fingerprint = "+".join(g.fingerprint() for g in alone.capture())
    plan_held = explorer.Planner(alone.model, alone.example_inputs, gradients_held=True)
    plan_held.use_profile(StepProfile.load(path, fingerprint=fingerprint))
    assert plan_held.sweep(points=2).unmodified_peak_bytes is None


def test_profile_and_front_files_keep_it_and_refuse_a_damaged_one(held, tmp_path):
    plan, front = held
    path = plan.profile().save(tmp_path / "profile.json")
    assert StepProfile.load(path).unmodified_peak_bytes == front.unmodified_peak_bytes
    data = json.loads(path.read_text())
    del data["unmodified_peak_bytes"]  # a profile.json from before: no line, no note
    path.write_text(json.dumps(data))
    assert StepProfile.load(path).unmodified_peak_bytes is None
    data["unmodified_peak_bytes"] = -5
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match="not a valid profile"):
        StepProfile.load(path)
    again = explorer.Front.load(front.save(tmp_path / "front.json"))
    assert again.unmodified_peak_bytes == front.unmodified_peak_bytes


def test_sweep_says_it_and_export_warns(capsys, tmp_path, quick_search):
    # catches: a command-line user of gradient accumulation given a front that saves nothing
    # against the model as it is, and a file exported from it, without a word
    assert main(["sweep", *HELD, "--points", "2", "--out", str(tmp_path)]) == 0
    assert "every point peaks above the unmodified model's" in capsys.readouterr().out
    front = tmp_path / "front.json"
    code, err = run(capsys, "export", "--front", str(front), "--budget", "1.0",
                    "--out", str(tmp_path / "held.py"))  # fmt: skip
    assert code == 0
    assert len(err) == 1 and "peaks above the unmodified model's" in err[0], err
    assert ".grad as it is made" in err[0]  # why


class _AuxiliaryPasses(nn.Module):
    """Blocks in a loop Dynamo splits at every pass, each with an auxiliary head: the second
    and third passes run one compiled graph, so one schedule."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_AuxiliaryBlock() for _ in range(3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        auxiliary = []
        for block in self.blocks:
            torch._dynamo.graph_break()
            x, head = block(x)
            auxiliary.append(head)
        return x, auxiliary


class _AuxiliaryBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 32)
        self.aux = nn.Linear(32, 256)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.tanh(self.linear(x))
        return x, self.aux(x)


def test_gradients_of_unread_outputs_a_plan_must_still_make_are_said(tmp_path):
    # A loss that reads the last pass's auxiliary head leaves the second pass's unread, but
    # that pass shares its graph, so its schedule, with the third: its backward still makes
    # the auxiliary head's gradients, of zeros, where eager PyTorch makes none, and every
    # point peaks above the model run as it is (the first pass's are left out:
    # explorer.unread). catches: that front without the reason, bytes counted that are left
    # out (the first pass's) or that a read output's gradient reaches too, and the count
    # lost in front.json
    torch.manual_seed(0)
    model, x = _AuxiliaryPasses(), torch.randn(8, 32)
    plan = explorer.Planner(model, (x,), loss=lambda out: out[0].sum() + out[1][-1].square().mean())
    assert [g.unread_tangents for g in plan.capture()] == [["tangents_2"], [], []]
    front = plan.sweep(points=2)
    auxiliary = sum(p.numel() * p.element_size() for p in model.blocks[1].aux.parameters())
    assert front.unread_gradient_bytes == auxiliary
    assert min(p.predicted_peak_bytes for p in front.points) > front.unmodified_peak_bytes
    note = front.unmodified_note()
    assert note.startswith("every point peaks above") and "loss leaves outputs unread" in note
    assert explorer.Front.load(front.save(tmp_path / "front.json")).unread_gradient_bytes == (
        auxiliary
    )
    every_output = capture(model, (x,))  # a gradient for each output: none unread
    assert [graph.unread_gradient_bytes for graph in every_output] == [0] * len(every_output)
