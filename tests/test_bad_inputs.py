"""Bad inputs, end to end: every one is ONE `error:` line on stderr, exit 2, no traceback, nothing lost.

Each case runs the real CLI as a subprocess on the `cpu` profile (a few on GPU profiles, which
must fail before anything starts). Every case starts from an output folder that already holds
a run (`output/old`, with checkpoints, and `output/latest -> old`); afterwards that run is
byte-for-byte and mtime-for-mtime the same. Cases the launcher catches must also leave the
output folder exactly as it was; cases that aim at the old run (`--run-name old`: config-file
and resume errors) show that a failed relaunch of a run touches none of it.

Cases caught inside the trainer (data, reference VAE, TAEHV weights) start `accelerate
launch` (~10 s each): they run together, a few at a time, in one module fixture, and each is
still its own test.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from conftest import CLI, assert_one_line_error, clean_env, free_port, overrides, run_cli, run_cli_here
from conftest import testdata_videos as videos_dir  # (not collected as a test)

# Nothing may train for long: one step, no worker processes.
FAST = overrides(
    "max_train_steps=1 dataloader_num_workers=0 log_every=1 validation_steps=1",
    "max_validation_batches=1 checkpointing_steps=1",
)


# --- what "nothing lost" means ----------------------------------------------------------------


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under root (root included): kind, content or link target, and mtime in ns."""
    out: dict[str, tuple] = {}
    if not root.exists() and not root.is_symlink():
        return out
    for path in [root, *sorted(root.rglob("*"))]:
        st = path.lstat()
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path), st.st_mtime_ns)
        elif path.is_dir():
            out[rel] = ("dir", st.st_mtime_ns)
        else:
            out[rel] = ("file", path.read_bytes(), st.st_mtime_ns)
    return out


def make_old_run(output: Path) -> None:
    """output/old: a run with a complete checkpoint-3 and an interrupted checkpoint-5; latest -> old."""
    run = output / "old"
    (run / "checkpoint-3").mkdir(parents=True)
    (run / "checkpoint-3" / "trainer_state.json").write_text(json.dumps({"step": 3}))
    (run / "checkpoint-3" / "model.safetensors").write_bytes(b"\0" * 64)
    (run / "checkpoint-3" / "COMPLETE").write_text(json.dumps({"files": ["trainer_state.json", "model.safetensors"]}))
    (run / "checkpoint-5").mkdir()
    (run / "checkpoint-5" / "trainer_state.json").write_text(json.dumps({"step": 5}))  # no COMPLETE: interrupted
    (run / "config.py").write_text("# the config of the old run\n")
    (run / "launch.log").write_text("old log\n")
    (run / "logs").mkdir()
    (run / "logs" / "events.out.tfevents.1").write_bytes(b"events")
    os.symlink("old", output / "latest")
    past = 1_600_000_000_000_000_000  # mtimes in 2020: a rewrite of the same bytes still shows
    for p in sorted(run.rglob("*"), reverse=True) + [run]:
        os.utime(p, ns=(past, past))


# --- the table --------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Case:
    id: str
    argv: tuple[str, ...]  # GPUS PROFILE [options]; {tmp} and {cache} are filled in
    match: str  # regex the one error line must match
    env: dict[str, str] = field(default_factory=dict)
    setup: Callable[[Path], None] | None = None
    run_name: str = "t"  # "old": relaunch the existing run
    code: int = 2
    slow: bool = False  # extra trainer cases: run with -m slow


def _safetensors_header(shapes: dict[str, list[int]]) -> bytes:
    """A .safetensors file's header naming these tensors (no data follows: the launcher reads only the header)."""
    import json
    import struct

    head = json.dumps({k: {"dtype": "F32", "shape": v, "data_offsets": [0, 0]} for k, v in shapes.items()}).encode()
    return struct.pack("<Q", len(head)) + head


def _write(rel: str, text: str | bytes) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        path = tmp / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)

    return setup


def _mkdir(*rels: str) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        for rel in rels:
            (tmp / rel).mkdir(parents=True, exist_ok=True)

    return setup


