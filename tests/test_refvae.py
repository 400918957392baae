"""Reference VAE adapters on tiny, randomly initialised diffusers VAEs of each family.

Frame alignment is tested structurally: with GroupNorm made per-frame (the only thing
that mixes all frames in these VAEs, through its statistics), a perturbed input frame
may only change the latents that causally see it, and a perturbed latent only the
decoded frames after it. That pins which input frames the reference latents and their
decoded frames stand for, without needing trained weights.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn as nn

from taehv_launch.errors import ConfigError, ModelError
from taehv_launch.plan import families
from taehv_launch.train.reference.refvae import load_reference_vae
from taehv_launch.train.data.synthetic import make_tiny_ref_vae

FAMILIES = tuple(families.FAMILIES)  # every family record is tested
FOUR_X = tuple(k for k, f in families.FAMILIES.items() if f.time_stride == 4 and not f.clip_length)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny convs on a small shared VM: 2 intra-op threads measured 10-20x slower and erratic."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def vae_dirs(tmp_path_factory) -> dict[str, str]:
    """One diffusers-style folder (<dir>/vae/config.json + weights) per family."""
    root = tmp_path_factory.mktemp("ref_vae")
    dirs = {}
    for kind in FAMILIES:
        make_tiny_ref_vae(kind, str(root / kind / "vae"), latent_channels=4, seed=0)
        dirs[kind] = str(root / kind)
    return dirs


def _frames(n=2, t=12, h=64, w=64, seed=0) -> torch.Tensor:
    """NTCHW RGB in [0, 1]."""
    return torch.rand(n, t, 3, h, w, generator=torch.Generator().manual_seed(seed))


def _fam(kind):
    return families.FAMILIES[kind]


@pytest.mark.parametrize("kind", FAMILIES)
def test_encode_shapes_and_frozen(vae_dirs, kind):
    fam = _fam(kind)
    n = fam.default_n_frames
    vae = load_reference_vae(kind, vae_dirs[kind], "float32", "cpu")
    z = vae.encode(_frames(n=1, t=n))
    s = 64 // fam.space_stride
    assert z.shape == (1, fam.latent_frames(n), 4, s, s) and z.dtype == torch.float32
    assert vae.latent_channels == 4 and vae.latent_frames(n) == fam.latent_frames(n)
    assert not vae.model.training and not any(p.requires_grad for p in vae.model.parameters())
    # uint8 in [0, 255] is the same input as float in [0, 1]
    side = 2 * fam.space_stride
    x8 = (_frames(n=1, t=n, h=side, w=side) * 255).round().to(torch.uint8)
    torch.testing.assert_close(vae.encode(x8), vae.encode(x8.float() / 255))


@pytest.mark.parametrize("kind", FAMILIES)
def test_decode_of_encode_lines_up_with_the_clip(vae_dirs, kind):
    """decode(encode(n frames)) gives the family's decoded_frames: the first n - (stride - 1) frames
    (9 of 12 for the 4x families, 9 of 16 for LTX), or all of them for H3's chunks."""
    fam = _fam(kind)
    n, side = fam.default_n_frames, 2 * fam.space_stride
    vae = load_reference_vae(kind, vae_dirs[kind])
    y = vae.decode(vae.encode(_frames(n=1, t=n, h=side, w=side)))
    assert y.shape == (1, fam.decoded_frames(fam.latent_frames(n)), 3, side, side)
    assert y.shape[1] == (n if fam.clip_length else n - fam.time_stride + 1)
    assert 0 <= y.min() and y.max() <= 1
    if not fam.clip_length:  # frames beyond 1 + sk never reach the latents: the targets are the first ones
        x = _frames(n=1, t=n, h=side, w=side)
        x2 = x.clone()
        x2[:, fam.ref_frames(n) :] = 1 - x2[:, fam.ref_frames(n) :]
        assert torch.equal(vae.encode(x), vae.encode(x2))


