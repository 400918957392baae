"""Model, the third stage of the trainer (data -> reference -> model -> loop -> durability): what is
trained and what it is trained against. `taehv` is the TAEHV student, `seraena` the adversarial
(Seraena) discriminator, `losses` the distillation losses and metrics, and `ema` the moving average
of the student's weights. No imports here, so nothing heavy loads before a submodule is asked for."""
