"""Dropout masks a schedule can recompute: drawn again from a saved generator state.

A random draw run a second time draws other numbers, so a mask that is drawn where dropout runs
must be kept from the forward to its backward: 1 byte per element, a (B, heads, T, T) tensor
per attention layer. What determines the mask is far smaller: the CPU generator's state
(mt19937, `STATE_BYTES` bytes). Two operators let the plan keep that instead:

- `rng_state(like)`: a copy of the CPU generator's state, taken right before the draw. It is a
  random operator (tagged `nondeterministic_seeded`), so it is pinned: run once, never again.
- `bernoulli_mask(state, shape, p)`: the boolean mask that `native_dropout` draws, drawn from
  the generator set to `state`. In the forward `state` is the generator's current state, so it
  draws the same mask and leaves the generator where `native_dropout` leaves it.

A recomputation of the mask runs `replayed_bernoulli_mask` instead (`replay_in_place`): the
same draw from the saved state, after which the generator is put back where it was, so the
mask comes out bitwise the same and no later draw changes. (PyTorch's own `run_with_rng_state`
does the same, but as a higher-order operator it fails under any TorchDispatchMode that does
not handle it, such as a memory tracker's; custom operators pass through every mode.)
"""

from __future__ import annotations

import torch
from torch import fx

STATE_BYTES = torch.get_rng_state().numel()  # uint8 elements of the CPU generator's state


@torch.library.custom_op(
    "remat_explorer::rng_state", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,)
)
def rng_state(like: torch.Tensor) -> torch.Tensor:
    """The CPU generator's state now (`like`, the tensor about to be dropped out, places the
    snapshot right before its draw in the graph)."""
    return torch.get_rng_state()


@rng_state.register_fake
def _rng_state_fake(like: torch.Tensor) -> torch.Tensor:
    return torch.empty(STATE_BYTES, dtype=torch.uint8)


@torch.library.custom_op("remat_explorer::bernoulli_mask", mutates_args=())
def bernoulli_mask(state: torch.Tensor, shape: list[int], p: float) -> torch.Tensor:
    """A contiguous bool mask, True with probability `p`, drawn from the CPU generator set to
    `state` (the draw `native_dropout` makes for its mask)."""
    torch.set_rng_state(state)
    return torch.empty(shape, dtype=torch.bool).bernoulli_(p)


@torch.library.custom_op("remat_explorer::replayed_bernoulli_mask", mutates_args=())
def replayed_bernoulli_mask(state: torch.Tensor, shape: list[int], p: float) -> torch.Tensor:
    """`bernoulli_mask`, then the CPU generator is put back as it was before the call."""
    current = torch.get_rng_state()
    try:
        return bernoulli_mask(state, shape, p)
    finally:
        torch.set_rng_state(current)


@bernoulli_mask.register_fake
@replayed_bernoulli_mask.register_fake
def _mask_fake(state: torch.Tensor, shape: list[int], p: float) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.bool)


BERNOULLI_MASK = torch.ops.remat_explorer.bernoulli_mask.default
REPLAYED_BERNOULLI_MASK = torch.ops.remat_explorer.replayed_bernoulli_mask.default
RNG_STATE = torch.ops.remat_explorer.rng_state.default


def replay_in_place(node: fx.Node) -> None:
    """Turn a copied `bernoulli_mask` node (a recomputation) into its replay, which leaves the
    generator as it found it. Other nodes are left alone."""
    if node.target is BERNOULLI_MASK:
        node.target = REPLAYED_BERNOULLI_MASK
