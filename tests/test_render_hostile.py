"""`taehv-launch render slurm|k8s` with hostile values in every field (#29): each render either
refuses in one line (exit 2, no traceback) or writes a file that runs exactly the user's command.

SLURM: the script passes `bash -n`, every #SBATCH line stays in the directive block, and the script,
run under a stand-in `srun` (records its argv) and `scontrol`, starts `taehv-launch` with exactly the
job's argv and executes nothing else (an injected `touch PWNED` would leave a file). Kubernetes: the
YAML loads to the intended objects (the container command is the job's argv, the image/claim/
namespace/mount are the given strings) and passes the API schema when kubernetes-validate is
installed. Both: the node's command, run with --dry-run --json, resolves the value the user gave."""

from __future__ import annotations

import json
import re
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import assert_one_line_error, clean_env, overrides, run_cli_here

from taehv_launch.plan.configfile import parse_set

HOSTILE = {
    "newline": "\ntouch PWNED #",
    "cr": "\rtouch PWNED",
    "nul": "\0x",
    "single quote": "'; touch PWNED; '",
    "double quote": '"; touch PWNED; "',
    "command substitution": "$(touch PWNED)",
    "backticks": "`touch PWNED`",
    "semicolon": ";touch PWNED",
    "hash": " #not a comment",
    "colon": ": x",
    "braces": "{a: b}",
    "sbatch directive": "\n#SBATCH --partition=evil",
    "yaml document": "\n---\nkind: Pod",
    "unicode": "é中😀",
    "unicode line breaks": "\u2028\x85\u2029x",
    "controls": "\x7f\x1b[31m\t\x9b",
    "backslash": "\\\n\\",
    "spaces": "  padded  ",
    "long": "x" * 3000,  # one name over 255 bytes: no file system takes it as a folder
    "long path": "/folder" * 400,  # 2800 characters in names of 6: a path Linux can open
    "not utf-8": "\udcff",
}
# fields whose value is quoted into the file: only a NUL byte, bytes that are not UTF-8 or (all of
# them are paths) a path no file system can hold may be refused
QUOTED = {"data_root": ("long",), "ref_vae_path": ("long",), "annotation_file": ("long",), "output_dir": ("long",)}
REFUSED_ANYWHERE = ("nul", "not utf-8")
IN_ARGV = ("data_root", "ref_vae_path", "annotation_file", "output_dir", "config", "run_name", "mount")
COMMON = ("data_root", "ref_vae_path", "annotation_file", "output_dir", "config", "job_name", "run_name")
FIELDS = {"slurm": (*COMMON, "partition", "account", "time"), "k8s": (*COMMON, "image", "pvc", "namespace", "mount")}
SRUN = """#!/bin/bash
# stand-in srun: its options, then the command's argv NUL-separated (no argv can hold a NUL)
while [[ "$1" == --* ]]; do shift; done
printf '%s\\0' "$@" > "$FAKE_OUT/argv"
"""
SCONTROL = '#!/bin/bash\necho "$@" >> "$FAKE_OUT/scontrol"\n'


def _request(kind: str, field: str, value: str, tmp: Path) -> tuple[list[str], dict]:
    """The render arguments with `value` in `field`, and what the job must then carry."""
    want = {
        "sets": {"data_root": "/d", "ref_vae_path": "/v"},
        "output_dir": "/shared/runs",
        "config": None,
        "mount": "/shared",
        "run_name": None,
    }
    opts: dict[str, str] = {}
    if field in ("data_root", "ref_vae_path", "annotation_file"):
        want["sets"][field] = "/x" + value
    elif field == "output_dir":
        want["output_dir"] = "/shared/o" + value
    elif field == "mount":
        want["mount"] = "/m" + value
        want["output_dir"] = want["mount"] + "/runs"
    elif field == "config":
        path = tmp / f"c{value}.py"
        try:
            path.write_text("args = {'max_train_steps': 7}\n")
        except (OSError, ValueError, UnicodeError):
            pass  # a name no file can have: render must still refuse it in one line
        want["config"] = str(path)
    elif field == "run_name":
        want["run_name"] = "r" + value
    else:
        opts[field] = {"time": "1" + value}.get(field, "a" + value)
    args = [kind, "16", "h100", "--output-dir", want["output_dir"]]
    if want["config"]:
        args += ["--config", want["config"]]
    for key, val in want["sets"].items():
        args += ["--set", f"{key}={val}"]
    if want["run_name"]:
        args += ["--run-name", want["run_name"]]
    if kind == "k8s":
        opts = {"image": "img:1", "pvc": "claim", "mount": want["mount"]} | opts
    for key, val in opts.items():
        args += [f"--{key.replace('_', '-')}", val]
    want["opts"], want["field"] = opts, field
    return args, want


