"""`taehv-launch eval WEIGHTS... --data-root DIR`: TAEHV weight files side by side on the same held-out
clips (quality/): PSNR, SSIM, LPIPS (when available), flicker and decode frames/s."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from .core import app, exit_with
from .options import JsonOpt


@app.command(
    "eval",
    help="Measure TAEHV weights side by side on the held-out clips of a data root: our exports, "
    "checkpoint-N folders and upstream's .pth/.safetensors (the decoder on the reference VAE's latents "
    "with --ref-vae-path, and end to end).",
)
def eval_cmd(
    weights: Annotated[list[str], typer.Argument(help="weight files, export folders or checkpoint-N folders")],
    data_root: Annotated[str, typer.Option("--data-root", help="a folder of videos")],
    profile: Annotated[str, typer.Option("--profile", help="take the clip size from this profile")] = "h100",
    height: Annotated[Optional[int], typer.Option("--height", help="clip height (default: the profile's)")] = None,
    width: Annotated[Optional[int], typer.Option("--width", help="clip width (default: the profile's)")] = None,
    n_frames: Annotated[
        Optional[int], typer.Option("--n-frames", help="frames per clip (default: the family's)")
    ] = None,
    max_clips: Annotated[int, typer.Option("--max-clips", help="held-out clips to measure at most")] = 8,
    family: Annotated[
        Optional[str], typer.Option("--family", help="the weights' family (default: from the file)")
    ] = None,
    decoder_arch: Annotated[
        Optional[str], typer.Option("--decoder-arch", help="base or super (default: from the file)")
    ] = None,
    ref_vae_path: Annotated[
        str, typer.Option("--ref-vae-path", help="the reference VAE's diffusers folder (else end to end only)")
    ] = "",
    validation_fraction: Annotated[
        float, typer.Option("--validation-fraction", help="the run's validation_fraction (the held-out split)")
    ] = 0.05,
    seed: Annotated[int, typer.Option("--seed", help="the run's seed (the held-out split)")] = 42,
    device: Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N")] = "auto",
    as_json: JsonOpt = False,
) -> None:
    def go() -> int:
        from ..errors import ConfigError
        from ..plan.profiles import get_profile

        cfg = get_profile(profile).config
        h, w = height or cfg.get("height", 480), width or cfg.get("width", 720)
        if h <= 0 or w <= 0 or (n_frames is not None and n_frames <= 0) or max_clips <= 0:
            raise ConfigError("--height, --width, --n-frames and --max-clips must be positive")
        if decoder_arch not in (None, "base", "super"):
            raise ConfigError(f"--decoder-arch takes base or super, not {decoder_arch!r}")
        from ..quality.measure import Options, run

        return run(
            Options(
                weights=list(weights),
                data_root=data_root,
                height=h,
                width=w,
                n_frames=n_frames,
                max_clips=max_clips,
                family=family,
                decoder_arch=decoder_arch,
                ref_vae_path=ref_vae_path,
                validation_fraction=validation_fraction,
                seed=seed,
                device=device,
                as_json=as_json,
            )
        )

    exit_with(go)
