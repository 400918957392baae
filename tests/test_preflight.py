"""validate-env on the CPU machine: every check's no-GPU and fail paths, with real files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import clean_env, overrides, run_cli


def checks(*args: str, env=None, cwd=None) -> tuple[int, dict[str, dict]]:
    proc = run_cli("validate-env", *args, "--json", env=env, cwd=cwd)
    data = json.loads(proc.stdout)  # stdout is one JSON object and nothing else
    assert "Traceback" not in proc.stderr
    return proc.returncode, {c["name"]: c for c in data["checks"]}


def test_cpu_demo_passes_on_a_fresh_machine(tmp_path):
    env = clean_env(TAEHV_CACHE=str(tmp_path / "fresh-cache"))
    code, c = checks("1", "cpu", "--set", f"output_dir='{tmp_path}'", env=env)
    assert code == 0, c
    assert all(v["status"] != "FAIL" for v in c.values())
    assert "will be created" in c["data"]["detail"] and "will be created" in c["reference VAE"]["detail"]
    assert c["gpus"]["detail"].startswith("cpu profile")
    for name in ("torch", "accelerate", "deepspeed", "diffusers", "disk", "open files", "cpus", "memory plan"):
        assert c[name]["status"] in ("PASS", "WARN"), name


def test_gpu_plan_on_a_cpu_machine_fails_clearly(tmp_path):
    code, c = checks("8", "h100", "--quick", "--set", f"output_dir='{tmp_path}'")
    assert code == 1
    assert c["gpus"]["status"] == "FAIL" and "no GPU visible" in c["gpus"]["detail"] and c["gpus"]["fix"]
    assert c["data"]["status"] == "FAIL" and "data_root" in c["data"]["fix"]
    assert c["reference VAE"]["status"] == "FAIL"
    assert c["memory plan"]["status"] == "PASS" and "predicted peak" in c["memory plan"]["detail"]


def test_memory_plan_fails_when_the_micro_batch_cannot_fit(tmp_path):
    code, c = checks("1", "h100", "--quick", *overrides("n_frames=24", f"output_dir='{tmp_path}'"))
    assert code == 1 and c["memory plan"]["status"] == "FAIL"
    assert "micro_batch_size=4" in c["memory plan"]["detail"]


@pytest.mark.slow
def test_data_checks_decode_real_files(tmp_path, videos):
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("chaplin.mp4", "empty.webm", "test_video.mp4"):
        shutil.copy(videos / name, mixed / name)
    code, c = checks("1", "cpu", *overrides(f"data_root='{mixed}'", f"output_dir='{tmp_path}'"))
    assert c["data index"]["status"] == "PASS" and "3 videos" in c["data index"]["detail"]
    assert c["data decode"]["status"] == "WARN" and "1/3" in c["data decode"]["detail"]

    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(videos / "empty.webm", broken / "a.webm")
    code, c = checks("1", "cpu", *overrides(f"data_root='{broken}'", f"output_dir='{tmp_path}'"))
    assert code == 1 and c["data decode"]["status"] == "FAIL"

    code, c = checks("1", "cpu", *overrides(f"data_root='{tmp_path / 'missing'}'", f"output_dir='{tmp_path}'"))
    assert code == 1 and c["data"]["status"] == "FAIL" and "missing" in c["data"]["detail"]


def _tiny_wan(tmp_path: Path) -> list[str]:
    from taehv_launch.train.data.synthetic import make_tiny_ref_vae

    vae = make_tiny_ref_vae("wan", str(tmp_path / "wan"), latent_channels=4)
    return overrides("ref_vae_type='wan'", f"ref_vae_path='{vae}'", f"output_dir='{tmp_path}'")


@pytest.mark.slow  # each validate-env that loads the models takes ~6 s; the fast suite has the fail paths below
def test_model_checks_pass_on_a_real_folder(tmp_path):
    code, c = checks("1", "cpu", *_tiny_wan(tmp_path))
    assert c["reference VAE"]["status"] == "PASS" and "(1, 3, 4, 8, 8)" in c["reference VAE"]["detail"]


@pytest.mark.slow
def test_model_checks_load_real_folders_and_name_the_fix(tmp_path):
    # both fail paths in one call: the reference VAE loads and has 4 channels, not 16; no TAEHV weights file
    code, c = checks(
        "1",
        "cpu",
        *_tiny_wan(tmp_path),
        *overrides("latent_channels=16", f"pretrained_model_path='{tmp_path / 'nope.pth'}'"),
    )
    assert (
        code == 1 and c["reference VAE"]["status"] == "FAIL" and c["reference VAE"]["fix"] == "--set latent_channels=4"
    )
    assert c["pretrained TAEHV"]["status"] == "FAIL"


@pytest.mark.slow
def test_two_cpu_ranks_run_a_real_all_reduce(tmp_path):
    code, c = checks("2", "cpu", "--set", f"output_dir='{tmp_path}'")
    assert c["all-reduce"]["status"] == "PASS" and "2 CPU ranks over gloo" in c["all-reduce"]["detail"]


def test_human_output_has_one_line_per_check(tmp_path):
    proc = run_cli("validate-env", "8", "h100", "--quick", "--set", f"output_dir='{tmp_path}'")
    assert proc.returncode == 1
    assert "FAIL  gpus" in proc.stdout and "fix:" in proc.stdout and "failed," in proc.stdout


@pytest.mark.slow
def test_multi_node_master_checks(tmp_path):
    import socket

    from conftest import free_port

    closed = free_port()
    base = [
        "2",
        "cpu",
        "--quick",
        "--num-nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--master-addr",
        "127.0.0.1",
        *overrides(f"output_dir='{tmp_path}'"),
    ]
    code, c = checks(*base, "--node-rank", "1", "--master-port", str(closed))
    assert c["master reachable"]["status"] == "WARN" and f"127.0.0.1:{closed}" in c["master reachable"]["detail"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        code, c = checks(*base, "--node-rank", "1", "--master-port", str(busy))
        assert c["master reachable"]["status"] == "PASS"
        code, c = checks(*base, "--node-rank", "0", "--master-port", str(busy))
        assert code == 1 and c["master port"]["status"] == "FAIL" and "--master-port" in c["master port"]["fix"]
