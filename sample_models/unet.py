"""A small classic UNet for segmentation-shaped memory profiles.

A UNet keeps every encoder activation alive until the matching decoder level uses it (the
skip connections), so its memory peak sits in the middle of the step: a good test of
where rematerialization pays off. Input (B, in_channels, S, S), output (B, n_classes, S, S).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DoubleConv(nn.Sequential):
    """Two (conv 3x3, BatchNorm, ReLU) layers: the UNet building block."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(
            nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(inplace=True),
        )


class Down(nn.Sequential):
    """Halve the resolution, then widen: one encoder level."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(nn.MaxPool2d(2), DoubleConv(in_channels, out_channels))


class Up(nn.Module):
    """Double the resolution, join the encoder's skip tensor, then narrow: one decoder level."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(in_channels, out_channels, 2, stride=2)
        self.conv = DoubleConv(2 * out_channels, out_channels)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        x = self.up(x)
        # Odd sizes lose a row or column when pooled; pad back so any side >= 2**depth works.
        dh = skip.shape[-2] - x.shape[-2]
        dw = skip.shape[-1] - x.shape[-1]
        if dh or dw:
            x = F.pad(x, [dw // 2, dw - dw // 2, dh // 2, dh - dh // 2])
        return self.conv(torch.cat([skip, x], dim=1))


class UNet(nn.Module):
    """Encoder of `depth` down levels, a bottleneck, and a mirrored decoder with skips."""

    def __init__(
        self, in_channels: int = 3, n_classes: int = 2, base_width: int = 16, depth: int = 4
    ) -> None:
        super().__init__()
        widths = [base_width * 2**i for i in range(depth + 1)]
        self.stem = DoubleConv(in_channels, widths[0])
        self.downs = nn.ModuleList(Down(widths[i], widths[i + 1]) for i in range(depth))
        self.ups = nn.ModuleList(Up(widths[i + 1], widths[i]) for i in reversed(range(depth)))
        self.head = nn.Conv2d(widths[0], n_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = [self.stem(x)]
        for down in self.downs:
            skips.append(down(skips[-1]))
        x = skips.pop()
        for up in self.ups:
            x = up(x, skips.pop())
        return self.head(x)


def unet(in_channels: int = 3, n_classes: int = 2, base_width: int = 16, depth: int = 4) -> UNet:
    """Factory for the sample registry: the defaults give ~1.9 M parameters."""
    return UNet(in_channels, n_classes, base_width, depth)
