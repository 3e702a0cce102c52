"""Small shared helpers for the engine tests."""

from __future__ import annotations

import torch

import explorer
from explorer.models import build


def planner(spec: str, batch: int, size: int | None) -> explorer.Planner:
    built = build(spec, batch, size)
    return explorer.Planner(built.model, built.example_inputs, spec=built.spec)


def train_step(model: torch.nn.Module, inputs: tuple, seed: int) -> None:
    """One step from fixed random tangents, the way verify runs it."""
    torch.manual_seed(seed)
    outs = [o for o in torch.utils._pytree.tree_flatten(model(*inputs))[0] if o.requires_grad]
    gen = torch.Generator().manual_seed(seed + 1)
    torch.autograd.backward(outs, [torch.randn(o.shape, generator=gen) for o in outs])
