"""What a run trains, decided from its config alone: pure, so the dry run and the trainer say the same.

TAEHV has two parts, and each learns only from some of the losses (train/loop/trainer.py):
- the encoder, from the encoder loss (its encodings against the reference latents): only with
  use_ref_vae (without it there is no target), encoder_loss_weight > 0 and not freeze_encoder;
- the decoder, which decodes the reference latents (with use_ref_vae=False, TAEHV's own encodings,
  detached), from the reconstruction loss (reconstruction_loss_weight > 0) and Seraena's
  (use_seraena and seraena_loss_weight > 0).
A part that gets no gradient is frozen before the model is wrapped (requires_grad False, left out of
the optimizer and so of DDP's gradient reduction): DDP stops at the next step on a parameter that
took part in no loss ("Expected to have finished reduction in the prior iteration"), and AdamW's
weight decay would shrink a part whose gradient is zero. A config that trains neither part is
refused in one line (check_trains_something).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError


def _get(c: Any, key: str) -> Any:
    return c[key] if isinstance(c, Mapping) else getattr(c, key)


@dataclass(frozen=True)
class Trained:
    encoder: str  # "" when trained, else why it is frozen (the keys that freeze it)
    decoder: str
    losses: tuple[str, ...]  # the losses that reach a trained part, with their weights

    @property
    def anything(self) -> bool:
        return not (self.encoder and self.decoder)

    def parts(self) -> str:
        if not self.encoder and not self.decoder:
            return "encoder and decoder"
        if not self.anything:
            return "nothing"
        return "decoder only" if self.encoder else "encoder only"

    def line(self) -> str:
        """The dry run's `trains` line, e.g. `decoder only (encoder frozen: freeze_encoder=True); losses:
        reconstruction L1 x1, Seraena x0.3`."""
        frozen = [
            f"{name} frozen: {why}" for name, why in (("encoder", self.encoder), ("decoder", self.decoder)) if why
        ]
        return (
            self.parts()
            + (f" ({'; '.join(frozen)})" if frozen else "")
            + (f"; losses: {', '.join(self.losses)}" if self.losses else "")
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "encoder": not self.encoder,
            "decoder": not self.decoder,
            "encoder_frozen_by": self.encoder,
            "decoder_frozen_by": self.decoder,
            "losses": list(self.losses),
        }


def trained_parts(c: Any) -> Trained:
    """Which of TAEHV's parts can get a gradient in config `c` (the plan's dict or the trainer's Config)."""
    enc_w, rec_w, ser_w = (float(_get(c, f"{k}_loss_weight")) for k in ("encoder", "reconstruction", "seraena"))
    seraena = bool(_get(c, "use_seraena"))
    if _get(c, "freeze_encoder"):
        enc_why = "freeze_encoder=True"
    elif not _get(c, "use_ref_vae"):
        enc_why = "use_ref_vae=False gives it no target"
    elif enc_w <= 0:
        enc_why = "encoder_loss_weight=0"
    else:
        enc_why = ""
    dec_why = ""
    if not (rec_w > 0 or (seraena and ser_w > 0)):
        dec_why = f"reconstruction_loss_weight=0, {'seraena_loss_weight=0' if seraena else 'use_seraena=False'}"
    losses = []
    if not enc_why:
        losses.append(f"encoder MSE x{enc_w:g}")
    if not dec_why and rec_w > 0:
        losses.append(f"reconstruction {str(_get(c, 'reconstruction_loss')).upper()} x{rec_w:g}")
    if not dec_why and seraena and ser_w > 0:
        losses.append(f"Seraena x{ser_w:g}")
    return Trained(encoder=enc_why, decoder=dec_why, losses=tuple(losses))


def check_trains_something(c: Any) -> Trained:
    """ConfigError in one line for a negative loss weight, or when no part of TAEHV would get a gradient;
    else what is trained."""
    for k in ("reconstruction_loss_weight", "encoder_loss_weight", "seraena_loss_weight"):
        if not float(_get(c, k)) >= 0:
            raise ConfigError(f"{k}={float(_get(c, k)):g} must not be negative (0 = off)")
    t = trained_parts(c)
    if not t.anything:
        raise ConfigError(
            f"this config trains nothing: the encoder is frozen ({t.encoder}) and the decoder has no loss "
            f"({t.decoder}): give reconstruction_loss_weight a value above 0 (e.g. --set reconstruction_loss_weight=1)"
        )
    return t
