"""What the launcher (run/) and the trainer (train/) share on disk, and nothing else: the run
directory's layout and per-node file names (layout.py), the checkpoint format with its COMPLETE /
checksum marker and trainer_state.json (checkpoint.py), the exit-status file the trainer leaves for
the launcher (exitstatus.py), the exported model's names (layout.py), and the signal the launcher relays
to the ranks (signals.py); records.py is the one declarative reader the record formats declare their
fields with, launchid.py the launch id every writer stamps on its record, launches.py which records are
the current launch's (status, diff). Stdlib only, importing nothing above errors.py and files.py: both sides
import it, neither imports the other.
"""
