"""Durability, the last stage of the trainer (data -> reference -> model -> loop -> durability): make a
run survive stops and failures. `checkpoint` writes and reads checkpoints and the export, `portable`
a world-size-free copy of the model and AdamW state (resume on any layout), `stop` handles stop
signals, `watchdog` takes the job down when one rank dies, and `status` writes the exit status the
launcher reads. No imports here, so nothing heavy loads before a submodule is asked for."""
