"""What a meta tensor stands for while a step is planned for a device this machine lacks.

A step captured on the meta device (explorer.costmodel) has shapes and dtypes and no data.
Two parts of the capture must still treat it as the device the plan is for: the dropout
rewrite (explorer.rewrite) splits a dropout, and sizes its generator snapshot, as that
device would; and the graph's fingerprint (explorer.fxgraph) writes a meta device constant
as that device, so that the runtime there applies the plan rather than carry it over.
`standing_for` sets it for one capture; nothing outside that capture sees it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

# None: a meta tensor stands for nothing, and no dropout of it is split
_STANDS_FOR: ContextVar[str | None] = ContextVar("meta_stands_for", default=None)


@contextmanager
def standing_for(kind: str | None) -> Iterator[None]:
    """Within this block a meta tensor stands for device type `kind` ("cuda", "cpu"; None:
    for nothing)."""
    token = _STANDS_FOR.set(kind)
    try:
        yield
    finally:
        _STANDS_FOR.reset(token)


def device_kind(t: torch.Tensor) -> str:
    """The device type `t` is on, or for a meta tensor the one it stands for."""
    kind = t.device.type
    return (_STANDS_FOR.get() or kind) if kind == "meta" else kind


def stood_for(value: object) -> object:
    """`value`, but a meta device as the device it stands for, written as a capture there
    writes it (the first GPU, or the CPU); anything else unchanged."""
    stands = _STANDS_FOR.get()
    if not (isinstance(value, torch.device) and value.type == "meta" and stands):
        return value
    return torch.device(stands, 0) if stands == "cuda" else torch.device(stands)
