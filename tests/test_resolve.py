"""Profile resolution: every seed table row, A800, derived counts, precedence, config checks."""

from __future__ import annotations

import pytest

from taehv_launch.plan.configfile import load_config_file, parse_set, render_config_file
from taehv_launch.errors import ConfigError
from taehv_launch.plan.profiles import H100_ROWS, PROFILES
from taehv_launch.plan.resolve import Options, resolve
from taehv_launch.plan.schema import DEFAULTS, KEYS
from taehv_launch.plan.topology import detect_topology

# The seeds' H100 table (SPEC.md), written out again here on purpose: the data in
# profiles.py must match this independent copy.
# gpus: nodes, micro, accum, global, lr, warmup, zero, ckpt, val, log, workers, prefetch, timeout
# One deliberate difference, by measurement: one GPU runs without DeepSpeed (ZERO_BY_MEASUREMENT).
SEED_H100 = {
    1: (1, 8, 16, 128, 1e-4, 2000, 2, 2000, 1000, 50, 4, 2, 1800),
    8: (1, 8, 2, 128, 1e-4, 2000, 2, 2000, 1000, 25, 8, 2, 3600),
    16: (2, 8, 1, 128, 1e-4, 1500, 3, 1000, 500, 20, 12, 3, 7200),
    48: (6, 5, 1, 240, 1.8e-4, 1200, 3, 750, 500, 15, 11, 3, 10800),
    64: (8, 4, 1, 256, 2e-4, 1000, 3, 500, 500, 10, 12, 4, 14400),
}
# The seeds' ZeRO-2 (1, 8 GPUs) and ZeRO-3 (16-64 GPUs) measured 3.3% and 10% slower per GPU than plain
# DDP for this 11M-parameter model on an H100 (profiles.py, docs/benchmarks.md "Strategy per row"):
# every row runs zero_stage=0.
ZERO_BY_MEASUREMENT = {1: 0, 8: 0, 16: 0, 48: 0, 64: 0}


def plan_for(gpus, profile="h100", env=None, **kw):
    topo = detect_topology(gpus, env or {})
    return resolve(gpus, profile, topo, **kw)


@pytest.mark.parametrize("gpus", sorted(SEED_H100))
def test_h100_rows_match_the_seed_table(gpus):
    nodes, micro, accum, glob, lr, warm, zero, ckpt, val, log, workers, prefetch, timeout = SEED_H100[gpus]
    zero = ZERO_BY_MEASUREMENT.get(gpus, zero)
    plan = plan_for(gpus)
    c = plan.config
    assert plan.topology.num_machines == nodes
    assert (c["micro_batch_size"], c["gradient_accumulation_steps"], plan.global_batch_size) == (micro, accum, glob)
    assert c["learning_rate"] == pytest.approx(lr)
    assert (
        c["lr_warmup_steps"],
        c["zero_stage"],
        c["checkpointing_steps"],
        c["validation_steps"],
        c["log_every"],
        c["dataloader_num_workers"],
        c["prefetch_factor"],
        c["nccl_timeout"],
    ) == (warm, zero, ckpt, val, log, workers, prefetch, timeout)
    assert (c["height"], c["width"], c["n_frames"], c["max_train_steps"]) == (480, 720, 12, 100_000)
    assert (c["adam_beta1"], c["adam_beta2"], c["adam_weight_decay"], c["max_grad_norm"]) == (0.9, 0.95, 1e-2, 1.0)
    assert plan.row_source == f"table row: the seeds' H100 table, {gpus} GPU{'s' if gpus > 1 else ''}"


def test_table_has_exactly_the_seed_rows():
    assert [r.gpus for r in H100_ROWS] == sorted(SEED_H100)


@pytest.mark.parametrize(
    "gpus,accum,glob,lr",
    [(1, 64, 128, 1e-4), (8, 8, 128, 1e-4), (16, 4, 128, 1e-4), (48, 3, 288, 2.16e-4), (64, 2, 256, 2e-4)],
)
def test_a800_keeps_the_global_batch_with_micro_2(gpus, accum, glob, lr):
    plan = plan_for(gpus, "a800")
    assert plan.config["micro_batch_size"] == 2
    assert plan.config["gradient_accumulation_steps"] == accum
    assert plan.global_batch_size == glob
    assert plan.config["learning_rate"] == pytest.approx(lr)
    if glob != SEED_H100[gpus][3]:
        assert "LR scaled" in plan.row_source


