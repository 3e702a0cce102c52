"""The small models on which the default solver is measured against the exact one.

Each is named by a model SPEC (explorer.models), so the benchmark, the tests and the command
line build them the same way: two of them are factories here (`bench.small_graphs:NAME`).
"""

from __future__ import annotations

from torch import nn
from torchvision.models.resnet import BasicBlock, ResNet

from sample_models.gpt import GPT


def mini_resnet() -> nn.Module:
    """ResNet with one BasicBlock per stage: four residual blocks, 10 classes."""
    return ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10)


def gpt_2_layers() -> nn.Module:
    """sample:gpt with two layers, two heads, width 64 (sequence length up to 64)."""
    return GPT(vocab_size=128, n_layers=2, n_heads=2, width=64, max_len=64)


# (SPEC, batch size, input size): small enough that the exact MILP proves its answers
SMALL_GRAPHS = [
    ("bench.small_graphs:mini_resnet", 4, 32),
    ("bench.small_graphs:gpt_2_layers", 2, 32),
    ("sample:tiny_cnn", 4, 32),
    ("sample:unet", 2, 32),
]
