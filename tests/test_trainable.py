"""What is trained (#37): the parts of TAEHV a configuration gives no gradient are frozen, never left to DDP.

plan/trainable.py decides from the config alone (freeze_encoder, use_ref_vae, the three loss weights,
use_seraena); the dry run prints it; DistillNet freezes those parts before accelerate.prepare. The fast
tests check the decision, the refusals and the freezing on a small TAEHV; the slow ones run the real
launcher and trainer on 2 CPU ranks (DDP over gloo): decoder only with its encoder bit-identical through
a resume, and every combination of the loss weights and use_ref_vae that the plan accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import assert_one_line_error, clean_env, overrides, run_cli_here
from trainrun import launch, ok, trainer_state
from taehv_launch.errors import ConfigError
from taehv_launch.plan.schema import DEFAULTS
from taehv_launch.plan.trainable import check_trains_something, trained_parts

WEIGHTS = ("encoder_loss_weight", "reconstruction_loss_weight", "seraena_loss_weight")
# (use_ref_vae, encoder, reconstruction, seraena weights): every combination of each weight 0 or not
COMBOS = [(ref, e, r, s) for ref in (True, False) for e in (0, 1) for r in (0, 1) for s in (0, 0.3)]


def config(ref=True, enc=1.0, rec=1.0, ser=0.3, **over):
    return {**DEFAULTS, "use_ref_vae": ref, **dict(zip(WEIGHTS, (enc, rec, ser))), **over}


def expected(ref, enc, rec, ser, freeze=False, seraena=True) -> tuple[bool, bool]:
    """(encoder trained, decoder trained), written out from the losses' paths in DistillNet and the trainer."""
    return (ref and enc > 0 and not freeze), (rec > 0 or (seraena and ser > 0))


def plan_accepts(ref, enc, rec, ser) -> bool:
    """use_ref_vae=False with an encoder weight is refused (no target); so is training nothing."""
    return (ref or enc == 0) and any(expected(ref, enc, rec, ser))


def sets(ref, enc, rec, ser) -> list[str]:
    out = ["--set", f"use_ref_vae={ref}"]
    for k, v in zip(WEIGHTS, (enc, rec, ser)):
        out += ["--set", f"{k}={v}"]
    return out


def combo_id(c) -> str:
    ref, enc, rec, ser = c
    return f"{'ref' if ref else 'noref'}-enc{enc}-rec{rec}-ser{ser}"


# ---------------------------------------------------------------------------- the decision (pure)
@pytest.mark.parametrize("freeze", [False, True])
@pytest.mark.parametrize("seraena", [True, False])
@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
def test_the_trained_parts_follow_the_loss_weights(combo, seraena, freeze):
    ref, enc, rec, ser = combo
    t = trained_parts(config(ref, enc, rec, ser, use_seraena=seraena, freeze_encoder=freeze))
    assert (not t.encoder, not t.decoder) == expected(ref, enc, rec, ser, freeze, seraena)
    assert t.anything == any(expected(ref, enc, rec, ser, freeze, seraena))
    if not t.anything:
        with pytest.raises(ConfigError, match="^this config trains nothing: the encoder is frozen"):
            check_trains_something(config(ref, enc, rec, ser, use_seraena=seraena, freeze_encoder=freeze))


def test_the_trains_line_names_parts_reasons_and_losses():
    assert trained_parts(config()).line() == (
        "encoder and decoder; losses: encoder MSE x1, reconstruction MSE x1, Seraena x0.3"
    )
    assert trained_parts(config(freeze_encoder=True, reconstruction_loss="l1")).line() == (
        "decoder only (encoder frozen: freeze_encoder=True); losses: reconstruction L1 x1, Seraena x0.3"
    )
    assert trained_parts(config(ref=False, enc=0)).line() == (
        "decoder only (encoder frozen: use_ref_vae=False gives it no target); losses: reconstruction MSE x1, "
        "Seraena x0.3"
    )
    assert trained_parts(config(rec=0, use_seraena=False)).line() == (
        "encoder only (decoder frozen: reconstruction_loss_weight=0, use_seraena=False); losses: encoder MSE x1"
    )
    assert trained_parts(config(enc=0, ser=0)).line() == (
        "decoder only (encoder frozen: encoder_loss_weight=0); losses: reconstruction MSE x1"
    )


# ---------------------------------------------------------------------------- the plan
@pytest.mark.parametrize("combo", COMBOS, ids=combo_id)
def test_the_plan_accepts_or_refuses_each_combination_in_one_line(combo, tmp_path):
    ref, enc, rec, ser = combo
    proc = run_cli_here("2", "cpu", "--dry-run", *sets(*combo), env=clean_env(), cwd=tmp_path)
    if plan_accepts(*combo):
        assert proc.returncode == 0, proc.stderr
        assert f"  trains    {trained_parts(config(*combo)).line()}\n" in proc.stdout
    elif not ref and enc:
        assert_one_line_error(proc, r"use_ref_vae=False leaves the encoder without a target")
    else:
        why = "encoder_loss_weight=0" if ref else "use_ref_vae=False gives it no target"
        assert_one_line_error(
            proc,
            rf"^error: this config trains nothing: the encoder is frozen \({why}\) and the decoder has no loss "
            r"\(reconstruction_loss_weight=0, seraena_loss_weight=0\): give reconstruction_loss_weight a value above 0",
        )