def _argv_ok(argv: list[str], want: dict) -> None:
    """The node command is the user's request: every --set item as given, output_dir back exactly."""
    expect = ["taehv-launch", "16", "h100"] + (["--config", want["config"]] if want["config"] else [])
    for key, val in want["sets"].items():
        expect += ["--set", f"{key}={val}"]
    out_item = argv[len(expect) + 1]
    assert argv[len(expect)] == "--set" and parse_set(out_item) == ("output_dir", want["output_dir"]), argv
    expect += ["--set", out_item] + (["--run-name", want["run_name"]] if want["run_name"] else [])
    assert argv == expect + ["--resume", "this-run"]


def _node_plan(argv: list[str], env: dict[str, str]) -> dict:
    proc = run_cli_here(*argv[1:], "--dry-run", "--json", env=clean_env(**env))
    # the dry run checks the folders the launch reads, which are on the cluster, not here: it prints
    # the plan whole and then refuses (as the launch here would), in one line
    here = r"error: (data_root .* does not exist|reference VAE folder not found): "
    assert proc.returncode == 0 or (proc.returncode == 2 and re.match(here, proc.stderr)), proc.stderr
    return json.loads(proc.stdout)


def _plan_ok(plan: dict, want: dict) -> None:
    assert plan["config"]["output_dir"] == want["output_dir"]
    for key, val in want["sets"].items():
        assert plan["config"][key] == parse_set(f"{key}={val}")[1]  # --set strips the value, as render did
    if want["run_name"]:
        assert Path(plan["run_dir"]) == Path(want["output_dir"]) / want["run_name"]


