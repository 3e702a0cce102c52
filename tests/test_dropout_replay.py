"""A split dropout (explorer.rewrite.compact_dropout) against `native_dropout` itself, on each
device: the same output and mask, bit for bit, from the same generator state, the generator
left where native_dropout leaves it, and a replayed mask that leaves it untouched.

The CUDA cases are marked `gpu` (skipped without a CUDA device); the CPU cases run everywhere.
The graphs are traced with fake tensors, as AOTAutograd traces the joint graph the pass reads.
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from explorer.fxgraph import describe
from explorer.rewrite import compact_dropout, fuse_kept_dropouts
from explorer.rngreplay import CUDA_STATE_BYTES, STATE_BYTES

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SHAPES = [(8, 4, 33, 33), (1001,), (64, 96)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
PROBABILITIES = (0.1, 0.15, 0.25, 0.45, 0.5, 0.9, 1 / 3)  # 0.15, 0.45: 1/(1-p) rounds apart
MASK_OPS = {
    "cpu": torch.ops.remat_explorer.replayed_bernoulli_mask.default,
    "cuda": torch.ops.remat_explorer.replayed_cuda_dropout_mask.default,
}


def _seed(device: str, seed: int) -> None:
    (torch.cuda.manual_seed if device == "cuda" else torch.manual_seed)(seed)


def _state(device: str) -> torch.Tensor:
    return torch.cuda.get_rng_state() if device == "cuda" else torch.get_rng_state()


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes: bitwise comparison (-0.0 is not 0.0, a NaN equals its own bits)."""
    return t.contiguous().view(torch.uint8)


def _as_native_dropout(graph: torch.fx.GraphModule, x: torch.Tensor, p: float) -> tuple:
    """Assert that `graph` gives native_dropout's output and mask bit for bit from the same
    generator state, and leaves the generator where native_dropout leaves it. Returns the
    state before the draw and native_dropout's (output, mask)."""
    device = x.device.type
    _seed(device, 7)
    before = _state(device)
    expected = torch.ops.aten.native_dropout.default(x, p, True)
    after = _state(device)
    _seed(device, 7)
    got = graph(x)
    assert torch.equal(_state(device), after), f"p={p}: the generator moved otherwise"
    assert torch.equal(got[1], expected[1]), f"p={p}: another mask"
    assert torch.equal(_bits(got[0]), _bits(expected[0])), f"p={p}: another output"
    return before, expected


def _split_dropout(x: torch.Tensor, p: float) -> torch.fx.GraphModule:
    def dropout(t: torch.Tensor):
        return torch.ops.aten.native_dropout.default(t, p, True)

    traced = make_fx(dropout, tracing_mode="fake")(x)
    assert compact_dropout(traced) == 1
    return traced


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_split_dropout_gives_native_dropouts_output_and_mask_bitwise(device, shape, dtype):
    for p in PROBABILITIES:
        x = torch.randn(shape, dtype=dtype, device=device)
        x.view(-1)[:3] = torch.tensor([-0.0, float("nan"), float("inf")], dtype=dtype)
        split = _split_dropout(x, p)
        before, expected = _as_native_dropout(split, x, p)
        # a recomputation draws the same mask from the saved state and moves no generator
        replay = MASK_OPS[device]
        node = next(n for n in split.graph.nodes if "mask" in str(n.target))
        _seed(device, 11)
        now = _state(device)
        fresh = x.clone()  # on CUDA the draw runs on x as a recomputation has it: fresh memory
        args = [fresh if isinstance(a, torch.fx.Node) else a for a in node.args[1:]]
        again = replay(before, *args)
        assert torch.equal(again, expected[1]), f"p={p}: the replay drew another mask"
        assert torch.equal(_state(device), now), f"p={p}: the replay moved the generator"


@pytest.mark.parametrize("device", DEVICES)
def test_the_saved_state_is_counted_on_the_steps_device_only(device):
    """The generator's state is a CPU tensor on both devices: a CPU step counts its bytes, a
    CUDA step none (the CUDA meter does not see it), and it is a random operator (pinned)."""
    x = torch.randn(4, 8, device=device)
    split = _split_dropout(x, 0.1)
    state = next(n for n in split.graph.nodes if n.name.startswith("rng_state"))
    assert state.meta["val"].numel() == (CUDA_STATE_BYTES if device == "cuda" else STATE_BYTES)
    assert state.meta["val"].device.type == "cpu"
    real = torch.ops.remat_explorer.rng_state.default(x)
    assert real.numel() == state.meta["val"].numel() and real.device.type == "cpu"
    graph = describe(split.graph, num_fwd_outputs=2)
    ir_state = graph.node(state.name)
    assert ir_state.random  # pinned wherever it runs in the forward
    assert ir_state.outputs[0].nbytes == (0 if device == "cuda" else STATE_BYTES)


