"""The read-only side: `taehv-launch status` (status.py, its text statustext.py) and `taehv-launch diff`
(diff.py) read run directories, manifests and config files through rundir/ and never write. Beside
run/ (which writes the run directory and sends signals), never importing it: what diff needs of the
launcher (a plan resolved here and now) the command hands in.
"""