def _check_slurm(text: str, want: dict, tmp: Path) -> None:
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    lines = text.split("\n")
    directives = [i for i, line in enumerate(lines) if line.startswith("#SBATCH ")]
    first_code = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert lines[0] == "#!/bin/bash" and all(line.startswith("# ") for line in lines[1 : directives[0]])
    assert directives == list(range(directives[0], directives[-1] + 1)) and directives[-1] < first_code
    assert not any(line.lstrip().startswith("#SBATCH") for line in lines[first_code:])  # no value makes a line
    for key, val in want["opts"].items():
        assert f"#SBATCH --{key}={val}" in lines
    work, out, bin_dir = tmp / "cwd", tmp / "out", tmp / "bin"
    for d in (work, out, bin_dir):
        d.mkdir()
    for name, body in (("srun", SRUN), ("scontrol", SCONTROL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    script = tmp / "job.sbatch"
    script.write_text(text)
    env = clean_env(
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        FAKE_OUT=str(out),
        SLURM_JOB_ID="4242",
        SLURM_JOB_NUM_NODES="2",
        SLURM_NNODES="2",
        SLURM_JOB_NODELIST="gpu[1-2]",
        SLURM_CPUS_ON_NODE="8",
        LC_ALL="C",
    )  # $'...' must mean the same bytes in any locale
    proc = subprocess.run(["bash", str(script)], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.startswith("taehv-launch: job 4242,") and proc.stdout.count("\n") == 1, proc.stdout
    assert list(work.iterdir()) == [] and sorted(p.name for p in out.iterdir()) == ["argv"]  # nothing else ran
    argv = (out / "argv").read_bytes().split(b"\0")[:-1]
    argv = [os.fsdecode(a) for a in argv]
    _argv_ok(argv, want)
    slurm_node = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NNODES": "2",
        "SLURM_NODEID": "0",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "gpu[1-2]",
        "MASTER_PORT": "24242",
    }
    if want["field"] in IN_ARGV:
        _plan_ok(_node_plan(argv, slurm_node), want)


def k8s_expand(text: str, env: dict[str, str]) -> str:
    """What Kubernetes makes of a command or env value: $(VAR) of a defined VAR is its value, $$ is $."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif (m := re.match(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", text[i:])) and m.group(1) in env:
            out.append(env[m.group(1)])
            i += m.end()
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _check_k8s(text: str, want: dict) -> None:
    head, _, body = text.partition("\napiVersion: v1\n")
    assert all(line.startswith("# ") for line in head.split("\n"))
    service, job = yaml.safe_load_all("apiVersion: v1\n" + body)
    assert (service["kind"], job["kind"]) == ("Service", "Job")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value", "") for e in container["env"]}
    env["JOB_UID"] = "0f1e2d3c-uid"
    env = {k: k8s_expand(v, env) for k, v in env.items()}
    command = [k8s_expand(a, env) for a in container["command"]]  # what the pod runs
    _argv_ok(command, want)
    (check,) = pod["initContainers"]
    assert k8s_expand(check["command"][check["command"].index("--output-dir") + 1], env) == want["output_dir"]
    opts = want["opts"]
    assert container["image"] == opts["image"]
    assert {v["name"]: v for v in pod["volumes"]}["shared"]["persistentVolumeClaim"] == {"claimName": opts["pvc"]}
    assert {m["name"]: m["mountPath"] for m in container["volumeMounts"]}["shared"] == opts["mount"]
    assert service["metadata"].get("namespace") == job["metadata"].get("namespace") == opts.get("namespace")
    try:
        import kubernetes_validate
    except ImportError:
        pass
    else:
        for doc in (service, job):
            kubernetes_validate.validate(doc, "1.37", strict=True)
    if want["field"] in ("mount", "run_name"):  # the other argv fields: the SLURM case runs the same argv
        _plan_ok(_node_plan(command, env | {"JOB_COMPLETION_INDEX": "0"}), want)


CASES = [(kind, field, name) for kind in FIELDS for field in FIELDS[kind] for name in HOSTILE]


@pytest.mark.parametrize("kind,field,name", CASES, ids=[f"{k}-{f}-{n.replace(' ', '_')}" for k, f, n in CASES])
def test_a_hostile_value_is_refused_in_one_line_or_carried_exactly(tmp_path, kind, field, name):
    value = HOSTILE[name]
    args, want = _request(kind, field, value, tmp_path)
    proc = run_cli_here("render", *args)
    if proc.returncode != 0:
        assert_one_line_error(proc, ".")
        if field in QUOTED:
            assert name in REFUSED_ANYWHERE + QUOTED[field], proc.stderr  # quoting works for everything else
        return
    assert proc.stderr == "" and "\0" not in proc.stdout
    proc.stdout.encode("utf-8")  # the file is text
    if kind == "slurm":
        _check_slurm(proc.stdout, want, tmp_path)
    else:
        _check_k8s(proc.stdout, want)


def test_the_reported_injection_is_inert(tmp_path):
    """The user's report: a newline in --set reached the header comment and ran `touch PWNED`."""
    args, want = _request("slurm", "data_root", HOSTILE["newline"], tmp_path)
    proc = run_cli_here("render", *args)
    assert proc.returncode == 0, proc.stderr
    assert "# Rendered by: taehv-launch render slurm" in proc.stdout and "\ntouch PWNED" not in proc.stdout
    _check_slurm(proc.stdout, want, tmp_path)
    k8s_args, want = _request("k8s", "data_root", HOSTILE["newline"], tmp_path)
    proc = run_cli_here("render", *k8s_args)
    assert proc.returncode == 0, proc.stderr
    _check_k8s(proc.stdout, want)


@pytest.mark.parametrize(
    "args,match",
    [
        (["--partition", "gpu\n#SBATCH --x"], r"--partition 'gpu\\n#SBATCH --x' cannot go on an #SBATCH line"),
        (["--account", "a b"], "--account 'a b' cannot go on an #SBATCH line"),
        (["--time", "1:00 #"], "--time '1:00 #' cannot go on an #SBATCH line"),
        (["--set", "data_root=/d\0x"], "contains a NUL byte, which no command line can carry"),
    ],
)
def test_refusals_name_the_option(args, match):
    base = ["render", "slurm", "16", "h100", "--output-dir", "/s", *overrides("data_root=/d ref_vae_path=/v")]
    assert_one_line_error(run_cli_here(*base, *args), match)


@pytest.mark.parametrize(
    "args,match",
    [
        (["--pvc", "My_Claim"], "--pvc 'My_Claim' is not a DNS subdomain"),
        (["--namespace", "ml\nx"], "--namespace 'ml\\\\nx' is not a DNS label"),
        (["--image", "img:1 --privileged"], "--image 'img:1 --privileged' is not an image reference"),
    ],
)
def test_k8s_names_are_checked(args, match):
    base = [
        "render",
        "k8s",
        "16",
        "h100",
        "--output-dir",
        "/shared/r",
        *overrides("data_root=/d ref_vae_path=/v"),
        "--image",
        "i",
        "--pvc",
        "c",
    ]
    assert_one_line_error(run_cli_here(*base, *args), match)