def _damaged_ckpt(tmp: Path) -> None:
    """output/old/checkpoint-9: written by 2 ranks with ZeRO-2 (so a 1-rank resume reads the
    world-size-free state), complete, but its safetensors files are garbage."""
    ck = tmp / "output" / "old" / "checkpoint-9"
    ck.mkdir(parents=True)
    (ck / "trainer_state.json").write_text(json.dumps({"step": 9, "world_size": 2, "zero_stage": 2}))
    files = ["trainer_state.json"]
    for name in ("model.safetensors", "optimizer.safetensors", "ema.safetensors"):
        (ck / name).write_bytes(b"\x08\0\0\0\0\0\0\0{}garbage")
        files.append(name)
    (ck / "COMPLETE").write_text(json.dumps({"step": 9, "files": files}))


def _broken_videos(tmp: Path) -> None:
    folder = tmp / "broken"
    folder.mkdir()
    for name in ("empty.webm", "test_video.mp4"):  # 0 bytes; 1x1 pixels
        shutil.copy(videos_dir() / name, folder / name)


def _demo_vae(tmp: Path) -> None:
    """The cpu profile's tiny 4-channel reference VAE in the shared cache (normally already built by then)."""
    if not (cache_dir(tmp) / "demo" / "ref_vae" / "cogvideox_c4").is_dir():
        code = "import sys; from taehv_launch.train.data.synthetic import ensure_demo_assets; ensure_demo_assets(sys.argv[1])"
        subprocess.run([sys.executable, "-c", code, str(cache_dir(tmp) / "demo")], check=True, env=clean_env())


