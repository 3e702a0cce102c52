"""Tiny models for fast tests: each training step takes milliseconds on a CPU.

Each covers one thing the pipeline must get right: `mlp` a plain chain, `cnn` BatchNorm
buffers and a residual branch, `dropout_mlp` RNG that recomputation must replay exactly.
"""

from __future__ import annotations

import torch
from torch import nn

MLP_FEATURES = 64


def mlp(in_features: int = MLP_FEATURES, hidden: int = 128, n_classes: int = 10) -> nn.Module:
    """Three Linear layers with ReLU between them; input (B, in_features)."""
    return nn.Sequential(
        nn.Linear(in_features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, n_classes),
    )


def dropout_mlp(
    in_features: int = MLP_FEATURES, hidden: int = 128, n_classes: int = 10, p: float = 0.1
) -> nn.Module:
    """Like `mlp` with Dropout after each hidden activation; input (B, in_features)."""
    return nn.Sequential(
        nn.Linear(in_features, hidden),
        nn.ReLU(),
        nn.Dropout(p),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Dropout(p),
        nn.Linear(hidden, n_classes),
    )


def conv_bn_relu(in_channels: int, out_channels: int, stride: int = 1) -> nn.Sequential:
    """The usual conv 3x3 + BatchNorm + ReLU unit."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(),
    )


class ResidualBlock(nn.Module):
    """x + conv-bn(conv-bn-relu(x)), then ReLU: a branch whose input stays live across it."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            conv_bn_relu(channels, channels),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
        )
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(x + self.body(x))


def cnn(in_channels: int = 3, width: int = 16, n_classes: int = 10) -> nn.Module:
    """Two conv units (the second strided), a residual block, global pooling and a Linear."""
    return nn.Sequential(
        conv_bn_relu(in_channels, width),
        conv_bn_relu(width, 2 * width, stride=2),
        ResidualBlock(2 * width),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, n_classes),
    )
