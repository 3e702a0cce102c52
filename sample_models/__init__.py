"""Models that are not in torchvision, chosen by name as `sample:NAME` model specs.

`SAMPLE_MODELS` is the registry: each entry says how to build the model and what example
input it takes, so `explorer.models.build` needs no per-model code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from sample_models import tiny
from sample_models.gpt import gpt
from sample_models.unet import unet


@dataclass(frozen=True)
class SampleModel:
    """How to build one sample model and the example input it takes.

    kind is "image" (float (B, 3, S, S)), "sequence" (int64 tokens (B, T)) or "vector"
    (float (B, F)); the input size is S, T or F and must lie in [min_input_size,
    max_input_size] (no upper limit when max_input_size is None).
    """

    factory: Callable[[], nn.Module]
    default_input_size: int
    kind: str
    description: str
    min_input_size: int = 1
    max_input_size: int | None = None


SAMPLE_MODELS: dict[str, SampleModel] = {
    "unet": SampleModel(
        unet,
        128,
        "image",
        "UNet, 4 levels, base width 16, 2 classes (segmentation)",
        min_input_size=16,
    ),
    "gpt": SampleModel(
        gpt,
        128,
        "sequence",
        "GPT-style decoder, 4 layers, 4 heads, width 128, vocab 512",
        max_input_size=256,
    ),
    "tiny_mlp": SampleModel(
        tiny.mlp,
        tiny.MLP_FEATURES,
        "vector",
        "3-layer MLP, 64 features in (fast tests)",
        min_input_size=tiny.MLP_FEATURES,
        max_input_size=tiny.MLP_FEATURES,
    ),
    "tiny_cnn": SampleModel(
        tiny.cnn,
        32,
        "image",
        "conv-bn-relu x2, residual block, pool, linear (fast tests)",
        min_input_size=2,
    ),
    "tiny_dropout": SampleModel(
        tiny.dropout_mlp,
        tiny.MLP_FEATURES,
        "vector",
        "3-layer MLP with dropout (fast tests)",
        min_input_size=tiny.MLP_FEATURES,
        max_input_size=tiny.MLP_FEATURES,
    ),
}

__all__ = ["SAMPLE_MODELS", "SampleModel"]
