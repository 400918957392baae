"""Facts about this machine that the launch and validate-env both need (one probe each)."""

from __future__ import annotations

import socket


def port_free(port: int) -> bool:
    """Whether a rendezvous server could listen on `port` here now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def visible_gpus() -> int:
    """CUDA devices this process can use (CUDA_VISIBLE_DEVICES applied); imports torch."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
