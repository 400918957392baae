"""Reference, the second stage of the trainer (data -> reference -> model -> loop -> durability): the
frozen diffusers VAE the student distils from. `refvae` loads it and checks it against the model
family, `refopt` speeds up its encoder without changing its numbers, and `cachejob` is the latent
cache job (`taehv-launch cache`) that encodes every clip once with it. No imports here, so nothing
heavy loads before a submodule is asked for."""