def _traced_cuda(x_fn, p: float = 0.1) -> torch.fx.GraphModule:
    """A graph of one dropout of fake CUDA tensors (no CUDA device needed to trace it)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        x = x_fn()
    return make_fx(lambda t: torch.ops.aten.native_dropout.default(t, p, True))(x)


@pytest.mark.parametrize(
    ("make", "p", "split"),
    [
        (lambda: torch.empty(4, 8, device="cuda"), 0.15, True),
        (lambda: torch.empty(4, 8, device="cuda", dtype=torch.bfloat16), 0.45, True),
        (lambda: torch.empty(40, device="cuda")[1:33], 0.1, False),  # starts off its storage
        (lambda: torch.empty(8, 4, device="cuda").t(), 0.1, False),  # not contiguous
        (lambda: torch.empty(4, 8, device="cuda"), 0.0, False),  # p = 0 takes another kernel
    ],
    ids=["float32", "bfloat16", "offset", "transposed", "p0"],
)
def test_which_cuda_dropouts_are_split(make, p, split):
    """Traced on fake CUDA tensors, so it runs without a GPU: only a dropout whose mask the
    kernel draws again from x itself (contiguous, at the start of its storage) is split."""
    traced = _traced_cuda(make, p)
    assert compact_dropout(traced) == int(split)
    targets = {str(n.target) for n in traced.graph.nodes}
    assert ("remat_explorer.cuda_dropout_mask.default" in targets) == split
    if split:
        mask = next(n for n in traced.graph.nodes if "cuda_dropout_mask" in str(n.target))
        placeholder = next(iter(traced.graph.find_nodes(op="placeholder")))
        x = placeholder.meta["val"]
        assert mask.args[1:] == (placeholder, p)  # the kernel runs again on x, laid out alike
        muls = traced.graph.find_nodes(op="call_function", target=torch.ops.aten.mul.Tensor)
        scaled = [n.args[1] for n in muls if isinstance(n.args[1], float)]
        keep = torch.tensor(1 - p, dtype=torch.float32)
        assert scaled == [float(torch.tensor(1.0, dtype=torch.float32) / keep)]
        # the generator's state is a CPU tensor: none of the CUDA step's memory
        graph = describe(traced.graph, num_fwd_outputs=2)
        state = graph.node(mask.args[0].name)
        assert state.random and state.outputs[0].nbytes == 0
        assert graph.node(mask.name).outputs[0].nbytes == x.numel()


@pytest.mark.parametrize("device", DEVICES)
def test_a_dropout_drawn_once_is_native_dropout_again_bitwise(device):
    """`fuse_kept_dropouts` undoes the split where the mask is drawn once: one
    `native_dropout` with the dropout's own p (1 - (1 - 0.1) is not 0.1), the same output and
    mask bit for bit and the generator left where native_dropout leaves it; a split whose
    snapshot the backward needs (an output of the forward graph) is left as it is."""
    for p in PROBABILITIES:
        x = torch.randn(64, 96, device=device)
        fused = _split_dropout(x, p)
        assert fuse_kept_dropouts(fused) == 1
        calls = [n for n in fused.graph.nodes if n.op == "call_function"]
        (dropout,) = [n for n in calls if n.target is torch.ops.aten.native_dropout.default]
        assert dropout.args[1:] == (p, True)
        assert not [n for n in calls if str(n.target).startswith("remat_explorer")]
        _as_native_dropout(fused, x, p)
    kept = _split_dropout(x, 0.1)
    state = next(n for n in kept.graph.nodes if n.name.startswith("rng_state"))
    (output,) = kept.graph.find_nodes(op="output")
    output.args = ((*output.args[0], state),)  # the backward draws the mask again
    assert fuse_kept_dropouts(kept) == 0


def test_a_fake_cuda_dropout_drawn_once_is_native_dropout_again():
    """The CUDA split (its mask op takes x and p) fuses back too, traced on fake CUDA tensors
    so that it runs without a GPU."""
    traced = _traced_cuda(lambda: torch.empty(4, 8, device="cuda"), 0.15)
    assert compact_dropout(traced) == 1
    assert fuse_kept_dropouts(traced) == 1
    calls = [n for n in traced.graph.nodes if n.op == "call_function"]
    (dropout,) = [n for n in calls if n.target is torch.ops.aten.native_dropout.default]
    placeholder = next(iter(traced.graph.find_nodes(op="placeholder")))
    assert dropout.args == (placeholder, 0.15, True)
    assert not [n for n in calls if str(n.target).startswith("remat_explorer")]