# 2-7 GPUs take the 1-GPU row's DDP (zero_stage=0): on 2 x H200 DDP ran as fast as ZeRO-2 (docs/benchmarks.md)
@pytest.mark.parametrize(
    "gpus,micro,accum,glob,zero",
    [(2, 8, 8, 128, 0), (4, 8, 4, 128, 0), (3, 8, 5, 120, 0), (32, 8, 1, 256, 0), (24, 8, 1, 192, 0)],
)
def test_other_counts_follow_the_documented_rule(gpus, micro, accum, glob, zero):
    plan = plan_for(gpus)
    assert (plan.config["micro_batch_size"], plan.config["gradient_accumulation_steps"]) == (micro, accum)
    assert plan.global_batch_size == glob
    assert plan.config["zero_stage"] == zero
    assert plan.config["learning_rate"] == pytest.approx(1e-4 * glob / 128, rel=1e-3)
    assert plan.row_source.startswith("derived from the")


@pytest.mark.parametrize(
    "args,rows",
    [
        (("16", "h100"), "table row: the seeds' H100 table, 16 GPUs"),
        (("2", "cpu"), "table row: the cpu demo's table, 2 processes"),
        (("48", "a800"), "table row: the seeds' H100 table, 48 GPUs; a800: micro 2, accumulation 3 gives 288"),
        (
            ("24", "h100"),
            "derived from the 16-GPU row of the seeds' H100 table by the rule in docs/profiles.md: micro 8, "
            "accumulation 1 for a global batch near 128 (192), LR 0.00015 scaled linearly from 0.0001 at 128",
        ),
    ],
)
def test_the_plan_says_which_row_and_where_it_comes_from(args, rows):
    """The dry run's rows line used to say only "table row" (#29 item 9)."""
    from conftest import run_cli_here

    proc = run_cli_here(*args, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("  rows "))
    assert line.split(None, 1)[1].startswith(rows), line


def test_timeouts_by_node_count():
    assert plan_for(32).config["nccl_timeout"] == 7200  # 4 nodes
    assert plan_for(56).config["nccl_timeout"] == 10800  # 7 nodes
    assert plan_for(2).config["nccl_timeout"] == 3600


def test_cpu_profile_is_small_and_ddp():
    plan = plan_for(1, "cpu")
    c = plan.config
    assert (c["height"], c["width"], c["n_frames"], c["zero_stage"], c["latent_channels"]) == (64, 64, 12, 0, 4)
    with pytest.raises(ConfigError, match="at most 2"):
        plan_for(3, "cpu")


def test_precedence_set_over_file_over_profile(tmp_path):
    cfg = tmp_path / "my.py"
    cfg.write_text(
        "from easydict import EasyDict\nargs = EasyDict()\nargs.learning_rate = 3e-4\n"
        "args.n_frames = 24\nargs.use_flash_attention = True\n"
    )
    loaded = load_config_file(cfg)
    file_values, notes = loaded.values, loaded.notes
    assert any("use_flash_attention" in n for n in notes)
    plan = plan_for(8, file_values=file_values, set_values=dict([parse_set("learning_rate=2e-4")]))
    assert plan.config["learning_rate"] == 2e-4  # --set wins
    assert plan.config["n_frames"] == 24  # file beats profile
    assert plan.config["micro_batch_size"] == 8  # profile row kept


def test_plain_assignment_config_file(tmp_path):
    cfg = tmp_path / "plain.py"
    cfg.write_text("learning_rate = 5e-5\nheight = 256\nimport os\n")
    values = load_config_file(cfg).values
    assert values == {"learning_rate": 5e-5, "height": 256}


@pytest.mark.parametrize(
    "item,match",
    [
        ("learning_rat=1e-4", "did you mean learning_rate"),
        ("n_frames=12.5", "n_frames must be int"),
        ("use_seraena=1", "use_seraena must be bool"),
        ("zero_stage=5", "not one of"),
        ("learning_rate", "not KEY=VALUE"),
        ("=3", "has no key"),
        (
            "loss_spike_factor=1e400",
            r"loss_spike_factor=inf .* is not a finite number: give one such as its default 10.0",
        ),
        ("adam_beta2=-1e999", "adam_beta2=-inf .* is not a finite number"),
        ("ref_latent_mean=(0.5, 1e400)", r"holds a number that is not finite"),
    ],
)
def test_bad_set_values(item, match):
    with pytest.raises(ConfigError, match=match):
        parse_set(item)


def test_a_config_file_cannot_set_a_non_finite_number(tmp_path):
    """float('nan') / float('inf') in a config file: one line naming the file and the key (rendered into
    config.py they would not read back: `args.x = inf` is a NameError in the trainer)."""
    for text in ("max_grad_norm = float('nan')", "seraena_lr = float('inf')"):
        path = tmp_path / "c.py"
        path.write_text(text + "\n")
        with pytest.raises(ConfigError, match=r"c.py: \w+=(nan|inf) is not a finite number"):
            load_config_file(path)


