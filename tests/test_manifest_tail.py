"""A manifest over the 16 MiB that is read of it (#35 item 8): the launcher numbers the next launch on
from the newest record of the tail it reads (was: the records counted in that tail, plus one)."""

from __future__ import annotations

import json

from conftest import clean_env
from taehv_launch.run.manifest import record_launch
from taehv_launch.run.render import render
from taehv_launch.run.request import Request, build_plan
from taehv_launch.rundir.manifest import manifest_path, read_manifest, read_manifest_state


def test_the_next_launch_of_a_huge_manifest_counts_on_from_its_newest_record(tmp_path):
    req = Request(gpus="1", profile="cpu", sets=[f"output_dir={str(tmp_path / 'output')!r}"])
    plan = build_plan(req, env=clean_env())
    rendered = render(plan, plan.run_dir)
    run = tmp_path / "run"
    run.mkdir()
    with open(manifest_path(run), "w") as f:
        for n in range(1, 6):
            f.write(json.dumps({"launch": n, **({"pad": "x" * (17 << 20)} if n == 2 else {})}) + "\n")
    record_launch(plan, rendered, run)
    assert [r["launch"] for r in read_manifest(run)] == [3, 4, 5, 6]  # the tail: launch 6 appended
    state = read_manifest_state(run)
    assert (state.launches, state.whole, state.why) == (6, False, None)
