"""`python -m taehv_launch.cli ARGS` is `taehv-launch ARGS`."""

from . import main

main()
