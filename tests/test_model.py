"""TAEHV model: shape contracts, public checkpoint layout, weight loading, training path, every family and
decoder through the losses and Seraena (upstream's layouts and decode rules per file name: test_exports.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from taehv_launch.errors import ModelError
from taehv_launch.plan.families import FAMILIES
from taehv_launch.train.model.blocks import MEMORY_BLOCKS
from taehv_launch.train.model.losses import DistillNet, decoder_targets
from taehv_launch.train.model.seraena import VideoSeraena, seraena_crop
from taehv_launch.train.model.taehv import TAEHV, build_taehv, count_params, load_taehv_state_dict


def memblock(prefix: str, c: int) -> list[tuple[str, tuple]]:
    """Keys of a public MemBlock(c, c): conv = Sequential(conv(2c,c), ReLU, conv, ReLU, conv), no skip."""
    return [
        (f"{prefix}.conv.0.weight", (c, 2 * c, 3, 3)),
        (f"{prefix}.conv.0.bias", (c,)),
        (f"{prefix}.conv.2.weight", (c, c, 3, 3)),
        (f"{prefix}.conv.2.bias", (c,)),
        (f"{prefix}.conv.4.weight", (c, c, 3, 3)),
        (f"{prefix}.conv.4.bias", (c,)),
    ]


# Written by hand from public madebyollin/taehv taehv.py (TAEHV.__init__), default config:
# latent_channels=16, patch_size=1, encoder_time_downscale=(T, T, F), decoder_time_upscale=(F, T, T).
PUBLIC_LAYOUT = [
    # encoder: conv(3, 64), ReLU, then 3 x [TPool(64, s), conv(64, 64, stride 2, no bias), 3 x MemBlock(64)], conv(64, 16)
    ("encoder.0.weight", (64, 3, 3, 3)),
    ("encoder.0.bias", (64,)),
    ("encoder.2.conv.weight", (64, 128, 1, 1)),
    ("encoder.3.weight", (64, 64, 3, 3)),
    *memblock("encoder.4", 64),
    *memblock("encoder.5", 64),
    *memblock("encoder.6", 64),
    ("encoder.7.conv.weight", (64, 128, 1, 1)),
    ("encoder.8.weight", (64, 64, 3, 3)),
    *memblock("encoder.9", 64),
    *memblock("encoder.10", 64),
    *memblock("encoder.11", 64),
    ("encoder.12.conv.weight", (64, 64, 1, 1)),
    ("encoder.13.weight", (64, 64, 3, 3)),
    *memblock("encoder.14", 64),
    *memblock("encoder.15", 64),
    *memblock("encoder.16", 64),
    ("encoder.17.weight", (16, 64, 3, 3)),
    ("encoder.17.bias", (16,)),
    # decoder: Clamp, conv(16, 256), ReLU, then per stage 3 x MemBlock, Upsample, TGrow, conv(no bias); ReLU, conv(64, 3)
    ("decoder.1.weight", (256, 16, 3, 3)),
    ("decoder.1.bias", (256,)),
    *memblock("decoder.3", 256),
    *memblock("decoder.4", 256),
    *memblock("decoder.5", 256),
    ("decoder.7.conv.weight", (256, 256, 1, 1)),
    ("decoder.8.weight", (128, 256, 3, 3)),
    *memblock("decoder.9", 128),
    *memblock("decoder.10", 128),
    *memblock("decoder.11", 128),
    ("decoder.13.conv.weight", (256, 128, 1, 1)),
    ("decoder.14.weight", (64, 128, 3, 3)),
    *memblock("decoder.15", 64),
    *memblock("decoder.16", 64),
    *memblock("decoder.17", 64),
    ("decoder.19.conv.weight", (128, 64, 1, 1)),
    ("decoder.20.weight", (64, 64, 3, 3)),
    ("decoder.22.weight", (3, 64, 3, 3)),
    ("decoder.22.bias", (3,)),
]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_state_dict_matches_public_layout():
    sd = TAEHV().state_dict()
    assert [(k, tuple(v.shape)) for k, v in sd.items()] == PUBLIC_LAYOUT
    assert count_params(TAEHV()) == sum(torch.Size(s).numel() for _, s in PUBLIC_LAYOUT)


def test_default_shapes_and_trim():
    m = TAEHV().eval()
    assert (m.t_downscale, m.t_upscale, m.frames_to_trim) == (4, 4, 3)
    with torch.no_grad():
        z = m.encode_video(torch.rand(2, 12, 3, 64, 64))
        assert z.shape == (2, 3, 16, 8, 8)
        assert m.decode_video(z).shape == (2, 9, 3, 64, 64)
        assert m.decode_video(z, trim=False).shape == (2, 12, 3, 64, 64)
        out = m.decode_video(z)
        assert out.min() >= 0 and out.max() <= 1
        # T not a multiple of 4: padded by repeating the last frame
        x = torch.rand(1, 10, 3, 32, 32)
        padded = torch.cat([x, x[:, -1:], x[:, -1:]], 1)
        torch.testing.assert_close(m.encode_video(x), m.encode_video(padded))


def test_patch_size_2_latent_32_variant():
    m = TAEHV(latent_channels=32, patch_size=2).eval()
    sd = m.state_dict()
    assert sd["encoder.0.weight"].shape == (64, 12, 3, 3)
    assert sd["encoder.17.weight"].shape == (32, 64, 3, 3)
    assert sd["decoder.1.weight"].shape == (256, 32, 3, 3)
    assert sd["decoder.22.weight"].shape == (12, 64, 3, 3)
    with torch.no_grad():
        z = m.encode_video(torch.rand(1, 12, 3, 64, 64))
        assert z.shape == (1, 3, 32, 4, 4)
        assert m.decode_video(z).shape == (1, 9, 3, 64, 64)
    with pytest.raises(AssertionError, match="multiple of 16"):
        m.encode_video(torch.rand(1, 4, 3, 40, 40))


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_save_and_load_round_trip(tmp_path, suffix):
    src = TAEHV()
    path = tmp_path / f"w{suffix}"
    if suffix == ".pth":
        torch.save(src.state_dict(), path)
    else:
        from safetensors.torch import save_file

        save_file(src.state_dict(), str(path))
    cfg = {
        "latent_channels": 16,
        "patch_size": 1,
        "encoder_time_downscale": (True, True, False),
        "decoder_time_upscale": (False, True, True),
        "decoder_space_upscale": (True, True, True),
        "gradient_checkpointing": True,
        "pretrained_model_path": str(path),
    }
    dst = build_taehv(cfg)
    assert dst.gradient_checkpointing
    for (k, a), b in zip(src.state_dict().items(), dst.state_dict().values()):
        assert torch.equal(a, b), k


def test_build_without_weights_uses_defaults():
    m = build_taehv({"pretrained_model_path": ""})
    assert (m.latent_channels, m.patch_size, m.gradient_checkpointing) == (16, 1, False)


def test_wide_tgrow_weights_are_patched(tmp_path):
    """A full-upscale checkpoint loads into a decoder that skips a time upscale (public behaviour)."""
    full = TAEHV().state_dict()
    path = tmp_path / "full.pth"
    torch.save(full, path)
    preview = TAEHV(decoder_time_upscale=(False, False, True))
    assert preview.state_dict()["decoder.13.conv.weight"].shape == (128, 128, 1, 1)
    load_taehv_state_dict(preview, str(path))
    assert torch.equal(preview.state_dict()["decoder.13.conv.weight"], full["decoder.13.conv.weight"][-128:])
    assert preview.t_upscale == 2 and preview.frames_to_trim == 1


def test_wrong_latent_channels_is_a_clear_error(tmp_path):
    path = tmp_path / "w16.pth"
    torch.save(TAEHV(latent_channels=16).state_dict(), path)
    with pytest.raises(
        ModelError, match=r"encoder\.17\.weight.*\(16, 64, 3, 3\).*\(32, 64, 3, 3\).*latent_channels=16"
    ) as e:
        load_taehv_state_dict(TAEHV(latent_channels=32), str(path))
    assert "\n" not in str(e.value)
    with pytest.raises(ModelError, match=r"patch_size=1"):
        load_taehv_state_dict(TAEHV(patch_size=2), str(path))


def test_missing_unexpected_and_unreadable_files(tmp_path):
    with pytest.raises(ModelError, match="not found: .*nope.pth"):
        build_taehv({"pretrained_model_path": str(tmp_path / "nope.pth")})
    sd = TAEHV().state_dict()
    del sd["decoder.22.bias"]
    torch.save(sd, tmp_path / "short.pth")
    with pytest.raises(ModelError, match=r"lack decoder\.22\.bias"):
        load_taehv_state_dict(TAEHV(), str(tmp_path / "short.pth"))
    sd = TAEHV().state_dict()
    sd["extra.weight"] = torch.zeros(1)
    torch.save(sd, tmp_path / "long.pth")
    with pytest.raises(ModelError, match=r"extra\.weight"):
        load_taehv_state_dict(TAEHV(), str(tmp_path / "long.pth"))
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(ModelError, match="cannot read") as e:
        load_taehv_state_dict(TAEHV(), str(tmp_path / "junk.pth"))
    assert "\n" not in str(e.value)
    torch.save({"model": TAEHV()}, tmp_path / "pickled.pth")  # a whole module: refused by weights_only
    with pytest.raises(ModelError, match="cannot read") as e:
        load_taehv_state_dict(TAEHV(), str(tmp_path / "pickled.pth"))
    assert "\n" not in str(e.value)


def test_gradients_flow_outside_unit_range():
    """Training decodes with clamp=False: pixels above 1 still get gradients."""
    m = TAEHV().train()
    with torch.no_grad():
        m.decoder[22].bias.fill_(5.0)  # every output pixel far above 1
    z = torch.randn(1, 2, 16, 4, 4, requires_grad=True)
    out = m.decode_video(z, clamp=False)
    assert out.min() > 1
    out.mean().backward()
    assert m.decoder[22].bias.grad.abs().min() > 0
    assert z.grad.abs().sum() > 0
    # the clamped (inference) path really would have killed them
    z.grad = None
    m.decode_video(z, clamp=True).mean().backward()
    assert z.grad.abs().sum() == 0


def _grads_and_calls(checkpointing: bool, arch: str = "base", **shape):
    torch.manual_seed(0)
    m = TAEHV(gradient_checkpointing=checkpointing, decoder_arch=arch, **shape).train()
    calls = []
    for b in [*m.encoder, *m.decoder]:
        if isinstance(b, MEMORY_BLOCKS):
            # a pre-hook: recomputation stops as soon as the saved tensors are rebuilt
            # (checkpoint early stop), so a MemBlock's post-forward hook may never fire
            b.register_forward_pre_hook(lambda mod, inp: calls.append(mod))
    torch.manual_seed(1)
    x = torch.rand(1, 8, 3, 32, 32)
    out = m(x)
    loss = (out - x[:, : out.shape[1]]).square().mean() + m.encode_video(x).square().mean()
    n_forward = len(calls)
    loss.backward()
    return {k: p.grad.clone() for k, p in m.named_parameters()}, n_forward, len(calls)


@pytest.mark.parametrize("arch", ["base", "super"])
def test_gradient_checkpointing_recomputes_with_equal_gradients(arch):
    ref, fwd_plain, total_plain = _grads_and_calls(False, arch)
    got, fwd_ckpt, total_ckpt = _grads_and_calls(True, arch)
    # 9 memory blocks each in encoder and decoder: forward() = 18 calls, the extra encode 9 more
    assert fwd_plain == total_plain == fwd_ckpt == 27
    assert total_ckpt == 2 * fwd_ckpt  # every memory block ran again during backward
    for k in ref:  # the recomputation replays the same ops: bitwise-equal gradients
        assert torch.equal(got[k], ref[k]), k


def test_no_recompute_in_eval_or_no_grad():
    m = TAEHV(gradient_checkpointing=True)
    calls = []
    m.decoder[3].register_forward_hook(lambda *a: calls.append(1))
    z = torch.randn(1, 2, 16, 4, 4)
    with torch.no_grad():
        m.train().decode_video(z)
    m.eval().decode_video(z)
    assert len(calls) == 2


def test_super_decoder_is_upstreams_and_loads_strictly(tmp_path):
    """SuperMemBlocks (7x7 depthwise, 4x bottleneck), widths 512/256/128/64, no Clamp in front; a base
    file does not load into it (nor the other way), with the decoder named in the line."""
    m = TAEHV(decoder_arch="super")
    sd = m.state_dict()
    assert sd["decoder.0.weight"].shape == (512, 16, 1, 1)  # 1x1, no bias
    assert sd["decoder.1.conv.0.weight"].shape == (1024, 1, 7, 7)  # depthwise over [x, past]
    assert sd["decoder.4.weight"].shape == (256 * 4, 512, 3, 3)  # then PixelShuffle(2)
    assert sd["decoder.7.conv.weight"].shape == (256, 256, 1, 1)  # TGrow(256, 1): no time upscale first
    assert sd["decoder.22.weight"].shape == (3, 64, 3, 3)
    assert count_params(m.decoder) > 1.9 * count_params(TAEHV().decoder)
    torch.save(TAEHV().state_dict(), tmp_path / "base.pth")
    with pytest.raises(ModelError, match=r"decoder_arch=base") as e:
        load_taehv_state_dict(TAEHV(decoder_arch="super"), str(tmp_path / "base.pth"))
    assert "\n" not in str(e.value)
    with torch.no_grad():
        z = torch.randn(1, 3, 16, 2, 2)
        assert m.eval().decode_video(z).shape == (1, 9, 3, 16, 16)


def test_h3_chunked_encode_checkpoints_like_the_plain_one():
    """H3's clips are a batch of their own inside encode_video: checkpointing recomputes them alike."""
    h3 = FAMILIES["h3"]
    torch.manual_seed(1)
    x = torch.rand(1, 22, 3, 32, 32)
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        m = TAEHV.from_family(h3, gradient_checkpointing=checkpointing).train()
        z = m.encode_video(x)
        assert z.shape[1] == h3.latent_frames(22) == 7
        out = m.decode_video(z, clamp=False)
        assert out.shape[1] == h3.decoded_frames(7) == 22
        (out.square().mean() + z.square().mean()).backward()
        grads.append({k: p.grad for k, p in m.named_parameters()})
    for k in grads[0]:
        assert torch.equal(grads[0][k], grads[1][k]), k


