"""#38 item 3: torch.compile's mode for TAEHV (`compile_mode`), its CUDA-graph safety in the loop, the plan's
compile line, and `bench compare --cached` taking one lever per row (--cached-row, --no-online,
--row-timeout, --deadline). The GPU numbers come from scripts/gpu_levers.sh; here: what runs on a CPU."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from conftest import assert_one_line_error, clean_env, overrides, run_cli, run_cli_here

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


# ----------------------------------------------------------------------------- the key and the plan


CHOICES = "is not one of default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs"


@pytest.mark.parametrize(
    "value, match",
    [
        ("turbo", f"compile_mode='turbo' in --set compile_mode=turbo {CHOICES}"),
        ("'max_autotune'", f"compile_mode='max_autotune' in .* {CHOICES}"),
        ("None", "compile_mode must be str, got NoneType None"),
    ],
)
def test_a_compile_mode_that_is_not_one_of_torchs_is_one_line(value, match, tmp_path):
    proc = run_cli_here("1", "h100", "--dry-run", "--set", f"compile_mode={value}", cwd=tmp_path)
    assert_one_line_error(proc, match)


def test_every_mode_is_accepted_and_the_default_keeps_todays_compile():
    from taehv_launch.plan.schema import KEYS, make_config

    assert tuple(KEYS["compile_mode"].choices) == MODES
    assert make_config({}).compile_mode == "default"


def _compile_line(tmp_path, *args: str) -> tuple[str, str]:
    sets = overrides(*args)
    text = run_cli_here("1", "h100", "--dry-run", *sets, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    lines = [x for x in text.stdout.splitlines() if x.startswith("  compile   ")]
    doc = run_cli_here("1", "h100", "--dry-run", "--json", *sets, cwd=tmp_path)
    assert len(lines) == 1, text.stdout
    return lines[0].removeprefix("  compile   "), json.loads(doc.stdout)["compile"]


@pytest.mark.parametrize(
    "sets, line",
    [
        ((), "reference VAE encoder (channels-last, mode default) and TAEHV (channels-last, mode default)"),
        (
            ("compile_mode=reduce-overhead",),
            "reference VAE encoder (channels-last, mode default) and TAEHV (channels-last, mode reduce-overhead: "
            "CUDA graphs, a graph step per micro-batch)",
        ),
        (
            ("compile_mode=max-autotune-no-cudagraphs", "channels_last=False"),
            "reference VAE encoder (channels-last, mode default) and TAEHV (mode max-autotune-no-cudagraphs)",
        ),
        (
            ("compile=reference", "compile_mode=max-autotune"),
            "reference VAE encoder (channels-last, mode default); TAEHV eager (compile='reference'); "
            "compile_mode=max-autotune has no effect: it is TAEHV's (compile='all', no ZeRO-3)",
        ),
        (
            ("zero_stage=3",),
            "reference VAE encoder (channels-last, mode default); TAEHV eager under ZeRO-3 (compiled it measured no "
            "faster)",
        ),
        (("compile=none", "compile_mode=reduce-overhead"), "none: everything eager"),
    ],
)
def test_the_plan_says_what_is_compiled_and_in_which_mode(sets, line, tmp_path):
    assert _compile_line(tmp_path, *sets) == (line, line)


def test_the_cpu_plan_and_the_cache_job_say_their_compile(tmp_path):
    cpu = run_cli_here("1", "cpu", "--dry-run", "--set", "compile_mode=reduce-overhead", cwd=tmp_path)
    assert "  compile   none: everything eager (torch.compile runs on GPUs only)\n" in cpu.stdout
    cache = run_cli_here(
        "cache", "1", "h100", "--dry-run", *overrides("compile_mode=reduce-overhead", f"latent_cache={str(tmp_path / 'lc')!r}"), cwd=tmp_path,
    )  # fmt: skip
    assert "  compile   reference VAE encoder (channels-last, mode default)\n" in cache.stdout, cache.stdout


# ----------------------------------------------------------------------------- the loop's compile step


@pytest.mark.parametrize("mode", MODES)
def test_the_loop_compiles_taehv_in_the_mode_and_knows_when_it_runs_as_cuda_graphs(mode, tmp_path, monkeypatch):
    """The loop's real compile step on a stand-in trainer (no GPU here: the trainer says it is on CUDA;
    torch.compile only wraps, nothing is built until a call). CUDA-graph modes put a hook on each trainable
    parameter (its gradient leaves the graphs' pool) and make train_step mark a graph step first."""
    from taehv_launch.plan.schema import make_config
    from taehv_launch.train.loop import trainer as loop
    from taehv_launch.train.model.taehv import TAEHV

    for var in ("TORCHINDUCTOR_CACHE_DIR", "TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE"):
        monkeypatch.setenv(var, str(tmp_path) if var.endswith("DIR") else "1")
    cfg = make_config({"compile": "all", "compile_mode": mode, "output_dir": str(tmp_path)})
    taehv = TAEHV(latent_channels=4)
    taehv.encoder.requires_grad_(False)  # a frozen part: no hook, no gradient
    logs: list[str] = []
    trainer = SimpleNamespace(cfg=cfg, device=torch.device("cuda"), ref=None, zero=0, log=logs.append)
    loop.Trainer._compile(trainer, taehv)
    graphs = mode in ("reduce-overhead", "max-autotune")
    assert trainer.cudagraphs is graphs
    assert "encode_video" in vars(taehv) and "decode_video" in vars(taehv)
    (line,) = [x for x in logs if x.startswith("compile: ")]
    layout = cfg.compile_layout
    assert (
        f"TAEHV encode/decode (channels-last, layout {layout}), mode {mode}{' (CUDA graphs)' * graphs} (first" in line
    )
    hooked = {name: bool(p._backward_hooks) for name, p in taehv.named_parameters()}
    assert not any(v for k, v in hooked.items() if k.startswith("encoder."))
    assert all(v for k, v in hooked.items() if k.startswith("decoder.")) is graphs


@pytest.mark.parametrize("mode", MODES)
def test_compile_layout_force_keeps_the_mode_and_forces_inductors_layout_optimisation(mode):
    """compile_layout='force' passes Inductor's force_layout_optimization with the mode's own options (torch.compile
    takes a mode or options, not both); 'auto' passes the mode alone, as before the key."""
    from taehv_launch.compat import compile_options

    assert compile_options(mode, False) == ({} if mode == "default" else {"mode": mode})
    forced = compile_options(mode, True)["options"]
    assert forced.pop("force_layout_optimization") is True
    assert forced == torch._inductor.list_mode_options(mode)
    if mode != "default":
        assert forced, mode  # each other mode's own settings are kept
    torch.compile(torch.nn.Linear(2, 2), **compile_options(mode, True))  # accepted (built at the first call)


def test_train_step_marks_a_cuda_graph_step_before_anything_else():
    """torch.compiler.cudagraph_mark_step_begin() runs first in train_step when TAEHV runs as CUDA graphs
    (and only then): the previous micro-batch's graph outputs are given up before this one's run."""
    from torch._inductor import cudagraph_trees

    from taehv_launch.train.loop import trainer as loop

    def counter() -> int:
        return cudagraph_trees.MarkStepBox.mark_step_counter

    for graphs in (False, True):
        stand_in = SimpleNamespace(cfg=None, cudagraphs=graphs)  # no marks (instrument.py): stops after the mark
        before = counter()
        with pytest.raises(AttributeError, match="marks"):
            loop.Trainer.train_step(stand_in, {})
        assert (counter() != before) is graphs


def test_gradients_taken_out_of_the_graph_pool_still_accumulate():
    """The hook CUDA-graph modes add: each micro-batch's gradient is a copy, and accumulation over
    micro-batches gives the same .grad as without it (on the CPU: the arithmetic, not the pool)."""
    from taehv_launch.train.loop.speed import _out_of_the_graph_pool

    g = torch.randn(5)
    copy = _out_of_the_graph_pool(g)
    assert torch.equal(copy, g) and copy.data_ptr() != g.data_ptr()
    torch.manual_seed(0)
    plain, hooked = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    hooked.load_state_dict(plain.state_dict())
    for p in hooked.parameters():
        p.register_hook(_out_of_the_graph_pool)
    for x in torch.randn(3, 2, 4):
        plain(x).square().sum().backward()
        hooked(x).square().sum().backward()
    for a, b in zip(plain.parameters(), hooked.parameters()):
        torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize(
    "family, arch", [("cogvideox", "base"), ("cogvideox", "super"), ("ltx2", "base"), ("h3", "base")]
)
def test_taehv_encode_and_decode_trace_as_one_graph_each(family, arch):
    """The compile-friendly decoder of upstream taehv PR #21 removes the streaming decoder's work queue so
    that max-autotune sees one graph; the training path here has no queue: encode_video and decode_video
    (channels-last, as compiled) trace with fullgraph=True, forward and backward, for the families' shapes."""
    from taehv_launch.plan.families import get_family
    from taehv_launch.train.model.taehv import TAEHV

    torch.manual_seed(0)
    fam = get_family(family)
    taehv = TAEHV.from_family(fam, arch).train()
    taehv.channels_last = True
    space = 8 * fam.patch_size
    n = fam.default_n_frames
    frames = torch.rand(1, n, 3, 2 * space, 3 * space)
    latents = torch.randn(1, fam.latent_frames(n), fam.latent_channels, 2, 3)
    encode = torch.compile(taehv.encode_video, fullgraph=True, backend="eager", dynamic=False)
    decode = torch.compile(taehv.decode_video, fullgraph=True, backend="eager", dynamic=False)
    enc = encode(frames)
    dec = decode(latents, trim=taehv.trims(latents.shape[1]), clamp=False)
    (enc.square().mean() + dec.square().mean()).backward()
    torch.testing.assert_close(dec, taehv.decode_video(latents, trim=taehv.trims(latents.shape[1]), clamp=False))
    assert enc.shape == latents.shape


# ----------------------------------------------------------------------------- bench compare's lever rows


@pytest.mark.parametrize(
    "args, match",
    [
        (("--cached-row", "micro_batch_size=9"), "--cached-row adds runs from the latent cache: give --cached K"),
        (("--cached", "1", "--cached-row", "nonsense"), "--cached-row 'nonsense': --set 'nonsense' is not KEY=VALUE"),
        (("--cached", "1", "--cached-row", "compile_mode=turbo"), "--cached-row 'compile_mode=turbo': .*not one of"),
        (
            ("--cached", "1", "--cached-row", "micro_batch_size=0"),
            "--cached-row 'micro_batch_size=0': micro_batch_size=0 must be at least 1",
        ),
        (
            ("--cached", "1", "--cached-set", "micro_batch_size=0"),
            "--cached-set micro_batch_size=0: micro_batch_size=0",
        ),
        (("--cached", "1", "--cached-row", "a='b"), '--cached-row "a=\'b": No closing quotation'),
        (("--cached", "1", "--cached-row", " "), "--cached-row '': give one or more KEY=VALUE"),
        (("--no-online", "--phases"), "--phases profiles the online trainer run"),
        (("--row-timeout", "-1"), "--row-timeout -1: give seconds"),
        (("--deadline", "nan"), "--deadline nan: give seconds"),
    ],
)
def test_lever_rows_are_checked_before_anything_runs(args, match, tmp_path):
    proc = run_cli_here("bench", "compare", "1", "cpu", *args, "--set", f"output_dir='{tmp_path / 'out'}'")
    assert_one_line_error(proc, match)
    assert not (tmp_path / "out").exists() and proc.stdout == ""


def test_a_lever_row_the_plan_would_not_fit_is_refused_before_anything_runs(tmp_path):
    """On the h100 profile (checked here before the GPU is looked for): a micro-batch over the plan's memory."""
    proc = run_cli_here(
        "bench", "compare", "1", "h100", "--cached", "1", "--set", "gradient_accumulation_steps=1",
        "--cached-row", "micro_batch_size=12", "--set", f"output_dir='{tmp_path / 'out'}'",
    )  # fmt: skip
    assert_one_line_error(proc, r"--cached-row 'micro_batch_size=12': this plan will not fit in GPU memory: predicted")
    fits = run_cli_here(
        "bench", "compare", "1", "h100", "--cached", "1", "--set", "gradient_accumulation_steps=1",
        "--cached-row", "micro_batch_size=9", "--set", f"output_dir='{tmp_path / 'out'}'",
    )  # fmt: skip
    assert_one_line_error(fits, "profile h100 needs a GPU and this machine has none")  # the next check
    assert not (tmp_path / "out").exists()


def test_a_lever_row_keeps_its_words():
    from taehv_launch.cli.bench import lever_rows
    from taehv_launch.run.request import Request

    texts = ["compile_mode=reduce-overhead  micro_batch_size=2", "seraena_crop=32"]
    assert lever_rows(texts, 1, Request(gpus="1", profile="cpu"), []) == [
        ["compile_mode=reduce-overhead", "micro_batch_size=2"],
        ["seraena_crop=32"],
    ]


def test_a_run_the_deadline_leaves_too_little_time_is_a_row_not_a_start(tmp_path):
    from taehv_launch.bench.runs import MIN_ROW_S, cached_run
    from taehv_launch.run.request import Request

    logs: list[str] = []
    row = cached_run(Request(gpus="1", profile="cpu"), tmp_path, "", "", 4, [], 300, MIN_ROW_S - 1, "-c1", "x=1",
                     logs.append)  # fmt: skip
    assert row == {"clips_per_s": None, "not_measured": f"not started: {MIN_ROW_S - 1} s of the --deadline left"}
    assert logs == [f"bench: from the cache x=1: not started: {MIN_ROW_S - 1} s of the --deadline left"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # the cache job and three trainer runs on the cpu profile
def test_bench_compare_cached_rows_one_per_lever_and_a_run_past_its_time(tmp_path):
    """Naive, the cache job, then one run from the cache per row: the default, a lever that measures, and
    one stopped at its --row-timeout (its row says so, the others are kept, exit 1 after the table) with
    nothing of it left running. The two benches run side by side, each in a workdir of its own (each
    run's start-up is mostly single-threaded imports)."""
    from concurrent.futures import ThreadPoolExecutor

    import psutil

    def bench(workdir: str, *extra: str):
        return run_cli(
            "bench", "compare", "1", "cpu", "--steps", "1", "--trainer-steps", "4", "--cached", "1", "--no-online",
            "--workdir", str(tmp_path / workdir), "--set", f"output_dir={str(tmp_path / 'elsewhere')!r}", "--json",
            *extra, env=clean_env(TAEHV_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1"), cwd=tmp_path,
            timeout=1500,
        )  # fmt: skip

    before = {p.pid for p in psutil.process_iter()}
    with ThreadPoolExecutor(1) as pool:
        measured = pool.submit(bench, "bc", "--cached-row", "micro_batch_size=2 seraena_crop=32")
        cut = bench("cut", "--row-timeout", "4", "--cached-row", "seraena_crop=32")
        proc = measured.result()
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)["rows"]
    assert [r["what"] for r in rows] == ["naive", "cache job (encode once)", "ours, from the latent cache",
                                         "from the cache +"]  # fmt: skip
    default, lever = rows[2:]
    assert default["clips_per_s"] > 0 and default["ratio_vs_naive"] > 0 and default["sets"] == []
    assert lever["sets"] == ["micro_batch_size=2", "seraena_crop=32"] and lever["clips_per_s"] > 0
    assert lever["detail"] == "micro_batch_size=2 seraena_crop=32"
    assert json.loads((tmp_path / "bc" / "compare.json").read_text())["rows"] == rows
    assert not (tmp_path / "elsewhere").exists()  # the bench's runs go under its --workdir

    assert cut.returncode == 1, cut.stderr[-3000:]
    rows = json.loads(cut.stdout)["rows"]
    assert [r["clips_per_s"] for r in rows[2:]] == [None, None]
    assert all("ran past its 4 s and was stopped" in r["not_measured"] for r in rows[2:])
    error = [x for x in cut.stderr.splitlines() if x.startswith("error: ")]
    assert error == [error[0]] and error[0].startswith("error: 2 of the runs from the cache were not measured: ")
    left = [  # of either bench, both ended
        p
        for p in psutil.process_iter(["cmdline"])
        if p.pid not in before and "bench-" in " ".join(p.info["cmdline"] or [])
    ]
    assert not left, [p.info["cmdline"] for p in left]


def test_gpu_levers_script_parses_and_its_bench_flags_are_accepted(tmp_path):
    """scripts/gpu_levers.sh: bash -n, then the script itself without a GPU (NO_WHL=1: the installed
    package): every row's --set resolved against the h100 plan (memory included), so the bench stops at
    "needs a GPU", the first check after its arguments'; the table step says there is no compare.json."""
    import subprocess

    from conftest import REPO

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the script would measure for minutes")
    script = REPO / "scripts" / "gpu_levers.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    env = clean_env(NO_WHL="1", OUT=str(tmp_path / "out"), W=str(tmp_path / "w"))
    proc = subprocess.run(["bash", str(script)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    log = (tmp_path / "out" / "bench.log").read_text()
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: profile h100 needs a GPU and this machine has none: run it on a GPU machine, or "
        "`taehv-launch bench compare 1 cpu` for a CPU smoke run"
    ], log
    assert proc.returncode == 2 and "no compare.json" in proc.stdout, proc.stdout + proc.stderr
    assert "the default and 3 lever rows" in proc.stdout
