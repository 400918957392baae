"""Reference, the second stage of the trainer (data -> reference -> model -> loop -> durability): the
frozen diffusers VAE the student distils from. `refvae` loads it and checks it against the model
family and `refopt` speeds up its encoder without changing its numbers. The latent cache job that
encodes every clip once with it (`taehv-launch cache`) is a program of its own, train/cachejob.py,
beside main.py. No imports here, so nothing heavy loads before a submodule is asked for."""
