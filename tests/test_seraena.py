"""VideoSeraena: target shapes, bounded replay buffer, rank-identical discriminator, resume."""

from __future__ import annotations

import io
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from taehv_launch.train.model.seraena import VideoSeraena

LATENT = 4
ENTRY_BYTES = (9 * 32 * 32 + LATENT * 4 * 4) * 2  # one grouped bf16 fake + its context


def clip(n=1, t=9, hw=32, seed=0):
    """(real, fake, latents): NTCHW frames in [0, 1] and N x 3 x LATENT x hw/8 x hw/8 latents."""
    g = torch.Generator().manual_seed(seed)
    real = torch.rand(n, t, 3, hw, hw, generator=g)
    fake = (real + 0.1 * torch.randn(real.shape, generator=g)).clamp(0, 1)
    latents = torch.randn(n, 3, LATENT, hw // 8, hw // 8, generator=g)
    return real, fake, latents


pytestmark = pytest.mark.usefixtures("one_thread")


def test_targets_match_fake_shape_and_are_detached():
    s = VideoSeraena(LATENT)
    for t in (9, 8, 7):  # 8 and 7 frames: padded to 9 with copies of the first frame
        real, fake, latents = clip(n=2, t=t)
        fake.requires_grad_(True)
        targets, stats = s.step_and_make_targets(real, fake, latents)
        assert targets.shape == fake.shape and not targets.requires_grad
        assert isinstance(stats["disc_loss"], float) and stats["disc_loss"] > 0
        assert stats["disc_step_skipped"] == 0.0
    # the correction is grad / (std(grad) + 1e-5) as upstream: nonzero, std at most 1
    real, fake, latents = clip(n=2, t=9)
    targets, _ = s.step_and_make_targets(real, fake, latents)
    assert 0 < (targets - fake).std(correction=0).item() <= 1 + 1e-4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast(dtype):
    s = VideoSeraena(LATENT, autocast_dtype=dtype)
    real, fake, latents = clip(hw=16)  # reduced-precision convolutions are slow on CPU
    with torch.no_grad():
        targets, stats = s.step_and_make_targets(real, fake.to(dtype), latents)
    assert targets.dtype == dtype and targets.shape == fake.shape
    assert stats["disc_loss"] > 0
    # fp16 needs a GradScaler (saved with the checkpoint); bf16 does not
    assert ("scaler" in s.state_dict_for_checkpoint(False)) == (dtype == torch.float16)


def test_padding_prepends_first_frame():
    s = VideoSeraena(LATENT)
    x = torch.arange(7.0).reshape(1, 7, 1, 1, 1).expand(1, 7, 3, 2, 2)
    g = s._group(x)
    assert g.shape == (3, 9, 2, 2)
    assert g[:, ::3, 0, 0].flatten().tolist() == [0, 0, 0, 1, 2, 3, 4, 5, 6]  # frame k at channels 3k..3k+2
    assert torch.equal(s._ungroup(g, 1, 7), x)


def test_replay_buffer_is_bounded_in_bytes():
    s = VideoSeraena(LATENT, buffer_bytes=3 * ENTRY_BYTES + 100)
    for step in range(4):  # 4 steps x 2 clips x 3 groups = 24 entries offered
        s.step_and_make_targets(*clip(n=2, seed=step))
        assert s.buffer_nbytes <= 3 * ENTRY_BYTES + 100
    assert len(s.buffer.items) == 3 and s.buffer_nbytes == 3 * ENTRY_BYTES
    assert all(f.dtype == torch.bfloat16 for f, _ in s.buffer.items)
    off = VideoSeraena(LATENT, buffer_bytes=0)  # replay off: fresh fakes only, still works
    targets, _ = off.step_and_make_targets(*clip())
    assert off.buffer_nbytes == 0 and torch.isfinite(targets).all()


def test_non_finite_fakes_skip_the_step_and_keep_the_disc():
    s = VideoSeraena(LATENT)
    s.step_and_make_targets(*clip())
    before = {k: v.clone() for k, v in s.disc.state_dict().items()}
    n_items = len(s.buffer.items)
    real, fake, latents = clip(seed=1)
    real[:] = float("nan")
    fake[:] = float("nan")
    _, stats = s.step_and_make_targets(real, fake, latents)
    assert stats["disc_step_skipped"] == 1.0
    assert len(s.buffer.items) == n_items
    for k, v in s.disc.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_checkpoint_round_trip_reproduces_next_targets():
    a = VideoSeraena(LATENT, seed=3)
    for step in range(3):
        a.step_and_make_targets(*clip(n=2, seed=step))
    blob = io.BytesIO()
    torch.save(a.state_dict_for_checkpoint(include_buffer=True), blob)
    blob.seek(0)
    b = VideoSeraena(LATENT, seed=99)
    b.load_checkpoint_state(torch.load(blob, weights_only=True))
    assert b.buffer_nbytes == a.buffer_nbytes
    for step in (3, 4):
        ta, sa = a.step_and_make_targets(*clip(n=2, seed=step))
        tb, sb = b.step_and_make_targets(*clip(n=2, seed=step))
        assert torch.equal(ta, tb) and sa == sb
    assert "buffer" not in a.state_dict_for_checkpoint(include_buffer=False)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        s = VideoSeraena(LATENT, seed=rank)  # different inits: rank 0's is broadcast first
        init = [p.detach().clone() for p in s.disc.parameters()]
        losses = []
        for step in range(3):
            _, stats = s.step_and_make_targets(*clip(n=1, seed=100 * rank + step))  # different data
            losses.append(stats["disc_loss"])
        assert any(not torch.equal(p, q) for p, q in zip(s.disc.parameters(), init)), "disc did not train"
        state = torch.cat([t.detach().reshape(-1).double() for t in s.disc.state_dict().values()])
        gathered = [torch.empty_like(state) for _ in range(world)]
        dist.all_gather(gathered, state)
        assert torch.equal(gathered[0], gathered[1]), "disc params/buffers differ across ranks"
        bn_means = torch.cat([m.running_mean for m in s.disc.modules() if isinstance(m, torch.nn.BatchNorm2d)])
        assert bn_means.abs().sum() > 0  # the stats moved (and were compared above, bitwise)
        seen = [torch.empty(3, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(seen, torch.tensor(losses, dtype=torch.float64))
        assert torch.equal(seen[0], seen[1]), "reported disc_loss is not the mean over ranks"
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # ~31 s: two real gloo ranks
def test_two_ranks_keep_identical_discriminators():
    mp.spawn(_rank_main, args=(2, _free_port()), nprocs=2, join=True)