@pytest.mark.parametrize("kind", FOUR_X)
def test_even_latent_counts(vae_dirs, kind):
    """24 frames -> 6 latents; CogVideoX decodes an even count to 4L frames, the others to 1 + 4(L - 1)."""
    side = 2 * _fam(kind).space_stride
    vae = load_reference_vae(kind, vae_dirs[kind])
    z = vae.encode(_frames(n=1, t=24, h=side, w=side))
    assert z.shape[1] == vae.latent_frames(24) == 6
    y = vae.decode(z)
    assert y.shape[1] == vae.decoded_frames(6) == (24 if kind == "cogvideox" else 21)


# --- structural alignment -----------------------------------------------------------

LATENT_HW = 4  # 16x16 input -> 2x2 latents: the token count per frame in the mid-block attention


def _per_frame_group_norm(monkeypatch):
    """Make every GroupNorm normalise each frame alone (5-D NCTHW, or attention's N, C, T*HW)."""
    original = nn.GroupNorm.forward

    def forward(self, x):
        if x.dim() == 5:
            n, c, t, h, w = x.shape
            y = original(self, x.transpose(1, 2).reshape(n * t, c, h, w))
            return y.reshape(n, t, c, h, w).transpose(1, 2)
        if x.dim() == 3 and x.shape[-1] % LATENT_HW == 0 and x.shape[-1] > LATENT_HW:
            n, c, s = x.shape
            t = s // LATENT_HW
            y = original(self, x.reshape(n, c, t, LATENT_HW).transpose(1, 2).reshape(n * t, c, LATENT_HW))
            return y.reshape(n, t, c, LATENT_HW).transpose(1, 2).reshape(n, c, s)
        return original(self, x)

    monkeypatch.setattr(nn.GroupNorm, "forward", forward)


def _changed(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-9) -> list[int]:
    """Time indices (dim 1, NTCHW) where a and b differ."""
    return [t for t in range(a.shape[1]) if (a[:, t] - b[:, t]).abs().max() > tol]


def _encoder_dependence(encode, x, tol=1e-9):
    z = encode(x)
    out = []
    for f in range(x.shape[1]):
        x2 = x.clone()
        x2[:, f] += 0.1
        out.append(_changed(z, encode(x2), tol))
    return out


CAUSAL_ENC = [[0, 1, 2]] + [[1, 2]] * 4 + [[2]] * 4 + [[]] * 3  # 1 + 4k: latent k sees frames <= 4k
CAUSAL_DEC = [list(range(0, 9)), list(range(1, 9)), list(range(5, 9))]  # latent k first shows at frame 4k-3


