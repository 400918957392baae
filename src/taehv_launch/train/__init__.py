"""The trainer `accelerate launch` runs: data -> refvae -> model -> seraena/losses -> loop -> checkpoint."""
