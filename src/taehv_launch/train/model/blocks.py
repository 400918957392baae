"""TAEHV's layers and its three block lists (encoder, base decoder, Super decoder), as upstream lays them out.

The position of every layer in these `nn.Sequential`s is its key in a weight file (`decoder.7.conv.weight`
is the first TGrow of the base decoder), so the lists follow public madebyollin/taehv `taehv.py` index for
index: weights load both ways. Layers without parameters (ReLU, Upsample, PixelShuffle, Clamp) still take
their index.
"""

from __future__ import annotations

import torch
import torch.nn as nn

BASE_WIDTHS = (256, 128, 64, 64)  # base decoder widths per stage (the encoder is 64 throughout)
SUPER_WIDTHS = (512, 256, 128, 64)  # the Super decoder's (upstream's taehv1_5_super, taew2_2_super)
DECODER_ARCHS = ("base", "super")


def conv(n_in: int, n_out: int, **kwargs) -> nn.Conv2d:
    return nn.Conv2d(n_in, n_out, 3, padding=1, **kwargs)


class Clamp(nn.Module):
    """Soft clamp of the latents to (-3, 3): tanh keeps gradients alive."""

    def forward(self, x):
        return torch.tanh(x / 3) * 3


class MemBlock(nn.Module):
    """Residual block that also sees the previous frame's input ("memory").

    x, past: (N*T)CHW; past[t] is x[t-1] (zeros for t = 0).
    """

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        # In-place ReLUs act on fresh conv / sum outputs that nothing saves for backward.
        self.conv = nn.Sequential(
            conv(n_in * 2, n_out),
            nn.ReLU(inplace=True),
            conv(n_out, n_out),
            nn.ReLU(inplace=True),
            conv(n_out, n_out),
        )
        self.skip = nn.Conv2d(n_in, n_out, 1, bias=False) if n_in != n_out else nn.Identity()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x, past):
        return self.act(self.conv(torch.cat([x, past], 1)) + self.skip(x))


class SuperMemBlock(nn.Module):
    """The Super decoder's memory block (ConvNeXt-like): a 7x7 depthwise conv over [x, past], a 4x
    inverted bottleneck, and the input added back (no activation after the sum)."""

    def __init__(self, n_f: int):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(n_f * 2, n_f * 2, 7, padding=3, groups=n_f * 2, bias=False),
            nn.Conv2d(n_f * 2, n_f * 4, 1),
            nn.ReLU(inplace=True),
            nn.Conv2d(n_f * 4, n_f, 1, bias=False),
        )

    def forward(self, x, past):
        return self.conv(torch.cat([x, past], 1)) + x


MEMORY_BLOCKS = (MemBlock, SuperMemBlock)  # blocks called as b(x, past)


class TPool(nn.Module):
    """Merge `stride` consecutive frames into one: (N*T)CHW -> (N*T/stride)CHW."""

    def __init__(self, n_f: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(n_f * stride, n_f, 1, bias=False)

    def forward(self, x):
        NT, C, H, W = x.shape
        assert NT % self.stride == 0, f"TPool: {NT} frames do not split into groups of {self.stride}"
        return self.conv(x.reshape(-1, self.stride * C, H, W))


class TGrow(nn.Module):
    """Split each frame into `stride` frames: (N*T)CHW -> (N*T*stride)CHW."""

    def __init__(self, n_f: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(n_f, n_f * stride, 1, bias=False)

    def forward(self, x):
        _NT, C, H, W = x.shape
        return self.conv(x).reshape(-1, C, H, W)


def encoder(c_img: int, latent_channels: int, time_down: tuple[bool, bool, bool]) -> nn.Sequential:
    """conv(c_img, 64), ReLU, 3 x [TPool, conv stride 2, 3 x MemBlock(64)], conv(64, latent_channels)."""

    def stage(down_t: bool) -> list[nn.Module]:
        return [
            TPool(64, 2 if down_t else 1),
            conv(64, 64, stride=2, bias=False),
            *(MemBlock(64, 64) for _ in range(3)),
        ]

    return nn.Sequential(
        conv(c_img, 64), nn.ReLU(inplace=True), *(m for t in time_down for m in stage(t)), conv(64, latent_channels)
    )


def base_decoder(
    latent_channels: int, c_img: int, time_up: tuple[bool, bool, bool], space_up: tuple[bool, bool, bool]
) -> nn.Sequential:
    """Clamp, conv(latent, 256), ReLU, 3 x [3 x MemBlock, Upsample, TGrow, conv(no bias)], ReLU, conv(64, c_img)."""
    n_f = BASE_WIDTHS

    def stage(i: int) -> list[nn.Module]:
        return [
            *(MemBlock(n_f[i], n_f[i]) for _ in range(3)),
            nn.Upsample(scale_factor=2 if space_up[i] else 1),
            TGrow(n_f[i], 2 if time_up[i] else 1),
            conv(n_f[i], n_f[i + 1], bias=False),
        ]

    return nn.Sequential(
        Clamp(),
        conv(latent_channels, n_f[0]),
        nn.ReLU(inplace=True),
        *(m for i in range(3) for m in stage(i)),
        nn.ReLU(inplace=True),
        conv(n_f[3], c_img),
    )


def super_decoder(
    latent_channels: int, c_img: int, time_up: tuple[bool, bool, bool], space_up: tuple[bool, bool, bool]
) -> nn.Sequential:
    """1x1 conv(latent, 512, no bias), 3 x [3 x SuperMemBlock, conv to next width x s^2, ReLU,
    PixelShuffle(s), TGrow], conv(64, c_img). No Clamp in front: the latents go in as they are."""
    n_f = SUPER_WIDTHS

    def stage(i: int) -> list[nn.Module]:
        s = 2 if space_up[i] else 1
        return [
            *(SuperMemBlock(n_f[i]) for _ in range(3)),
            conv(n_f[i], n_f[i + 1] * s * s),
            nn.ReLU(inplace=True),
            nn.PixelShuffle(s),
            TGrow(n_f[i + 1], 2 if time_up[i] else 1),
        ]

    return nn.Sequential(
        nn.Conv2d(latent_channels, n_f[0], 1, bias=False),
        *(m for i in range(3) for m in stage(i)),
        conv(n_f[3], c_img),
    )