def _expected(fam, n):
    """Which latents each input frame reaches, and the first decoded frame each latent reaches: causal
    inside every chunk (the whole clip when not chunked), latent k of a chunk <- its frames sk-s+1..sk."""
    s, latents = fam.time_stride, fam.latent_frames(n)
    clip = fam.clip_length or n
    per_chunk = -(-clip // s)
    enc = []
    for f in range(n):
        c, p = divmod(f, clip)
        ks = [c * per_chunk + k for k in range(per_chunk) if s * k >= p] if f < fam.ref_frames(n) else []
        enc.append([k for k in ks if k < latents])
    first = [(k // per_chunk) * clip + max(0, s * (k % per_chunk) - s + 1) for k in range(latents)]
    return enc, first


@pytest.mark.parametrize("kind", FAMILIES)
def test_frame_alignment(vae_dirs, kind, monkeypatch):
    """Latent 0 <- frame 0, latent k <- frames sk-s+1..sk (per 17-frame chunk for H3); decoded frame j
    <- latent ceil(j/s): the decode's frames line up with the clip's first ones."""
    _per_frame_group_norm(monkeypatch)
    fam = _fam(kind)
    n = 12 if fam.time_stride == 4 and not fam.clip_length else fam.first_valid(2, group=1)[-1]
    dtype, tol = (torch.float32, 1e-5) if kind == "h3" else (torch.float64, 1e-9)  # H3 keeps fp32 modules
    vae = load_reference_vae(kind, vae_dirs[kind], dtype)
    side = 2 * fam.space_stride  # 2x2 latents: LATENT_HW tokens a frame
    x = _frames(n=1, t=n, h=side, w=side).to(dtype)
    enc, first = _expected(fam, n)
    assert _encoder_dependence(vae.encode, x, tol) == enc
    if kind in FOUR_X and kind != "h3":
        assert enc == CAUSAL_ENC
    z = vae.encode(x)
    y = vae.decode(z)
    dec = []
    for k in range(z.shape[1]):
        z2 = z.clone()
        z2[:, k] += 0.1
        dec.append(_changed(y, vae.decode(z2), tol))
    assert [d[0] for d in dec] == first
    if not fam.clip_length:  # a causal decoder: every later frame too
        assert dec == [list(range(f, y.shape[1])) for f in first]


def test_cogvideox_regroups_even_frame_counts(vae_dirs, monkeypatch):
    """Why encode trims to 1 + 4k frames: raw CogVideoX on 12 frames maps latent k to frames 4k..4k+3."""
    _per_frame_group_norm(monkeypatch)
    vae = load_reference_vae("cogvideox", vae_dirs["cogvideox"], torch.float64)

    def raw_encode(x):  # NTCHW [0, 1] -> NTCHW, all 12 frames straight into diffusers
        z = vae.model.encode((x * 2 - 1).permute(0, 2, 1, 3, 4)).latent_dist.mode()
        return z.permute(0, 2, 1, 3, 4)

    with torch.no_grad():
        dep = _encoder_dependence(raw_encode, _frames(n=1, h=16, w=16).double())
    assert dep == [[0, 1, 2]] * 4 + [[1, 2]] * 4 + [[2]] * 4


# --- batching, normalisation, dtypes --------------------------------------------------


@pytest.mark.parametrize("kind", FAMILIES)
def test_chunked_encode_equals_unchunked(vae_dirs, kind):
    side = 2 * _fam(kind).space_stride
    x = _frames(n=3, t=_fam(kind).default_n_frames, h=side, w=side)
    one = load_reference_vae(kind, vae_dirs[kind], chunk_size=1).encode(x)
    every = load_reference_vae(kind, vae_dirs[kind], chunk_size=0).encode(x)
    two = load_reference_vae(kind, vae_dirs[kind], chunk_size=2).encode(x)
    torch.testing.assert_close(one, every, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(two, every, rtol=1e-4, atol=1e-5)


def test_latent_mean_std(vae_dirs):
    path = vae_dirs["wan"]
    mean, std = (0.1, -0.2, 0.3, 0.0), (2.0, 1.0, 0.5, 4.0)
    raw = load_reference_vae("wan", path)
    norm = load_reference_vae("wan", path, latent_mean=mean, latent_std=std)
    x = _frames(n=1, h=16, w=16)
    z_raw, z = raw.encode(x), norm.encode(x)
    expected = (z_raw - torch.tensor(mean).view(1, 1, 4, 1, 1)) / torch.tensor(std).view(1, 1, 4, 1, 1)
    torch.testing.assert_close(z, expected)
    torch.testing.assert_close(norm.decode(z), raw.decode(z_raw), rtol=1e-4, atol=1e-5)
    with pytest.raises(ConfigError, match="ref_latent_mean has 3 values"):
        load_reference_vae("wan", path, latent_mean=(0, 0, 0))
    with pytest.raises(ConfigError, match="ref_latent_std must be positive"):
        load_reference_vae("wan", path, latent_std=(1, 1, 0, 1))


def test_bfloat16_vae_returns_float32(vae_dirs):
    vae = load_reference_vae("cogvideox", vae_dirs["cogvideox"], "bfloat16")
    assert next(vae.model.parameters()).dtype == torch.bfloat16
    z = vae.encode(_frames(n=1, h=16, w=16))
    assert z.dtype == torch.float32 and torch.isfinite(z).all()


def test_loads_folder_without_vae_subfolder(vae_dirs):
    vae = load_reference_vae("hunyuan", vae_dirs["hunyuan"] + "/vae")
    assert vae.encode(_frames(n=1, h=16, w=16)).shape == (1, 3, 4, 2, 2)


def test_causal_frames():
    for family in families.FAMILIES.values():
        if family.time_stride == 4:
            assert [family.causal_frames(n) for n in (1, 4, 5, 12, 13, 24)] == [1, 1, 5, 9, 13, 21]
        else:
            assert [family.causal_frames(n) for n in (1, 8, 9, 16, 17, 24)] == [1, 1, 9, 9, 17, 17]
        assert family.ref_frames(39) == (39 if family.clip_length else family.causal_frames(39))


# --- errors ---------------------------------------------------------------------------


def test_missing_folder(tmp_path):
    with pytest.raises(ModelError, match="reference VAE folder not found: .*nowhere"):
        load_reference_vae("cogvideox", str(tmp_path / "nowhere"))
    with pytest.raises(ModelError, match="ref_vae_path is empty"):
        load_reference_vae("cogvideox", "")


def test_folder_without_config(tmp_path):
    (tmp_path / "vae").mkdir()
    with pytest.raises(ModelError, match="no config.json in"):
        load_reference_vae("wan", str(tmp_path))


@pytest.mark.parametrize(
    "kind,folder",
    [
        ("cogvideox", "wan"),
        ("wan", "hunyuan"),
        ("hunyuan", "cogvideox"),
        ("wan", "wan22"),  # one diffusers class, told apart by config.json's patch_size
        ("wan22", "wan"),
        ("hunyuan15", "hunyuan"),
        ("ltx2", "h3"),
        ("h3", "ltx2"),
    ],
)
def test_wrong_family(vae_dirs, kind, folder):
    with pytest.raises(ModelError, match=f"set ref_vae_type={folder}"):
        load_reference_vae(kind, vae_dirs[folder])


def test_wrong_family_without_class_name(vae_dirs, tmp_path):
    """A config.json with no _class_name still cannot smuggle random weights in."""
    shutil.copytree(vae_dirs["wan"], tmp_path / "wan")
    cfg_path = tmp_path / "wan" / "vae" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    del cfg["_class_name"]
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="cannot load the cogvideox reference VAE"):
        load_reference_vae("cogvideox", str(tmp_path / "wan"))


def test_corrupt_or_missing_weights(vae_dirs, tmp_path):
    shutil.copytree(vae_dirs["cogvideox"], tmp_path / "bad")
    weights = tmp_path / "bad" / "vae" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes(b"not safetensors")
    with pytest.raises(ModelError, match="cannot load the cogvideox reference VAE"):
        load_reference_vae("cogvideox", str(tmp_path / "bad"))
    weights.unlink()
    with pytest.raises(ModelError, match="no weights"):
        load_reference_vae("cogvideox", str(tmp_path / "bad"))


def test_partial_weights(vae_dirs, tmp_path):
    from safetensors.torch import load_file, save_file

    shutil.copytree(vae_dirs["cogvideox"], tmp_path / "part")
    weights = tmp_path / "part" / "vae" / "diffusion_pytorch_model.safetensors"
    state = load_file(str(weights))
    state.pop(sorted(state)[0])
    save_file(state, str(weights))
    with pytest.raises(ModelError, match="1 weights are missing"):
        load_reference_vae("cogvideox", str(tmp_path / "part"))


def test_bad_config_json(vae_dirs, tmp_path):
    shutil.copytree(vae_dirs["wan"], tmp_path / "w")
    (tmp_path / "w" / "vae" / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match="cannot read .*config.json"):
        load_reference_vae("wan", str(tmp_path / "w"))


def test_unknown_family(vae_dirs):
    with pytest.raises(ConfigError, match="ref_vae_type='ltx' is not supported"):
        load_reference_vae("ltx", vae_dirs["wan"])


# ----------------------------------------------------------------------------- channels-last encoder (speed)


@pytest.mark.parametrize(
    "shape,groups,affine", [((2, 16, 5, 12, 10), 4, True), ((1, 8, 3, 8, 8), 8, False), ((2, 6, 1, 4, 4), 1, True)]
)
def test_channels_last_group_norm_is_torchs_group_norm(shape, groups, affine):
    from taehv_launch.train.reference.refopt import ChannelsLastGroupNorm

    torch.manual_seed(0)
    ref = nn.GroupNorm(groups, shape[1], affine=affine)
    if affine:
        nn.init.normal_(ref.weight), nn.init.normal_(ref.bias)
    ours = ChannelsLastGroupNorm(groups, shape[1], affine=affine)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(shape) * 3 + 5  # an offset mean: the variance must not cancel
    want = ref(x)
    got = ours(x.contiguous(memory_format=torch.channels_last_3d))
    assert got.is_contiguous(memory_format=torch.channels_last_3d) and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours(x), want)  # NCDHW input: torch's own path


@pytest.mark.parametrize("kind", FAMILIES)
def test_channels_last_encoder_gives_the_same_latents(vae_dirs, kind):
    """The NDHWC encoder (refopt.channels_last_encoder, NDHWC input) matches the diffusers encode for
    every family (they run it compiled on GPUs: ref_channels_last)."""
    from taehv_launch.train.reference.refopt import ChannelsLastGroupNorm, channels_last_encoder

    frames = _frames(n=2)
    want = load_reference_vae(kind, vae_dirs[kind], "float32", "cpu").encode(frames)
    vae = load_reference_vae(kind, vae_dirs[kind], "float32", "cpu")
    channels_last_encoder(vae.model.encoder)
    vae.channels_last = True
    swapped = [m for m in vae.model.encoder.modules() if isinstance(m, ChannelsLastGroupNorm)]
    # torch's own GroupNorm only (H3's subclass keeps its forward and takes NCDHW copies)
    assert bool(swapped) == any(
        type(m) is nn.GroupNorm for m in load_reference_vae(kind, vae_dirs[kind]).model.encoder.modules()
    )
    torch.testing.assert_close(vae.encode(frames), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", FAMILIES)
def test_compile_reference_goes_channels_last_when_asked(vae_dirs, kind):
    from taehv_launch.train.loop.speed import compile_reference

    vae = load_reference_vae(kind, vae_dirs[kind], "float32", "cpu")
    compile_reference(vae, channels_last=True)  # wraps lazily: nothing compiles until a call
    assert vae.channels_last
    compile_reference(vae, channels_last=False)  # compiled again from the original module
    assert not hasattr(vae.model.encoder._orig_mod, "_orig_mod")
    off = load_reference_vae(kind, vae_dirs[kind], "float32", "cpu")
    compile_reference(off, channels_last=False)
    assert not off.channels_last


@pytest.mark.parametrize("kind", FAMILIES)
def test_replicate_time_padding_gives_the_same_latents(vae_dirs, kind):
    """CogVideoX's causal convs pad time with one replicate pad: bit-identical latents, also chained
    with the NDHWC encoder; the other families' convs are left alone."""
    from taehv_launch.train.reference.refopt import channels_last_encoder, replicate_time_padding

    frames = _frames(n=2)
    want = load_reference_vae(kind, vae_dirs[kind], "float32", "cpu").encode(frames)
    vae = load_reference_vae(kind, vae_dirs[kind], "float32", "cpu")
    changed = replicate_time_padding(vae.model.encoder)
    assert (changed > 0) == (kind == "cogvideox")
    assert torch.equal(vae.encode(frames), want)
    assert replicate_time_padding(vae.model.encoder) == 0  # once only
    channels_last_encoder(vae.model.encoder)
    vae.channels_last = True
    torch.testing.assert_close(vae.encode(frames), want, rtol=1e-4, atol=1e-4)
