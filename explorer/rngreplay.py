"""Dropout masks a schedule can recompute: drawn again from a saved generator state.

A random draw run a second time draws other numbers, so a mask that is drawn where dropout runs
must be kept from the forward to its backward: 1 byte per element, a (B, heads, T, T) tensor
per attention layer. What determines the mask is far smaller: the generator's state (the CPU's
mt19937, `STATE_BYTES` bytes; a CUDA device's Philox seed and offset, `CUDA_STATE_BYTES`).
Two operators let the plan keep that instead:

- `rng_state(like)`: a copy of the generator's state on `like`'s device, taken right before the
  draw. It is a random operator (tagged `nondeterministic_seeded`), so it is pinned: run once,
  never again. It is a CPU tensor on either device.
- the mask drawn from the generator set to that state, the draw `native_dropout` makes, which
  leaves the generator where `native_dropout` leaves it:
  - on the CPU, `bernoulli_mask(state, shape, p)`: `native_dropout` draws its mask with
    `bernoulli_`, so the mask is drawn alone;
  - on CUDA, `cuda_dropout_mask(state, x, p)`: `native_dropout`'s fused kernel draws the
    mask while it writes the output, and which random number lands on which element depends
    on the kernel's launch (the tensor's size, dtype and alignment), never on x's values. The
    only way to draw the same mask is to run that kernel again on a tensor laid out as x:
    x itself (kept, or recomputed into fresh memory laid out the same). Its float output is
    freed on return, and the profile counts it as the operator's workspace: 4 bytes an
    element in float32, where drawing on a fresh scratch tensor took 8. The price: a mask
    drawn again needs x too, which a softmax's backward reads anyway but a residual
    dropout's does not.

A recomputation of the mask runs its `replayed_*` twin instead (`replay_in_place`): the same
draw from the saved state, after which the generator is put back where it was, so the mask
comes out bitwise the same and no later draw changes. (PyTorch's own `run_with_rng_state`
does the same, but as a higher-order operator it fails under any TorchDispatchMode that does
not handle it, such as a memory tracker's; custom operators pass through every mode.)
"""

from __future__ import annotations

import torch
from torch import fx

from explorer.metadevice import device_kind

STATE_BYTES = torch.get_rng_state().numel()  # uint8 elements of the CPU generator's state
CUDA_STATE_BYTES = 16  # a CUDA generator's state: its Philox seed and offset, 8 bytes each


@torch.library.custom_op(
    "remat_explorer::rng_state", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,)
)
def rng_state(like: torch.Tensor) -> torch.Tensor:
    """The state of `like`'s device's generator now (`like`, the tensor about to be dropped
    out, places the snapshot right before its draw in the graph)."""
    if like.device.type == "cuda":
        return torch.cuda.get_rng_state(like.device)
    return torch.get_rng_state()


@rng_state.register_fake
def _rng_state_fake(like: torch.Tensor) -> torch.Tensor:
    # a CUDA generator's state is a host tensor (outside the memory the plan counts); the
    # CPU's is where `like` is (the meta device, where a meta tensor stands for the CPU)
    if device_kind(like) == "cuda":
        return torch.empty(CUDA_STATE_BYTES, dtype=torch.uint8, device="cpu")
    return torch.empty(STATE_BYTES, dtype=torch.uint8, device=like.device)


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
    return torch.empty(shape, dtype=torch.bool, device=state.device)  # meta stays meta


@torch.library.custom_op("remat_explorer::cuda_dropout_mask", mutates_args=())
def cuda_dropout_mask(state: torch.Tensor, x: torch.Tensor, p: float) -> torch.Tensor:
    """The bool mask `native_dropout(x, p)` draws for `x` (contiguous, at the start of its
    storage) with x's CUDA generator set to `state`."""
    torch.cuda.set_rng_state(state, x.device)
    return torch.native_dropout(x, p, True)[1]


@torch.library.custom_op("remat_explorer::replayed_cuda_dropout_mask", mutates_args=())
def replayed_cuda_dropout_mask(state: torch.Tensor, x: torch.Tensor, p: float) -> torch.Tensor:
    """`cuda_dropout_mask`, then the device's generator is put back as it was before the call."""
    current = torch.cuda.get_rng_state(x.device)
    try:
        return cuda_dropout_mask(state, x, p)
    finally:
        torch.cuda.set_rng_state(current, x.device)


@cuda_dropout_mask.register_fake
@replayed_cuda_dropout_mask.register_fake
def _cuda_mask_fake(state: torch.Tensor, x: torch.Tensor, p: float) -> torch.Tensor:
    return torch.empty(x.shape, dtype=torch.bool, device=x.device)


BERNOULLI_MASK = torch.ops.remat_explorer.bernoulli_mask.default
CUDA_DROPOUT_MASK = torch.ops.remat_explorer.cuda_dropout_mask.default
RNG_STATE = torch.ops.remat_explorer.rng_state.default
REPLAYS = {  # a mask operator -> its replaying twin
    BERNOULLI_MASK: torch.ops.remat_explorer.replayed_bernoulli_mask.default,
    CUDA_DROPOUT_MASK: torch.ops.remat_explorer.replayed_cuda_dropout_mask.default,
}


def replay_in_place(node: fx.Node) -> None:
    """Turn a copied mask node (a recomputation) into its replay, which leaves the generator as
    it found it. Other nodes are left alone."""
    replay = REPLAYS.get(node.target)
    if replay is not None:
        node.target = replay