@pytest.mark.parametrize(
    "name,arch",
    [(name, "base") for name in FAMILIES]
    + [pytest.param(name, "super", marks=pytest.mark.slow) for name in ("wan22", "ltx2", "h3")],
)
def test_every_family_trains_through_the_losses_and_seraena(name, arch):
    """One training step's losses at the family's own shape (patch 1/2/4, 16-128 latent channels, LTX's 8x
    in time, H3's chunks): the encoder gives the reference's latent count, the decode lines up with the
    first input frames, Seraena corrects a crop on the latent grid, and every TAEHV weight gets a gradient."""
    family = FAMILIES[name]
    torch.manual_seed(0)
    taehv = TAEHV.from_family(family, arch, gradient_checkpointing=True).train()
    net = DistillNet(taehv, family)
    n, side = family.default_n_frames, 16 * family.patch_size
    frames = torch.rand(1, n, 3, side, side)
    latents = torch.randn(1, family.latent_frames(n), family.latent_channels, 2, 2)
    enc, dec = net(frames, latents)
    assert enc.shape == latents.shape
    assert dec.shape[1] == family.decoded_frames(latents.shape[1]) <= n
    target = decoder_targets(frames, dec)
    seraena = VideoSeraena(family.latent_channels, buffer_bytes=1 << 20)
    cell = 8 * family.patch_size
    real, fake, ctx = seraena_crop(target, dec, latents, cell, torch.Generator().manual_seed(0))
    assert real.shape[-1] == cell and ctx.shape[-1] == 1
    corrected, stats = seraena.step_and_make_targets(real, fake.detach().clamp(0, 1), ctx)
    loss = F.mse_loss(dec, target) + F.mse_loss(enc, latents) + 0.3 * F.mse_loss(fake, corrected)
    loss.backward()
    assert torch.isfinite(loss) and stats["disc_step_skipped"] == 0.0
    missing = [k for k, p in taehv.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, missing[:3]
