"""Whether PyNvVideoCodec and a CUDA device are here, and which PyNvVideoCodec (moved out of nvdec.py, which
re-exports both)."""

from __future__ import annotations

import torch


def nvdec_available() -> str:
    """'' when PyNvVideoCodec imports and a CUDA device is visible, else why not (one phrase)."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    try:
        import PyNvVideoCodec  # noqa: F401
    except Exception as err:  # ImportError, or its native library failing to load
        return f"PyNvVideoCodec is not installed ({type(err).__name__}): pip install 'taehv-launch[nvdec]'"
    return ""


def nvdec_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("PyNvVideoCodec")
    except PackageNotFoundError:
        return "unknown"
