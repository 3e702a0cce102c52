"""explorer.models and sample_models: every SPEC form builds, runs a step and fails clearly."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from explorer.errors import UserError
from explorer.models import Built, ModelSpec, build, list_specs
from sample_models import SAMPLE_MODELS

# Small enough that each sample model's step takes well under a second on two CPU cores.
TINY_SIZES = {"unet": 32, "gpt": 16, "tiny_mlp": None, "tiny_cnn": 16, "tiny_dropout": None}


def _step(built: Built) -> None:
    """Forward and backward once; the gradients that arrive are finite."""
    out = built.model(*built.example_inputs)
    out = out[0] if isinstance(out, tuple) else out
    out.float().square().mean().backward()
    grads = [p.grad for p in built.model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_tiny_sizes_cover_the_registry() -> None:
    assert set(TINY_SIZES) == set(SAMPLE_MODELS)


@pytest.mark.parametrize("name", sorted(TINY_SIZES))
def test_sample_model_builds_and_steps(name: str) -> None:
    built = build(f"sample:{name}", batch_size=2, input_size=TINY_SIZES[name])
    entry = SAMPLE_MODELS[name]
    assert built.kind == entry.kind
    assert built.model.training
    assert built.spec == ModelSpec(
        f"sample:{name}", 2, TINY_SIZES[name] or entry.default_input_size
    )
    _step(built)


def test_sample_output_shapes() -> None:
    unet = build("sample:unet", 2, 40)  # not a multiple of 16: the decoder pads
    assert unet.model(*unet.example_inputs).shape == (2, 2, 40, 40)
    gpt = build("sample:gpt", 3, 12)
    (tokens,) = gpt.example_inputs
    assert tokens.dtype == torch.int64 and tokens.shape == (3, 12)
    assert gpt.model(tokens).shape == (3, 12, 512)
    assert gpt.model.head.weight is gpt.model.tok_emb.weight


def test_torchvision_resnet18() -> None:
    built = build("resnet18", 2, 64)
    (x,) = built.example_inputs
    assert x.shape == (2, 3, 64, 64) and x.dtype == torch.float32
    assert built.kind == "image" and built.spec == ModelSpec("resnet18", 2, 64)
    _step(built)


def test_build_leaves_batchnorm_buffers_untouched() -> None:
    """The size probe runs a forward in train mode; it must not count as a training step."""
    built = build("sample:tiny_cnn", 2, 16)
    bn = built.model[0][1]
    assert int(bn.num_batches_tracked) == 0
    assert torch.equal(bn.running_mean, torch.zeros_like(bn.running_mean))


def test_list_specs() -> None:
    specs = list_specs()
    assert "resnet50" in specs and "inception_v3" in specs
    assert {f"sample:{name}" for name in SAMPLE_MODELS} <= set(specs)
    assert not any(name.startswith(("fcn_", "maskrcnn", "raft")) for name in specs)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("resnt50", "did you mean resnet50?"),
        ("sample:unte", "did you mean sample:unet?"),
        ("no_such_model_anywhere", "remat-explorer models"),
        ("not a spec:x", "package.module:factory"),
        ("no_such_module_xyz:make", "cannot import"),
    ],
)
def test_unknown_spec_is_a_user_error(spec: str, expected: str) -> None:
    with pytest.raises(UserError, match=expected) as info:
        build(spec, 2)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("spec", "batch", "size", "expected"),
    [
        ("sample:tiny_mlp", 0, None, "batch size must be a positive integer"),
        ("sample:tiny_mlp", 2, -3, "input size must be a positive integer"),
        ("sample:gpt", 2, 300, "takes --input-size 1..256"),
        ("sample:tiny_mlp", 2, 32, "takes --input-size 64..64"),
        ("inception_v3", 2, 64, "needs --input-size 299 or more"),
        ("vit_b_16", 2, 40, "cannot be built for input size 40"),
        ("sample:tiny_cnn", 1, 2, "batch size 1 is too small"),
    ],
)
def test_bad_sizes_are_user_errors(spec: str, batch: int, size: int | None, expected: str) -> None:
    with pytest.raises(UserError, match=expected):
        build(spec, batch, size)


def test_a_module_that_fails_on_import_is_a_user_error(tmp_path, monkeypatch) -> None:
    # catches: importing the factory's module with only ImportError caught
    (tmp_path / "remat_test_broken.py").write_text("raise ValueError('half-written module')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match="raised ValueError: half-written module"):
        build("remat_test_broken:anything", 2)


def test_a_batch_larger_than_memory_is_refused_before_allocating() -> None:
    # 10**12 samples of 64 floats: 256 TB. catches: dropping the free-memory check, which
    # leaves either a RuntimeError from the allocator or the out-of-memory killer
    with pytest.raises(UserError, match="batch size 1000000000000 needs .* free on this machine"):
        build("sample:tiny_mlp", 10**12)


def test_bad_device_is_a_user_error() -> None:
    with pytest.raises(UserError, match="device"):
        build("sample:tiny_mlp", 2, device="tpu:banana")


FACTORIES = """
import torch
from torch import nn

