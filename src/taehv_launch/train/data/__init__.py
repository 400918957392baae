"""Data, the first stage of the trainer (data -> reference -> model -> loop -> durability): turn the
video index into training clips. `clips` plans frames and crops and decodes them in DataLoader
workers, `decode` reads frames with OpenCV, `nvdec` decodes on the GPU instead (a DecodeStage in the
main process), `cached` trains from the latent cache (cached reference latents), and `synthetic`
makes the demo videos and the tiny reference VAE of `taehv-launch 1 cpu`. No imports here, so
nothing heavy loads before a submodule is asked for."""