def _annotated(doc) -> Callable[[Path], None]:
    def setup(tmp: Path) -> None:
        (tmp / "videos").mkdir()
        (tmp / "ann.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))

    return setup


# Caught by the launcher before anything is written or started.
LAUNCHER_CASES = [
    # GPU counts and profiles
    Case("gpus-0", ("0", "cpu"), r"GPU count must be at least 1, got 0"),
    Case("gpus-negative", ("--", "-1", "cpu"), r"GPU count must be at least 1, got -1"),  # as typed: see below
    Case("gpus-word", ("eight", "cpu"), r"GPU count must be a whole number.*'eight'"),
    Case("gpus-3-cpu", ("3", "cpu"), r"profile 'cpu' supports at most 2 processes, got 3"),
    Case("gpus-12-h100", ("12", "h100"), r"12 GPUs are more than one node of 8.*8 or 16 GPUs"),
    Case("unknown-profile", ("1", "cpux"), r"unknown profile 'cpux': choose one of .*cpu"),
    # the scheduler's environment contradicts the request
    Case(
        "world-size-2-for-8-h100",
        ("8", "h100"),
        r"8 GPUs cannot be split over 2 nodes \(WORLD_SIZE=2\).*16 h100",
        env={"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "10.0.0.1"},
    ),
    Case("world-size-without-rank", ("1", "cpu"), r"WORLD_SIZE=2 is set but RANK is not", env={"WORLD_SIZE": "2"}),
    Case(
        "slurm-nnodes-not-int",
        ("1", "cpu"),
        r"SLURM_NNODES='two' is not an integer",
        env={"SLURM_NNODES": "two", "SLURM_NODEID": "0", "SLURM_JOB_ID": "7"},
    ),
    Case(
        "slurm-nodeid-negative",
        ("16", "h100"),
        r"SLURM_NODEID='-1' must be at least 0",
        env={"SLURM_NNODES": "2", "SLURM_NODEID": "-1", "SLURM_JOB_NODELIST": "gpu[1-2]"},
    ),
    Case(
        "slurm-tasks-per-node",
        ("1", "cpu"),
        r"srun started 8 tasks on 1 nodes.*--ntasks-per-node=1",
        env={"SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_NUM_NODES": "1", "SLURM_NODEID": "0"},
    ),
    Case("under-torchrun", ("1", "cpu"), r"running under torchrun.*LOCAL_RANK=0", env={"LOCAL_RANK": "0"}),
    Case("master-port-env-not-a-port", ("1", "cpu"), r"MASTER_PORT=70000 is not a port", env={"MASTER_PORT": "70000"}),
    # --set
    Case("set-typo", ("1", "cpu", "--set", "learnig_rate=1e-4"), r"unknown config key 'learnig_rate'.*learning_rate"),
    Case("set-string-for-int", ("1", "cpu", "--set", "height='64'"), r"height must be int, got str '64'"),
    Case("set-float-for-int", ("1", "cpu", "--set", "max_train_steps=1.5"), r"max_train_steps must be int, got float"),
    Case("set-word-for-bool", ("1", "cpu", "--set", "use_seraena=yes"), r"use_seraena must be bool, got str 'yes'"),
    Case("set-bad-choice", ("1", "cpu", "--set", "ref_vae_type=sdxl"), r"ref_vae_type='sdxl'.*not one of cogvideox"),
    Case(
        "set-n-frames-13",
        ("1", "cpu", "--set", "n_frames=13"),
        r"n_frames=13 does not fit ref_vae_type=cogvideox: .*use 12, 24 or 36",
    ),
    Case(
        "set-height-not-multiple-of-8",
        ("1", "cpu", "--set", "height=60"),
        r"height=60 must be a positive multiple of 8",
    ),
    Case("set-not-key-value", ("1", "cpu", "--set", "n_frames"), r"--set 'n_frames' is not KEY=VALUE"),
    # config files (relaunching the old run: it must stay as it was)
    Case(
        "config-unknown-key",
        ("1", "cpu", "--config", "{tmp}/c.py"),
        r"c\.py: unknown config key 'learnig_rate'",
        setup=_write("c.py", "from easydict import EasyDict\nargs = EasyDict()\nargs.learnig_rate = 1e-4\n"),
        run_name="old",
    ),
    Case(
        "config-syntax-error",
        ("1", "cpu", "--config", "{tmp}/c.py"),
        r"c\.py failed to run: SyntaxError",
        setup=_write("c.py", "args = dict(\nlearning_rate = 1e-4\n"),
        run_name="old",
    ),
    Case(
        "config-raises",
        ("1", "cpu", "--config", "{tmp}/c.py"),
        r"c\.py failed to run: RuntimeError: boom",
        setup=_write("c.py", "raise RuntimeError('boom')\n"),
        run_name="old",
    ),
    Case(
        "config-raises-multiline",
        ("1", "cpu", "--config", "{tmp}/c.py"),
        r"failed to run: ValueError: first second",
        setup=_write("c.py", "raise ValueError('first\\nsecond')\n"),
        run_name="old",
    ),
    Case(
        "config-calls-exit",
        ("1", "cpu", "--config", "{tmp}/c.py"),
        r"c\.py failed to run: SystemExit",
        setup=_write("c.py", "import sys\nsys.exit(3)\n"),
        run_name="old",
    ),
    Case(
        "config-wrong-type",
        ("1", "cpu", "--config", "{tmp}/c.py"),
        r"c\.py: n_frames must be int, got str '12'",
        setup=_write("c.py", "n_frames = '12'\n"),
        run_name="old",
    ),
    Case(
        "config-missing",
        ("1", "cpu", "--config", "{tmp}/nope.py"),
        r"config file .*nope\.py' not found",
        run_name="old",
    ),
    # resume
    Case("resume-missing", ("1", "cpu", "--resume", "{tmp}/output/old/checkpoint-9"), r"checkpoint-9' does not exist"),
    Case(
        "resume-incomplete",
        ("1", "cpu", "--resume", "{tmp}/output/old/checkpoint-5"),
        r"checkpoint-5 is incomplete \(no COMPLETE marker",
        run_name="old",
    ),
    Case(
        "resume-marker-lists-missing-file",
        ("1", "cpu", "--resume", "{tmp}/output/old/checkpoint-7"),
        r"checkpoint-7 is incomplete \(missing optimizer\.bin",
        setup=_write("output/old/checkpoint-7/COMPLETE", json.dumps({"files": ["optimizer.bin"]})),
    ),
    Case(
        "resume-damaged-checkpoint",
        ("1", "cpu", "--resume", "{tmp}/output/t/checkpoint-2"),
        r"checkpoint .*checkpoint-2 has no readable trainer_state\.json",
        setup=_write("output/t/checkpoint-2/COMPLETE", json.dumps({"files": []})),
    ),
    Case(
        "resume-run-without-checkpoint",
        ("1", "cpu", "--resume", "{tmp}/output/empty-run"),
        r"empty-run has no complete checkpoint",
        setup=_mkdir("output/empty-run"),
    ),
    # the machine
    Case(
        "output-dir-under-a-file",
        ("1", "cpu", "--set", "output_dir='{tmp}/afile/out'"),
        r"cannot write to .*afile/out/t: .*afile is a file, not a folder; pass a writable --set output_dir",
        setup=_write("afile", "a regular file\n"),
    ),
    Case(
        "gpu-profile-without-gpu",
        ("1", "h100", *overrides("data_root='{tmp}/videos' ref_vae_path='{tmp}/vae'")),
        r"no GPU is visible on this node",
        setup=_mkdir("videos", "vae"),
    ),
    # what the trainer would refuse first: checked by the launcher before writing or starting (#29)
    Case("data-root-missing", ("1", "cpu", "--set", "data_root='{tmp}/nope'"), r"data_root .*nope does not exist"),
    Case(
        "data-root-is-a-file",
        ("1", "cpu", "--set", "data_root='{tmp}/afile'"),
        r"data_root .*afile is not a folder",
        setup=_write("afile", "x"),
    ),
    Case(
        "ref-vae-missing",
        ("1", "cpu", "--set", "ref_vae_path='{tmp}/no-vae'"),
        r"reference VAE folder not found: .*no-vae: set ref_vae_path",
    ),
    Case(
        "ref-vae-not-diffusers",
        ("1", "cpu", "--set", "ref_vae_path='{tmp}/vae'"),
        r"no config\.json in .*vae",
        setup=_write("vae/model.ckpt", b"\0" * 16),
    ),
    Case(
        "latent-channels-vs-ref-vae",
        ("1", "cpu", *overrides("latent_channels=16 ref_vae_path='{cache}/demo/ref_vae/cogvideox_c4'")),
        r"has 4 latent channels but latent_channels=16: set --set latent_channels=4",
        setup=_demo_vae,
        slow=True,  # loads a real VAE in the launcher's input check: 12 s
    ),
    Case(
        "data-root-without-videos",
        ("1", "cpu", "--set", "data_root='{tmp}/videos'"),
        r"no video files .* under",
        setup=_write("videos/readme.txt", "x"),
    ),
    Case(
        "ref-vae-config-not-json",
        ("1", "cpu", "--set", "ref_vae_path='{tmp}/vae'"),
        r"cannot read .*config\.json",
        setup=_write("vae/vae/config.json", "not json"),
    ),
    Case(
        "ref-vae-other-family",
        ("1", "cpu", "--set", "ref_vae_path='{tmp}/vae'"),
        r"is an AutoencoderKLWan.*set ref_vae_type=wan",
        setup=_write("vae/config.json", '{"_class_name": "AutoencoderKLWan"}'),
    ),
    # pretrained_model_path: the launcher reads the file's header (rundir/taehvfile.py) before writing (#36)
    Case(
        "pretrained-missing",
        ("1", "cpu", "--set", "pretrained_model_path='{tmp}/taehv.pth'"),
        r"TAEHV weights not found: .*taehv\.pth",
    ),
    Case(
        "pretrained-bad-safetensors",
        ("1", "cpu", "--set", "pretrained_model_path='{tmp}/taehv.safetensors'"),
        r"cannot read TAEHV weights .*taehv\.safetensors",
        setup=_write("taehv.safetensors", b"\x08\0\0\0\0\0\0\0{}garbage"),
    ),
    Case(
        "pretrained-other-family",
        ("1", "cpu", "--set", "pretrained_model_path='{tmp}/taew2_1.safetensors'"),
        r"taew2_1\.safetensors holds wan weights .* this run trains cogvideox .*set --set ref_vae_type=wan",
        setup=_write("taew2_1.safetensors", _safetensors_header({"decoder.1.weight": [256, 4, 3, 3]})),
    ),
    Case(
        "pretrained-other-decoder",
        ("1", "cpu", "--set", "pretrained_model_path='{tmp}/taecvx_super.safetensors'"),
        r"holds cogvideox weights .*super decoder.* set --set decoder_arch=super",
        setup=_write("taecvx_super.safetensors", _safetensors_header({"decoder.0.weight": [512, 4, 1, 1]})),
    ),
]

# Caught inside the trainer (after `accelerate launch` started it).
DATA = ("--set", "data_root='{tmp}/videos'")
ANN = (*DATA, "--set", "annotation_file='{tmp}/ann.json'")
TRAINER_CASES = [
    # first: builds the demo assets in the shared cache (the others run in parallel after it)
    Case(
        "annotation-bad-json",
        ("1", "cpu", *ANN),
        r"ann\.json is not valid JSON",
        setup=_annotated('{"list": [{"path": "a.mp4"},'),
        slow=True,
    ),
    Case(
        "annotation-wrong-structure",
        ("1", "cpu", *ANN),
        r"ann\.json must be \{\"list\".*no \"list\" array",
        setup=_annotated(["a.mp4", "b.mp4"]),
        slow=True,
    ),
    Case(
        "annotation-paths-all-missing",
        ("1", "cpu", *ANN),
        r"none of the 2 videos listed in .*ann\.json exist",
        setup=_annotated({"list": [{"path": "gone1.mp4"}, {"path": "sub/gone2.mp4"}]}),
        slow=True,
    ),
    Case(
        "only-broken-videos",
        ("1", "cpu", "--set", "data_root='{tmp}/broken'"),
        r"none of the first \d videos gives a usable clip of n_frames=12 frames",
        setup=_broken_videos,
        slow=True,
    ),
    Case(
        "pretrained-not-weights",
        ("1", "cpu", "--set", "pretrained_model_path='{tmp}/taehv.pth'"),
        r"cannot read TAEHV weights .*taehv\.pth",
        setup=_write("taehv.pth", "these are not weights\n"),
        slow=True,
    ),
    # more of the same kinds, and those marked slow above (with -m slow: each starts the trainer, ~10 s of CPU)
    Case(
        "annotation-missing",
        ("1", "cpu", *DATA, "--set", "annotation_file='{tmp}/a.json'"),
        r"annotation_file .*a\.json not found",
        setup=_mkdir("videos"),
        slow=True,
    ),
    Case(
        "annotation-bad-entry",
        ("1", "cpu", *ANN),
        r"ann\.json: entry 1 is .*expected",
        setup=_annotated({"list": [{"path": "a.mp4"}, {"file": "b.mp4"}]}),
        slow=True,
    ),
    Case(
        "resume-damaged-portable-state",
        ("1", "cpu", "--resume", "{tmp}/output/old/checkpoint-9"),
        r"checkpoint .*checkpoint-9 is damaged \(.*\): pass an older checkpoint",
        setup=_damaged_ckpt,
        slow=True,
    ),
]


def cache_dir(tmp: Path) -> Path:
    return tmp.parent / "taehv-cache"  # shared by every test of the session (as trainrun.launch does)


def run_case(case: Case, tmp: Path, here: bool = False) -> tuple[subprocess.CompletedProcess, dict, dict]:
    """Set up, run the CLI (in this process if `here`); return (process, snapshot of output/ before,
    snapshot of output/old before)."""
    output = tmp / "output"
    make_old_run(output)
    if case.setup:
        case.setup(tmp)
    before = snapshot(output), snapshot(output / "old")
    argv = [a.format(tmp=tmp, cache=cache_dir(tmp)) for a in case.argv]
    common = ["--run-name", case.run_name, "--set", f"output_dir='{output}'", *FAST]
    argv = [*common, *argv] if argv[0] == "--" else [*argv[:2], *common, *argv[2:]]
    env = clean_env(TAEHV_CACHE=str(cache_dir(tmp)), OMP_NUM_THREADS="1", **case.env)
    proc = run_cli_here(*argv, env=env, cwd=tmp) if here else run_cli(*argv, env=env, cwd=tmp, timeout=300)
    return proc, *before


def check(
    case: Case, proc: subprocess.CompletedProcess, before_all: dict, before_old: dict, output: Path, launcher: bool
) -> None:
    assert_one_line_error(proc, case.match, case.code)
    assert snapshot(output / "old") == before_old, "the existing run was changed"
    if launcher:
        assert snapshot(output) == before_all, "a launch that failed before starting wrote into output/"


# Launcher cases fail before anything starts: they run in this process (the same main(), environment and
# streams); these few also run as real subprocesses, for the interpreter's own exit code and streams.
SUBPROCESS_CASES = {
    "gpus-word",
    "set-typo",
    "world-size-2-for-8-h100",
    "config-raises",
    "resume-damaged-checkpoint",
    "gpu-profile-without-gpu",
}


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.slow else []) for c in LAUNCHER_CASES]
)
def test_launcher_rejects(case: Case, tmp_path: Path) -> None:
    proc, before_all, before_old = run_case(case, tmp_path, here=True)
    check(case, proc, before_all, before_old, tmp_path / "output", launcher=True)


