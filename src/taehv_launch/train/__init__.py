"""The trainer `accelerate launch` runs (main.py): data -> reference -> model -> loop -> durability, one subpackage each."""
