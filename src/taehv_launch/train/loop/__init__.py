"""Loop, the fourth stage of the trainer (data -> reference -> model -> loop -> durability): put the
pieces together and step. `build` makes the Accelerator, datasets, loaders and models, `trainer`
runs the training loop, `speed` holds what makes a GPU step fast (compilation, batch prefetch, lazy
scalars), `timing` the --profile phase table and speed.json, and `evaluate` the validation pass. No
imports here, so nothing heavy loads before a submodule is asked for."""