def test_set_never_evaluates_code():
    name, value = parse_set("data_root=__import__('os').getcwd()")
    assert value == "__import__('os').getcwd()"  # a plain string, not executed


@pytest.mark.parametrize(
    "sets,match",
    [
        ({"n_frames": 20}, "n_frames=20 does not fit ref_vae_type=cogvideox: .*use 12, 24 or 36"),
        ({"height": 100}, "multiple of 8"),
        ({"min_frame_delta": 3, "max_frame_delta": 2}, "min_frame_delta"),
        ({"micro_batch_size": 0}, "at least 1"),
        ({"decoder_time_upscale": (True,)}, "three booleans"),
        ({"hang_timeout": -5}, "hang_timeout=-5 must not be negative"),
        ({"hang_timeout": 300, "hang_timeout_slow": 10}, "hang_timeout_slow=10 is below hang_timeout=300"),
        ({"hang_timeout": 9}, "hang_timeout=9 is below 10 s: ranks write their heartbeat every 5 s"),
        ({"loss_spike_factor": 0.5}, r"loss_spike_factor=0.5 must be above 1.*or 0 = off"),
        ({"rollback_lr_factor": 0.0}, r"rollback_lr_factor=0.0 must be in \(0, 1\]"),
        ({"loss_spike_window": 0}, "loss_spike_window=0 must be at least 1"),
        ({"max_consecutive_bad_steps": 0}, "max_consecutive_bad_steps=0 must be at least 1"),
        ({"straggler_threshold": -0.1}, "straggler_threshold=-0.1 must not be negative"),
        ({"max_requeues_without_progress": -1}, "max_requeues_without_progress=-1: use 0"),
    ],
)
def test_cross_field_checks(sets, match):
    with pytest.raises(ConfigError, match=match):
        plan_for(8, set_values=sets)


@pytest.mark.parametrize(
    "sets", [{"hang_timeout": 0, "hang_timeout_slow": 0}, {"loss_spike_factor": 0.0}, {"straggler_threshold": 0.0}]
)
def test_off_values_of_the_survive_keys_are_accepted(sets):
    plan_for(8, set_values=sets)  # 0 = off, as documented


def test_rendered_config_round_trips(tmp_path):
    plan = plan_for(16, set_values={"learning_rate": 3e-4})
    path = tmp_path / "config.py"
    path.write_text(render_config_file(plan.config, header="test"))
    loaded = load_config_file(path)
    assert loaded.values == plan.config and not loaded.notes


def test_shipped_configs_match_the_table():
    """configs/*.py are generated from the table (scripts/generate_configs.py); they must not drift."""
    from pathlib import Path

    from taehv_launch.gen.shipped import expected_files

    root = Path(__file__).resolve().parents[1]
    for rel, text in expected_files().items():
        path = root / rel
        assert path.exists(), f"{rel} missing: run python scripts/generate_configs.py"
        assert path.read_text() == text, f"{rel} drifted from the table: run python scripts/generate_configs.py"


def test_every_profile_key_is_a_schema_key():
    for profile in PROFILES.values():
        assert set(profile.config) <= set(KEYS), profile.name
    assert set(DEFAULTS) == set(KEYS)


def test_debug_shortens_the_run():
    plan = plan_for(1, "cpu", options=Options(debug=True))
    assert plan.config["max_train_steps"] <= 20 and plan.config["log_every"] == 1


def test_the_seeds_train_batch_size_is_micro_batch_size(tmp_path):
    from taehv_launch.errors import ConfigError
    from taehv_launch.plan.configfile import load_config_file, parse_sets

    assert parse_sets(["train_batch_size=4"]) == {"micro_batch_size": 4}
    seed = tmp_path / "seed.py"
    seed.write_text("from easydict import EasyDict\nargs = EasyDict()\nargs.train_batch_size = 2\n")
    assert load_config_file(seed).values == {"micro_batch_size": 2}
    seed.write_text("args = dict(train_batch_size=2, micro_batch_size=4)\n")
    with pytest.raises(ConfigError, match="train_batch_size=2 and micro_batch_size=4 are two names for one key"):
        load_config_file(seed)


def test_the_plan_says_which_strategy_and_why():
    assert plan_for(16).strategy.startswith(
        "plain DDP (zero_stage=0): the fastest per GPU measured for this model "
        "(ZeRO-1/2/3 ran at 96.5/96.7/90.0% of its speed;"
    )
    asked = plan_for(64, set_values={"zero_stage": 3})
    assert asked.config["zero_stage"] == 3 and asked.uses_deepspeed  # exactly what was asked
    assert asked.strategy.startswith("ZeRO-3, as asked: measured at 90.0% of the row's plain DDP speed per GPU")
    assert plan_for(1, "cpu").strategy == ""