@pytest.mark.parametrize("case", [c for c in LAUNCHER_CASES if c.id in SUBPROCESS_CASES], ids=lambda c: c.id)
def test_launcher_rejects_as_a_process(case: Case, tmp_path: Path) -> None:
    proc, before_all, before_old = run_case(case, tmp_path)
    check(case, proc, before_all, before_old, tmp_path / "output", launcher=True)


@pytest.fixture(scope="module")
def trainer_runs(request, tmp_path_factory) -> dict[str, tuple[Future, Path]]:
    """The selected trainer cases, run three at a time (the first alone: it builds the demo assets)."""
    selected = {
        item.callspec.params["case"].id for item in request.session.items if item.originalname == "test_trainer_rejects"
    }
    cases = [c for c in TRAINER_CASES if c.id in selected]
    runs: dict[str, tuple[Future, Path]] = {}
    with ThreadPoolExecutor(max_workers=3) as pool:
        for i, case in enumerate(cases):
            tmp = tmp_path_factory.mktemp(case.id)
            runs[case.id] = (pool.submit(run_case, case, tmp), tmp)
            if i == 0:
                runs[case.id][0].exception()
    return runs


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.id, marks=[pytest.mark.slow] if c.slow else []) for c in TRAINER_CASES]
)
def test_trainer_rejects(case: Case, trainer_runs) -> None:
    future, tmp = trainer_runs[case.id]
    proc, before_all, before_old = future.result()
    check(case, proc, before_all, before_old, tmp / "output", launcher=False)
    assert f"[rank 0] error: {proc.stderr.strip()[len('error: ') :]}" in proc.stdout  # the trainer's own line


