"""taehv-launch: train TAEHV by distilling a reference video VAE, from 1 CPU to 64 GPUs."""

__version__ = "0.1.0"