@pytest.mark.parametrize("crop", [4, 7, 12, -8, 10000, 728])
def test_seraena_crop_is_off_or_a_window_on_the_latent_grid(crop):
    # train/model/seraena.py: a crop x crop window at 8-pixel steps whose latents are crop/8 cells;
    # below 8 the discriminator asserts, off the grid the latent window does not match
    with pytest.raises(ConfigError, match=r"seraena_crop=-?\d+ must be 0 \(off: the whole frame\) or a multiple of 8 "):
        plan_for(8, set_values={"seraena_crop": crop})
    with pytest.raises(ConfigError, match=r"multiple of 16 .* from 16 to 720"):
        plan_for(8, set_values={"seraena_crop": 8, "patch_size": 2, "use_ref_vae": False, "encoder_loss_weight": 0})


def test_seraena_crop_values_that_work():
    for crop in (0, 8, 256, 720):
        assert plan_for(8, set_values={"seraena_crop": crop}).config["seraena_crop"] == crop
    # the profile's 256 on clips smaller than it: the whole frame, as the trainer does; only a user's value is refused
    assert plan_for(8, set_values={"height": 128, "width": 128}).config["seraena_crop"] == 256
    with pytest.raises(ConfigError, match=r"from 8 to 128 .* e\.g\. --set seraena_crop=128"):
        plan_for(8, set_values={"height": 128, "width": 128, "seraena_crop": 256})


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_output_dir_is_refused(value):
    with pytest.raises(ConfigError, match="output_dir is empty"):
        plan_for(1, "cpu", set_values={"output_dir": value})


@pytest.mark.parametrize(
    "profile,sets,match",
    [
        ("cpu", {"dataloader_num_workers": 100000}, r"dataloader_num_workers=100000 is out of range: use 0-64 "),
        ("h100", {"dataloader_num_workers": 65}, r"use 0-64 worker processes per rank"),
        ("cpu", {"prefetch_factor": 17}, r"prefetch_factor=17 is out of range: use 1-16 batches per worker"),
        ("cpu", {"prefetch_factor": 0}, r"prefetch_factor=0 is out of range: use 1-16"),
        ("h100", {"nccl_timeout": 10**15}, r"nccl_timeout=1000000000000000 is out of range: use 1-604800 seconds"),
        # #35: a 100000x100000 crop passed the cpu dry run; a clip no profile can hold, on every profile
        ("cpu", {"height": 100000, "width": 100000}, r"clips of 12x100000x100000 .* at most 126,438,365 "),
        ("h100", {"height": 100000, "width": 100000}, r"more than the largest profile holds \(h200, 140\.4 GiB\)"),
        ("cpu", {"n_frames": 1200, "height": 1024, "width": 1024}, r"clips of 1200x1024x1024"),
        # the cpu profile has no GPU memory plan: its micro-batch is held to the same floor
        (
            "cpu",
            {"micro_batch_size": 100000},
            r"micro_batch_size=100000 of 12x64x64 clips .*use micro_batch_size 1-2572 ",
        ),
    ],
)
def test_values_past_the_upper_bounds_name_the_range(profile, sets, match):
    with pytest.raises(ConfigError, match=match):
        plan_for(1, profile, set_values=sets)


def test_values_at_the_upper_bounds_are_taken():
    plan_for(1, "cpu", set_values={"dataloader_num_workers": 64, "prefetch_factor": 16, "nccl_timeout": 604800})
    plan_for(1, "cpu", set_values={"height": 2048, "width": 2048})  # 12x2048x2048: far from the floor's limit
    plan_for(1, "cpu", set_values={"micro_batch_size": 64})
    # a GPU profile's micro-batch past its memory is the memory plan's to refuse, with one that fits
    plan = plan_for(1, "h100", set_values={"micro_batch_size": 64})
    assert plan.memory.fits is False and "use --set micro_batch_size=8" in plan.memory.detail
    for profile in PROFILES:  # every shipped row is far inside the bounds
        for row in PROFILES[profile].rows:
            plan_for(row.gpus, profile)


def test_the_bounds_are_one_line_in_the_dry_run(tmp_path):
    from conftest import assert_one_line_error, overrides, run_cli_here

    out = f"output_dir='{tmp_path}'"
    for sets, match in (
        (["dataloader_num_workers=100000"], r"^error: dataloader_num_workers=100000 is out of range: use 0-64"),
        (["height=100000", "width=100000"], r"^error: clips of 12x100000x100000 .* at most 126,438,365"),
    ):
        argv = overrides(*sets)
        assert_one_line_error(run_cli_here("1", "cpu", "--dry-run", "--set", out, *argv), match)
    assert list(tmp_path.iterdir()) == []
