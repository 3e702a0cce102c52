"""Losses known by name, so that a plan made with one can be made and verified from the command
line and from a file that records only its name (a Python function cannot be saved in one).

A named loss makes its own targets: fixed random classes drawn from its own seed for the shape
it meets, the same at every call, so that the capture, the profile and verify's two steps all
backpropagate the same loss. What it holds is what a loop computing that loss on real labels
holds (the targets are class indices either way).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from explorer.errors import UserError
from explorer.modelstate import output_tensors

TARGET_SEED = 0
PYTHON = "python:"  # the prefix of a recorded loss that is a caller's own function


def cross_entropy(result: Any) -> torch.Tensor:
    """Cross-entropy of the first floating-point output that is not a number, classes on
    its last dimension (a classifier's (batch, classes) or a language model's (batch, tokens,
    vocabulary)); a loss the model returns before them (a transformers model given labels)
    is passed over."""
    logits = next(
        (
            t
            for t in output_tensors(result)
            if t.is_floating_point() and t.requires_grad and t.dim() > 0
        ),
        None,
    )
    if logits is None:
        raise UserError("the cross_entropy loss needs an output of class scores, with a gradient")
    flat = logits.reshape(-1, logits.shape[-1])
    return F.cross_entropy(flat, _targets(flat))


def _targets(flat: torch.Tensor) -> torch.Tensor:
    """One fixed class per row of `flat`; on the meta device (a planned step) their shape
    is all there is, and no generator exists there."""
    if flat.device.type == "meta":
        return torch.empty(flat.shape[:1], dtype=torch.long, device="meta")
    draw = torch.Generator(device=flat.device).manual_seed(TARGET_SEED)
    return torch.randint(flat.shape[-1], flat.shape[:1], generator=draw, device=flat.device)


NAMED: dict[str, Callable[[Any], torch.Tensor]] = {"cross_entropy": cross_entropy}


def named_loss(name: str) -> Callable[[Any], torch.Tensor]:
    """The loss called `name`; UserError naming the known ones otherwise."""
    if name not in NAMED:
        raise UserError(f"unknown loss {name!r}: known losses are {', '.join(sorted(NAMED))}")
    return NAMED[name]


def loss_name(loss: Callable | None) -> str | None:
    """What a file records of a loss: a named loss's name, else the caller's function's
    qualified name after `python:` (enough to say which, not to rebuild it)."""
    if loss is None:
        return None
    for name, known in NAMED.items():
        if loss is known:
            return name
    return PYTHON + (getattr(loss, "__qualname__", None) or type(loss).__name__)