def test_a_negative_gpu_count_as_typed(tmp_path: Path) -> None:
    """`taehv-launch -1 cpu`: click would read -1 as an option; the group reports it as a GPU count."""
    proc = run_cli("-1", "cpu", "--dry-run", env=clean_env(), cwd=tmp_path)
    assert_one_line_error(proc, r"GPU count must be at least 1, got -1")


# --- the port and the disk --------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", ""], ids=["loopback", "all-interfaces"])
def test_port_in_use(host: str, tmp_path: Path) -> None:
    """`2 cpu` on a port someone listens on: one line, and no run directory or `latest` change."""
    output = tmp_path / "output"
    make_old_run(output)
    before = snapshot(output)
    with socket.socket() as holder:
        holder.bind((host, 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = run_cli(
            "2",
            "cpu",
            "--run-name",
            "t",
            "--master-port",
            str(port),
            *overrides(f"output_dir='{output}'"),
            *FAST,
            env=clean_env(TAEHV_CACHE=str(cache_dir(tmp_path)), OMP_NUM_THREADS="1"),
            cwd=tmp_path,
        )
    assert_one_line_error(proc, rf"port {port} is in use on this node: pass --master-port")
    assert snapshot(output) == before


def _unshare_prefix(mountpoint: Path) -> list[str] | None:
    """A command prefix that runs the rest in a private mount namespace with a 1 MiB tmpfs on mountpoint."""
    if not shutil.which("unshare"):
        return None
    script = f'mount -t tmpfs -o size=1m tmpfs "{mountpoint}" && exec "$@"'
    for flags in (["-rm"], ["-m"]):
        prefix = ["unshare", *flags, "sh", "-c", script, "sh"]
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return prefix
    return None


def test_disk_full(tmp_path: Path) -> None:
    """An output_dir on a 1 MiB file system (private tmpfs mount): one line about free space."""
    small = tmp_path / "small"
    small.mkdir()
    prefix = _unshare_prefix(small)
    if prefix is None:
        pytest.skip("cannot mount a small tmpfs in a private mount namespace here (unshare/mount not permitted)")
    env = clean_env(TAEHV_CACHE=str(cache_dir(tmp_path)), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [*prefix, *CLI, "1", "cpu", "--run-name", "t", "--set", f"output_dir='{small}/out'", *FAST],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert_one_line_error(
        proc, r"only 0\.0 GiB free under .*small/out/t: .*free space or choose another --set output_dir"
    )


# --- a dataset with some broken files trains ---------------------------------------------------


@pytest.mark.slow
def test_mixed_dataset_skips_broken_files_and_trains(tmp_path: Path) -> None:
    """Good videos with broken ones (empty, 1x1, a text file, 5 frames for a 12-frame clip, a folder named
    .mp4): trains, logs each skip.

    The folder is named so that the video held out for validation is a broken one: validation
    has no other videos to fall back on, so that one must be left out up front, not stop the run."""
    from taehv_launch.dataindex.index import VideoEntry, split_train_val

    import cv2
    import numpy as np

    good = ["chaplin.mp4", "big_buck_bunny_432_433.webm"]
    broken = ["empty.webm", "test_video.mp4", "notes.mp4", "short.avi"]
    for k in range(1000):
        data = tmp_path / f"mixed{k}"
        train, val = split_train_val([VideoEntry(str(data / n)) for n in sorted(good + broken)], 0.2, 64, 42)
        if Path(val[0].path).name in broken:
            break
    data.mkdir()
    for name in good + broken[:2]:
        shutil.copy(videos_dir() / name, data / name)
    (data / "notes.mp4").write_text("a text file renamed .mp4\n")
    writer = cv2.VideoWriter(str(data / "short.avi"), cv2.VideoWriter_fourcc(*"FFV1"), 10, (64, 64))
    for k in range(5):  # a real video, shorter than the profile's 12 frames: skipped, not frozen
        writer.write(np.full((64, 64, 3), 40 * k, np.uint8))
    writer.release()
    (data / "x.mp4").mkdir()  # a folder named like a video: not indexed
    # one batch of all training videos: each is the first choice of one sample, so every broken one is hit
    proc = run_cli(
        "1",
        "cpu",
        "--run-name",
        "t",
        "--master-port",
        str(free_port()),
        *overrides(
            f"output_dir='{tmp_path / 'output'}'",
            f"data_root='{data}'",
            "validation_fraction=0.2 seed=42",
            f"micro_batch_size={len(train)}",
            "max_train_steps=2 dataloader_num_workers=0 log_every=1 validation_steps=1",
            "checkpointing_steps=2 max_validation_batches=1",
        ),
        env=clean_env(TAEHV_CACHE=str(cache_dir(tmp_path)), OMP_NUM_THREADS="1"),
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert f"leaving out 1 of 1 validation videos, unreadable or unusable (e.g. {val[0].path})" in proc.stdout
    for name in broken:
        if str(data / name) != val[0].path:
            assert f"skipping unreadable or unusable video {data / name}" in proc.stdout, name
    assert str(data / "x.mp4") not in proc.stdout
    assert proc.stdout.count("validation at step") == 2
    assert (tmp_path / "output" / "t" / "final_model").is_dir()