def plain():
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(3))

def with_inputs():
    model = nn.Linear(5, 2)
    return model, torch.randn(4, 5)

def needs_args(width):
    return nn.Linear(width, 2)

def not_a_model():
    return 42

def raises():
    raise RuntimeError("boom")

def exits():
    raise SystemExit(0)

class Observed(nn.Module):  # an empty buffer the forward resizes, as QAT's observers do
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3)
        self.register_buffer("low", torch.tensor([]))

    def forward(self, x):
        h = self.conv(x)
        self.low.resize_(2).copy_(h.detach().amin(dim=(0, 2, 3)))
        return h

def observed():
    return Observed()
"""


@pytest.fixture
def factory_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A throwaway importable module of factories; returns its name."""
    (tmp_path / "remat_test_factories.py").write_text(textwrap.dedent(FACTORIES))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "remat_test_factories"


def test_factory_spec_infers_image_input(factory_module: str) -> None:
    built = build(f"{factory_module}:plain", 2, 12)
    (x,) = built.example_inputs
    assert built.kind == "image" and x.shape == (2, 1, 12, 12)  # channels from the first conv
    _step(built)


def test_factory_input_too_small(factory_module: str) -> None:
    with pytest.raises(UserError, match="input size 2 does not work .* try a larger"):
        build(f"{factory_module}:plain", 2, 2)


def test_a_buffer_the_forward_resizes_is_put_back_after_the_size_probe(factory_module: str):
    # catches: the probe copying the buffer's old value into the resized buffer (an internal
    # error, "The size of tensor a (2) must match the size of tensor b (0)")
    built = build(f"{factory_module}:observed", 2, 12)
    assert built.model.low.shape == (0,)


def test_factory_spec_with_own_inputs(factory_module: str) -> None:
    built = build(f"{factory_module}:with_inputs", 4)
    assert built.kind == "custom"
    assert [tuple(x.shape) for x in built.example_inputs] == [(4, 5)]
    _step(built)


@pytest.mark.parametrize("asked", [None, 7])
def test_own_inputs_decide_the_recorded_batch(factory_module: str, asked: int | None) -> None:
    # catches: the spec (what fronts and exports record) naming a batch that was asked for
    # but not traced
    assert build(f"{factory_module}:with_inputs", asked).spec.batch_size == 4


def test_a_made_input_needs_a_batch_size(factory_module: str) -> None:
    for spec in ("sample:tiny_mlp", f"{factory_module}:plain"):
        with pytest.raises(UserError, match="needs a batch size"):
            build(spec, None)


@pytest.mark.parametrize(
    ("factory", "expected"),
    [
        ("needs_args", "needs arguments"),
        ("not_a_model", "returned int"),
        ("missing", "no callable"),
        # catches: calling the factory outside a try (an internal error, exit 3)
        ("raises", "raised RuntimeError: boom"),
        # catches: catching Exception only (SystemExit(0) would end `remat-explorer` with 0)
        ("exits", r"raised SystemExit\(0\)"),
    ],
)
def test_bad_factory_is_a_user_error(factory_module: str, factory: str, expected: str) -> None:
    with pytest.raises(UserError, match=expected):
        build(f"{factory_module}:{factory}", 2)


@pytest.mark.parametrize(
    ("spec", "size"), [("sample:tiny_dropout", None), ("sample:gpt", 16), ("resnet18", 32)]
)
def test_same_seed_same_model_and_inputs(spec: str, size: int | None) -> None:
    first, second, other = (build(spec, 2, size, seed=seed) for seed in (7, 7, 8))
    state, same_state = first.model.state_dict(), second.model.state_dict()
    assert state.keys() == same_state.keys()
    assert all(torch.equal(state[key], same_state[key]) for key in state)
    assert len(first.example_inputs) == len(second.example_inputs) == 1
    assert torch.equal(first.example_inputs[0], second.example_inputs[0])
    assert not torch.equal(first.example_inputs[0], other.example_inputs[0])


def test_a_factory_spec_builds_in_a_process_whose_folder_was_deleted(monkeypatch, tmp_path):
    # catches: os.getcwd()'s FileNotFoundError (looking for the factory's module beside the
    # user) escaping from every factory build of such a process
    def gone() -> str:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(os, "getcwd", gone)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != ""])
    with pytest.raises(UserError, match="cannot import"):
        build("no_such_module_xyz:make", 2)
