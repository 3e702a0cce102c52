"""Capture: an operator-level graph of the whole step, for any module."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from explorer.capture import capture
from explorer.errors import UserError
from explorer.graph import BACKWARD, EFFECT, FORWARD, Graph
from explorer.models import build


def test_resnet_graph_has_forward_backward_and_buffer_updates():
    built = build("resnet18", 2, 32)
    before = [b.clone() for b in built.model.buffers()]
    graph = capture(built.model, built.example_inputs).graph
    phases = {n.phase for n in graph.nodes}
    assert {FORWARD, BACKWARD, EFFECT} <= phases
    targets = {n.target for n in graph.nodes}
    assert "aten.convolution_backward.default" in targets
    assert "aten._native_batch_norm_legit_functional.default" in targets
    params = graph.placeholders("param")
    assert len(params) == len(list(built.model.parameters()))
    assert all(g is not None for g in graph.input_grads[: len(params)])
    # tracing runs on fake tensors: the model's BatchNorm statistics are untouched
    assert all(torch.equal(a, b) for a, b in zip(before, built.model.buffers(), strict=True))


def test_fingerprint_is_stable_and_survives_json():
    built = build("sample:tiny_cnn", 2, None)
    first = capture(built.model, built.example_inputs).graph
    second = capture(built.model, built.example_inputs).graph
    assert first.fingerprint() == second.fingerprint()
    again = Graph.from_dict(json.loads(json.dumps(first.to_dict())))
    assert again.fingerprint() == first.fingerprint()
    other = build("sample:tiny_cnn", 4, None)
    assert capture(other.model, other.example_inputs).graph.fingerprint() != first.fingerprint()


def test_dropout_is_marked_random():
    built = build("sample:gpt", 2, 16)
    graph = capture(built.model, built.example_inputs).graph
    assert any(n.random and n.phase == FORWARD for n in graph.nodes)


def test_views_cost_nothing_and_split_returns_views():
    built = build("sample:gpt", 2, 16)
    graph = capture(built.model, built.example_inputs).graph
    split = next(n for n in graph.nodes if n.target == "aten.split.Tensor")
    assert all(m.alias_of == 0 and m.nbytes == 0 for m in split.outputs)
    view = next(n for n in graph.nodes if n.target == "aten.view.default")
    assert view.outputs[0].nbytes == 0


class _DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.gate = _Gate()

    def forward(self, x):
        return self.gate(self.inner(x))


class _Gate(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: cannot be traced
            return x * 2
        return x


def test_untraceable_construct_names_the_module():
    model = _DataDependent().train()
    with pytest.raises(UserError, match="module 'gate'"):
        capture(model, (torch.randn(2, 4),))