@pytest.mark.parametrize(
    "args, match",
    [
        (["--set", "seraena_loss_weight=-1"], r"^error: seraena_loss_weight=-1 must not be negative \(0 = off\)$"),
        (["--set", "reconstruction_loss=l2"], r"reconstruction_loss='l2' .* is not one of mse, l1"),
        (["--set", "freeze_encoder=maybe"], r"freeze_encoder"),
        (
            overrides("freeze_encoder=True reconstruction_loss_weight=0 use_seraena=False"),
            r"the encoder is frozen \(freeze_encoder=True\) and the decoder has no loss \(reconstruction_loss_weight=0, "
            r"use_seraena=False\)",
        ),
    ],
)
def test_bad_values_are_one_line_and_exit_2(args, match, tmp_path):
    proc = run_cli_here("1", "cpu", "--dry-run", *args, env=clean_env(), cwd=tmp_path)
    assert_one_line_error(proc, match)


def test_the_json_plan_says_what_is_trained(tmp_path):
    args = overrides("freeze_encoder=True reconstruction_loss=l1")
    proc = run_cli_here("2", "cpu", "--dry-run", "--json", *args, env=clean_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["trained"] == {
        "encoder": False,
        "decoder": True,
        "encoder_frozen_by": "freeze_encoder=True",
        "decoder_frozen_by": "",
        "losses": ["reconstruction L1 x1", "Seraena x0.3"],
    }
    assert doc["config"]["freeze_encoder"] is True and doc["config"]["reconstruction_loss"] == "l1"


# ---------------------------------------------------------------------------- the model
def small_net(**over):
    from taehv_launch.plan.families import FAMILIES
    from taehv_launch.train.model.losses import DistillNet
    from taehv_launch.train.model.taehv import TAEHV

    torch.manual_seed(0)
    return DistillNet(TAEHV(latent_channels=4), FAMILIES["cogvideox"], trained_parts(config(**over)))


def grads(net) -> tuple[bool, bool]:
    """(some encoder parameter got a gradient, some decoder parameter did)."""
    return tuple(
        any(p.grad is not None for p in getattr(net.taehv, part).parameters()) for part in ("encoder", "decoder")
    )


def test_distillnet_freezes_a_part_before_the_wrap_and_only_the_trained_part_gets_gradients(one_thread):
    from taehv_launch.train.model.losses import reconstruction_loss

    frames, latents = torch.rand(1, 12, 3, 16, 16), torch.randn(1, 3, 4, 2, 2)
    net = small_net(freeze_encoder=True)
    assert not any(p.requires_grad for p in net.taehv.encoder.parameters())
    assert all(p.requires_grad for p in net.taehv.decoder.parameters())
    enc, dec = net(frames, latents)
    assert enc is None  # with reference latents a frozen encoder is not run
    reconstruction_loss(dec, frames[:, : dec.shape[1]], "l1").backward()
    assert grads(net) == (False, True)

    net = small_net(ref=False, enc=0)  # use_ref_vae=False: the decoder decodes TAEHV's own encodings, detached
    enc, dec = net(frames, None)
    assert enc is not None and not enc.requires_grad
    reconstruction_loss(dec, frames[:, : dec.shape[1]], "mse").backward()
    assert grads(net) == (False, True)

    net = small_net(rec=0, ser=0)  # encoder only: the decoder runs (its loss is logged) but is frozen
    enc, dec = net(frames, latents)
    assert not dec.requires_grad
    torch.nn.functional.mse_loss(enc, latents).backward()
    assert grads(net) == (True, False)


def test_the_reconstruction_loss_choice():
    from taehv_launch.train.model.losses import reconstruction_loss

    a, b = torch.zeros(2, 3), torch.full((2, 3), 0.5)
    assert reconstruction_loss(a, b, "mse").item() == pytest.approx(0.25)
    assert reconstruction_loss(a, b, "l1").item() == pytest.approx(0.5)


# ---------------------------------------------------------------------------- real runs on 2 ranks
@pytest.fixture(scope="module")
def start_weights(tmp_path_factory) -> Path:
    """A TAEHV of the cpu profile's shape, seeded, saved as a state dict: every run below starts from it."""
    from taehv_launch.train.model.taehv import build_taehv

    tmp = tmp_path_factory.mktemp("start")
    proc = run_cli_here("2", "cpu", "--dry-run", "--json", env=clean_env(), cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    torch.manual_seed(1234)
    path = tmp / "start.pth"
    torch.save(build_taehv(json.loads(proc.stdout)["config"]).state_dict(), path)
    return path


def split(sd: dict[str, torch.Tensor], prefix: str = "") -> dict[str, dict[str, torch.Tensor]]:
    """{part: {key: tensor}} of a TAEHV state dict (keys under `prefix`, e.g. "taehv." in model.safetensors)."""
    out: dict[str, dict[str, torch.Tensor]] = {"encoder": {}, "decoder": {}}
    for k, v in sd.items():
        part = k.removeprefix(prefix).split(".")[0]
        if k.startswith(prefix) and part in out:
            out[part][k.removeprefix(prefix)] = v
    return out


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    assert a.keys() == b.keys() and a
    return all(torch.equal(a[k], b[k].to(a[k].dtype)) for k in a)


def check_parts(run: Path, ckpt: str, start: Path, enc_trained: bool, dec_trained: bool) -> None:
    """A frozen part is bit-identical to the start in the export, the checkpoint's weights and its EMA; a
    trained one has moved; AdamW holds moments for the trained parts only."""
    from safetensors.torch import load_file

    begin = split(torch.load(start, weights_only=True))
    exports = sorted((run / "final_model").glob("*.safetensors"))
    assert exports, list((run / "final_model").iterdir())
    held = {
        "export": split(load_file(exports[0])),
        "EMA": split(load_file(run / ckpt / "ema.safetensors")),
        "weights": split(load_file(run / ckpt / "model.safetensors"), "taehv."),
    }
    for where, parts in held.items():
        for part, trained in (("encoder", enc_trained), ("decoder", dec_trained)):
            assert same(begin[part], parts[part]) != trained, (where, part, trained)
    moments = load_file(run / ckpt / "optimizer.safetensors")
    for part, trained in (("encoder", enc_trained), ("decoder", dec_trained)):
        assert any(k.startswith(f"exp_avg/taehv.{part}.") for k in moments) == trained, part


TINY = overrides("max_train_steps=3 validation_steps=1000 checkpointing_steps=1000")


@pytest.mark.slow
def test_decoder_only_on_two_ranks_keeps_the_encoder_bit_identical_through_a_resume(tmp_path, start_weights):
    env = clean_env(TAEHV_CACHE=str(tmp_path.parent / "taehv-cache"), OMP_NUM_THREADS="1")
    args = overrides(
        "freeze_encoder=True reconstruction_loss=l1",
        f"pretrained_model_path='{start_weights}'",
        "dataloader_num_workers=1",  # the cpu profile's
        "checkpointing_steps=2",
    )
    proc, run = launch(tmp_path, 2, *args, "--set", "max_train_steps=3", env=env, run_name="dec")
    ok(proc)
    line = "decoder only (encoder frozen: freeze_encoder=True); losses: reconstruction L1 x1, Seraena x0.3"
    assert f"  trains    {line}" in proc.stdout  # the plan
    assert f"parameters: {line}; processes 2, DDP" in proc.stdout  # the trainer
    check_parts(run, "checkpoint-3", start_weights, enc_trained=False, dec_trained=True)

    proc, _ = launch(tmp_path, 2, *args, "--resume", "auto", "--set", "max_train_steps=4", env=env, run_name="dec")
    ok(proc)
    assert trainer_state(run / "checkpoint-4")["step"] == 4
    check_parts(run, "checkpoint-4", start_weights, enc_trained=False, dec_trained=True)

    # the encoder cannot be unfrozen on a resume: its checkpoint holds no AdamW state for it (a new run can start
    # from its weights); one line, nothing lost
    proc, _ = launch(tmp_path, 2, *args[4:], "--resume", "auto", "--set", "max_train_steps=5", env=env, run_name="dec")
    assert proc.returncode == 2, proc.stderr[-3000:]
    first = proc.stderr.splitlines()[0]
    assert first.startswith(f"error: checkpoint {run / 'checkpoint-4'} does not fit this model (it holds no optimizer ")
    assert f"--set pretrained_model_path={run / 'checkpoint-4' / 'ema.safetensors'}" in first
    assert "Traceback" not in proc.stderr
    assert (run / "checkpoint-4" / "COMPLETE").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("combo", [c for c in COMBOS if plan_accepts(*c)], ids=combo_id)
def test_every_accepted_loss_weight_combination_trains_on_two_ranks(combo, tmp_path, start_weights):
    """Each combination the plan accepts: 3 DDP steps on 2 processes, no unused-parameter stop, and the parts
    it freezes come out bit-identical to the start."""
    env = clean_env(TAEHV_CACHE=str(tmp_path.parent / "taehv-cache"), OMP_NUM_THREADS="1")
    pretrained = ["--set", f"pretrained_model_path='{start_weights}'"]
    proc, run = launch(tmp_path, 2, *sets(*combo), *pretrained, *TINY, env=env, run_name="m")
    ok(proc)
    assert f"  trains    {trained_parts(config(*combo)).line()}" in proc.stdout
    check_parts(run, "checkpoint-3", start_weights, *expected(*combo))
