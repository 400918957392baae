"""`taehv-launch bench`: measurements side by side in one run.

step.py     one training step and the reference encode at several micro-batches
compare.py  the naive notebook-style pipeline vs our real trainer, with every lever on its own row
loader.py   the data loader's clips/s per decoder and worker count
"""
