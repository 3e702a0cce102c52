"""What a meta tensor stands for while a step is planned for a device this machine lacks.

A step captured on the meta device (explorer.costmodel) has shapes and dtypes and no data.
Two parts of the capture must still treat it as the device the plan is for: the dropout
rewrite (explorer.rewrite) splits a dropout, and sizes its generator snapshot, as that
device would; and the graph's fingerprint (explorer.fxgraph) writes a meta device constant
as that device, so that the runtime there applies the plan rather than carry it over.
`standing_for` sets it for one capture; nothing outside that capture sees it.

A third part must see a meta tensor as any other: PyTorch's Python dispatcher, which Dynamo
and AOTAutograd trace under, gives a meta tensor another path than a real one for the
operators PyTorch writes as composites of others (cross-entropy's `nll_loss`, `relu6`, `var`,
`where` with a scalar and about a hundred more). Their Python meta kernels run below
autograd, so a graph traced on the meta device lost their backward with no error (measured on
torch 2.14: `F.cross_entropy` under `torch.compile` left its input without a gradient, where
eager meta tensors and real ones have one). `composites_decomposed` takes those kernels out
for the capture, so these operators decompose before autograd as on a real device.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from threading import Lock

import torch
from torch._C import DispatchKey

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


_composites_lock = Lock()
_composites_depth = 0
_taken_out: list[tuple[torch._ops.OpOverload, object]] = []


@contextmanager
def composites_decomposed() -> Iterator[None]:
    """Within this block (in any thread: the first to enter takes the kernels out, the last
    to leave puts them back), a composite operator on meta tensors decomposes before autograd,
    as the dispatcher does for a real tensor, instead of running its Python meta kernel."""
    global _composites_depth
    with _composites_lock:
        if _composites_depth == 0:
            for op in _composites_with_meta_kernels():
                _taken_out.append((op, op.py_kernels.pop(DispatchKey.Meta)))
                op._dispatch_cache.clear()
        _composites_depth += 1
    try:
        yield
    finally:
        with _composites_lock:
            _composites_depth -= 1
            if _composites_depth == 0:
                for op, kernel in _taken_out:
                    op.py_kernels[DispatchKey.Meta] = kernel
                    op._dispatch_cache.clear()
                _taken_out.clear()


def _composites_with_meta_kernels() -> list[torch._ops.OpOverload]:
    """The operators that have a CompositeImplicitAutograd kernel and a Python meta kernel:
    PyTorch gives every decomposition it registers a meta kernel (torch._meta_registrations),
    composites included."""
    import torch._meta_registrations  # noqa: F401  (registers them, once per process)
    from torch._decomp import global_decomposition_table

    found: dict[str, torch._ops.OpOverload] = {}
    for table in global_decomposition_table.values():
        for op in table:
            if (
                isinstance(op, torch._ops.OpOverload)
                and DispatchKey.Meta in op.py_kernels
                and torch._C._dispatch_has_kernel_for_dispatch_key(
                    op.name(), "CompositeImplicitAutograd"
                )
            ):
                found[str(op)] = op
    return list(found.values())
