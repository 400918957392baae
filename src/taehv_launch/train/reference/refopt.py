"""Rewrites of the frozen reference encoder that make its compiled GPU encode faster, same result.

Two levers, each measured on its own row (docs/benchmarks.md, `bench --compare --levers`):

Channels-last (NDHWC) without layout copies in the group norms. cuDNN runs the encoder's Conv3d
in NDHWC; given NCDHW tensors it transposes every input and output (130 of the compiled CogVideoX
encode's 720 ms on an H100, docs/benchmarks.md). Keeping
the activations channels_last_3d removes those transposes, but torch's GroupNorm views its
input as (N, G, -1), which needs NCDHW memory, so Inductor copied every normalised tensor back
and forth instead: no gain. `ChannelsLastGroupNorm` computes the same statistics as one
per-channel reduction over the NDHWC rows (coalesced), combines them per group exactly, and
applies the affine map as a pointwise op that Inductor fuses with the SiLU and causal padding
after it. Only for frozen, compiled GPU use: eager it is slower than nn.GroupNorm (a float copy).

The causal time padding as one replicate pad. CogVideoX's causal Conv3d prepends copies of the
first frame with torch.cat([x[:, :, :1]] * 2 + [x]); Inductor writes that as a copy reading its
input in three places. F.pad(mode="replicate") on the time axis builds the same tensor as one
index clamp, which Inductor fuses with the SiLU in front of every conv (596 -> 570 ms per 8
clips on an H100). Bit-identical; applies to diffusers' CogVideoXCausalConv3d only (the other
families' causal convs pad differently).
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F


def is_channels_last_3d(x: torch.Tensor) -> bool:
    return x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d) and not x.is_contiguous()


class ChannelsLastGroupNorm(nn.GroupNorm):
    """nn.GroupNorm (same parameters, same result) that keeps an NDHWC input NDHWC.

    Any other input (NCDHW, 4D, ...) takes nn.GroupNorm's own path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not is_channels_last_3d(x):
            return super().forward(x)
        n, c, d, h, w = x.shape
        g = self.num_groups
        rows = x.permute(0, 2, 3, 4, 1).reshape(n, d * h * w, c)  # a view of the NDHWC memory
        var_c, mean_c = torch.var_mean(rows.float(), dim=1, correction=0)  # per channel, (n, c)
        mean_c, var_c = mean_c.view(n, g, c // g), var_c.view(n, g, c // g)
        mean = mean_c.mean(-1, keepdim=True)  # equal counts per channel:
        var = (var_c + (mean_c - mean).square()).mean(-1, keepdim=True)  # the exact group variance
        scale = torch.rsqrt(var + self.eps).expand(n, g, c // g)
        shift = -mean * scale
        if self.affine:
            weight = self.weight.float().view(1, g, c // g)
            scale, shift = scale * weight, shift * weight + self.bias.float().view(1, g, c // g)
        y = rows.float() * scale.reshape(n, 1, c) + shift.reshape(n, 1, c)
        return y.to(x.dtype).view(n, d, h, w, c).permute(0, 4, 1, 2, 3)


def channels_last_encoder(encoder: nn.Module) -> nn.Module:
    """In place: every GroupNorm of `encoder` becomes a ChannelsLastGroupNorm (same parameters)
    and every Conv3d weight channels_last_3d. Returns the module. Feed it channels_last_3d input."""
    for module in encoder.modules():
        if type(module) is nn.GroupNorm:
            module.__class__ = ChannelsLastGroupNorm
        elif isinstance(module, nn.Conv3d):
            module.weight.data = module.weight.data.contiguous(memory_format=torch.channels_last_3d)
    return encoder


@functools.cache
def _replicate_pad_class() -> type:
    from diffusers.models.autoencoders.autoencoder_kl_cogvideox import CogVideoXCausalConv3d

    class ReplicatePadCausalConv3d(CogVideoXCausalConv3d):
        """CogVideoXCausalConv3d whose first-frame time padding is one replicate pad (same tensor)."""

        def fake_context_parallel_forward(self, inputs, conv_cache=None):
            if conv_cache is None and self.pad_mode != "replicate" and self.time_kernel_size > 1:
                return F.pad(inputs, (0, 0, 0, 0, self.time_kernel_size - 1, 0), mode="replicate")
            return super().fake_context_parallel_forward(inputs, conv_cache)

    return ReplicatePadCausalConv3d


def replicate_time_padding(encoder: nn.Module) -> int:
    """In place: every CogVideoX causal conv of `encoder` pads time with one replicate pad.
    Returns how many convs changed (0 for the other families: nothing to do)."""
    cls = _replicate_pad_class()
    convs = [m for m in encoder.modules() if type(m) is cls.__base__]
    for module in convs:
        module.__class__ = cls
    return len(convs)
