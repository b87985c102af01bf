"""Tests of the benchmark and analysis tools that need no GPU, ncu or cuobjdump: every command line
answers --help, the parsers read realistic ncu and cuobjdump output, the autotuning summary ranks
correctly, configuration selection explains what is not compiled, the FLOP counts follow DESIGN.md,
the tools that time kernels refuse clearly where no GPU is visible, and, with a stand-in for the
extension on the CPU, they pass each problem (mask, lengths, GQA) to our kernels and SDPA alike."""

import csv
import dataclasses
import functools
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys
import types

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCHMARK_DIR = REPO_ROOT / "tools" / "benchmark"
ANALYSIS_DIR = REPO_ROOT / "tools" / "analysis"
sys.path[:0] = [str(BENCHMARK_DIR), str(ANALYSIS_DIR)]

import ab_builds  # noqa: E402
import autotune  # noqa: E402
import bench_common as common  # noqa: E402
import call_bench  # noqa: E402
import ceiling_bench  # noqa: E402
import decode_bench  # noqa: E402
import generate_bench  # noqa: E402
import model_bench  # noqa: E402
import ncu_bench  # noqa: E402
import progression  # noqa: E402
import power_bench  # noqa: E402
import pt_bench  # noqa: E402
import varlen_bench  # noqa: E402
import run_kernels  # noqa: E402
import sass_counts  # noqa: E402
import sass_diff  # noqa: E402
import sass_order  # noqa: E402
import stall_paths  # noqa: E402
import transposed_v_copy_bench  # noqa: E402
import work_order_tail  # noqa: E402
from flash_helpers.build_env import BUILD_KERNELS_ENV  # noqa: E402
from flash_helpers.default_set import DEFAULT_BUILD_KERNELS  # noqa: E402
from flash_helpers.dtypes import DType  # noqa: E402
from flash_helpers.kernel_names import parse_kernel_name_into_config  # noqa: E402
from flash_helpers.kernel_sets import KERNELS_ENV, get_kernel_configs  # noqa: E402
from flash_helpers.problem import (  # noqa: E402
    ALL_VARIANTS,
    BENCHMARK_LENGTH_UNIT,
    BENCHMARK_VARIANTS,
    KV_E4M3_VARIANTS,
    MaskKind,
    ProblemVariant,
    VARLEN_VARIANTS,
    attention_flop,
    total_flop,
)
from flash_helpers.progression_steps import SM90_PROGRESSION_BLOCK, SM90_PROGRESSION_STEPS  # noqa: E402
from flash_helpers.reference import ReferenceComparison  # noqa: E402
from flash_helpers.sm80_config import D_HEADS, FlashForwardKernelConfig  # noqa: E402
from flash_helpers.sm90_config import HopperForwardKernelConfig  # noqa: E402
from flash_helpers.tuning_space import get_all_kernel_configs, get_autotuning_kernel_configs  # noqa: E402

PYTHON_TOOLS = [
    BENCHMARK_DIR / "ab_builds.py",
    BENCHMARK_DIR / "pt_bench.py",
    BENCHMARK_DIR / "run_kernels.py",
    BENCHMARK_DIR / "ncu_bench.py",
    BENCHMARK_DIR / "autotune.py",
    BENCHMARK_DIR / "progression.py",
    BENCHMARK_DIR / "model_bench.py",
    BENCHMARK_DIR / "power_bench.py",
    BENCHMARK_DIR / "ceiling_bench.py",
    BENCHMARK_DIR / "decode_bench.py",
    BENCHMARK_DIR / "generate_bench.py",
    BENCHMARK_DIR / "transposed_v_copy_bench.py",
    ANALYSIS_DIR / "sass_counts.py",
    ANALYSIS_DIR / "sass_diff.py",
    ANALYSIS_DIR / "sass_order.py",
    ANALYSIS_DIR / "work_order_tail.py",
    ANALYSIS_DIR / "stall_paths.py",
]

# Configurations from the current sets, so the tests follow changes to the configuration space:
# two SM80 tuning configurations with d_head 128 and different block sizes, and a valid one outside
# the tuning set; two Hopper ones, each its own step of the progression, and the default set's.
TUNE = get_autotuning_kernel_configs()
CFG_A = next(cfg for cfg in TUNE if cfg.d_head == 128)
CFG_B = next(cfg for cfg in TUNE if cfg.d_head == 128 and (cfg.B_r, cfg.B_c) != (CFG_A.B_r, CFG_A.B_c))
NOT_TUNED = next(cfg for cfg in get_all_kernel_configs() if cfg not in set(TUNE))
SM90_128 = parse_kernel_name_into_config("sm90(FP16, 128, 128, 128, 2): ws+pingpong+overlap")
SM90_WS = parse_kernel_name_into_config("sm90(FP16, 128, 128, 128, 2): ws")
CAUSAL = ProblemVariant(MaskKind.CAUSAL)
CAUSAL_TAILS = ProblemVariant(MaskKind.CAUSAL, masked_tails=True)


# nvcc's device symbols hold all 13 fields of the configuration, trailing zeros too, then the
# problem variant's mask kind, masked tails and score mods (checked against nvcc 13 on an object
# file); ncu prints them demangled.


def nvcc_demangled_name(cfg, variant=ProblemVariant()) -> str:
    """The kernel's name as ncu prints it (the demangled device symbol)."""

    def literal(value) -> str:
        if isinstance(value, DType):
            return f"(flash::DType){int(value)}"
        return str(value).lower()  # true / false, or the number

    items = ", ".join(literal(value) for value in dataclasses.astuple(cfg))
    flags = ", ".join(literal(flag) for flag in variant.flags())
    return (
        "void flash::sm80::flash_forward_kernel<flash::sm80::StaticForwardKernelConfig<"
        f"flash::sm80::FlashForwardKernelConfig{{{items}}}>, (flash::MaskKind){int(variant.mask)}, {flags}>"
        "(flash::ForwardParams)"
    )


def nvcc_device_symbol(cfg, variant=ProblemVariant()) -> str:
    """The kernel's device symbol as cuobjdump prints it."""

    def literal(value) -> str:
        if isinstance(value, DType):
            return f"LNS_5DTypeE{int(value)}E"
        return f"Lb{int(value)}E" if isinstance(value, bool) else f"Li{value}E"

    items = "".join(literal(value) for value in dataclasses.astuple(cfg))
    flags = "".join(literal(flag) for flag in variant.flags())
    return (
        "_ZN5flash4sm8020flash_forward_kernelINS0_25StaticForwardKernelConfigIXtlNS0_24FlashForwardKernelConfigE"
        f"{items}EEEELNS_8MaskKindE{int(variant.mask)}E{flags}EEvNS_13ForwardParamsE"
    )


def run_tool(*args, env_changes=None, cwd=REPO_ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_changes or {})}
    return subprocess.run([*map(str, args)], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


# ----------------------------------------------------------------------------------------------
# Command lines


@pytest.mark.parametrize("tool", PYTHON_TOOLS, ids=lambda path: path.name)
def test_help(tool):
    result = run_tool(sys.executable, str(tool), "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:")


def test_autotune_script_help():
    result = run_tool(
        "bash", str(BENCHMARK_DIR / "benchmark_autotune.sh"), "--help", env_changes={"PYTHON": sys.executable}
    )
    assert result.returncode == 0, result.stderr
    assert "SEQ_LEN" in result.stdout and "usage: autotune.py" in result.stdout
    assert "--causal" in result.stdout


def test_autotune_script_passes_lengths_and_options_on(tmp_path):
    """The script turns its leading numbers into --seq-lens and hands the rest (--causal, ...) to
    autotune.py with KERNELS=tune, here to a stand-in Python that records what it got."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nprintf "%s\\n" "KERNELS=$KERNELS" "$@" > {tmp_path / "argv.txt"}\n')
    python.chmod(0o755)
    result = run_tool(
        "bash", BENCHMARK_DIR / "benchmark_autotune.sh", "1024", "4096", "--causal", "on", "--d-heads", "256",
        env_changes={"PYTHON": str(python), "KERNELS": ""},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    argv = (tmp_path / "argv.txt").read_text().splitlines()
    assert argv == [
        "KERNELS=tune", "tools/benchmark/autotune.py", "--seq-lens", "1024", "4096",
        "--causal", "on", "--d-heads", "256",
    ]  # fmt: skip


# CUDA_VISIBLE_DEVICES="" hides every GPU, so these run the same on a GPU machine.
@pytest.mark.parametrize(
    "command",
    [
        [BENCHMARK_DIR / "run_kernels.py", "1024", "128"],
        [BENCHMARK_DIR / "pt_bench.py"],
        [BENCHMARK_DIR / "autotune.py", "--csv", "unused.csv"],
        [BENCHMARK_DIR / "progression.py", "--csv", "unused.csv"],
        [BENCHMARK_DIR / "model_bench.py", "--csv", "unused.csv"],
        [BENCHMARK_DIR / "power_bench.py", "4096", "128"],
        [BENCHMARK_DIR / "ceiling_bench.py"],
        [BENCHMARK_DIR / "decode_bench.py", "--csv", "unused.csv"],
        [BENCHMARK_DIR / "generate_bench.py", "--csv", "unused.csv"],
        [BENCHMARK_DIR / "transposed_v_copy_bench.py"],
    ],
    ids=lambda command: command[0].name,
)
def test_timing_tools_refuse_without_a_gpu(command, tmp_path):
    result = run_tool(sys.executable, *map(str, command), env_changes={"CUDA_VISIBLE_DEVICES": ""}, cwd=tmp_path)
    assert result.returncode == 1
    assert "no CUDA GPU visible" in result.stderr
    assert not (tmp_path / "unused.csv").exists()


def test_decode_bench_reads_shapes_and_tabulates_bandwidth_and_ratios():
    args = decode_bench.parse_args(["--shapes", "8x32768", "1X131072", "--splits", "4", "--graphs"])
    assert args.shapes == [(8, 32768), (1, 131072)] and args.splits == [4] and args.graphs
    assert (args.page_size, args.page_order) == (None, "random")
    args = decode_bench.parse_args(["--page-size", "16", "--page-order", "sequential"])
    assert (args.page_size, args.page_order) == (16, "sequential")
    with pytest.raises(SystemExit):
        decode_bench.parse_args(["--page-order", "backwards"])
    for bad in ("8", "0x10", "axb"):
        with pytest.raises(SystemExit):
            decode_bench.parse_args(["--shapes", bad])
    rows = [
        decode_bench.DecodeTiming("bf16", 8, 32768, 1, decode_bench.OURS, 0.1, 4000.0),
        decode_bench.DecodeTiming("bf16", 8, 32768, 1, decode_bench.FA3, 0.1, 3200.0),
        decode_bench.DecodeTiming("bf16", 8, 32768, 1, decode_bench.SDPA, 0.1, 5000.0),
        decode_bench.DecodeTiming("bf16", 1, 8192, 1, decode_bench.OURS, 0.1, 1000.0),
    ]
    lines = decode_bench.format_table(rows, [decode_bench.OURS, decode_bench.FA3, decode_bench.SDPA]).splitlines()
    assert lines[0] == "| dtype | q | batch x keys | ours GB/s | FA3 GB/s | SDPA GB/s | ours/FA3 | ours/SDPA |"
    # Ordered by tokens: 1 x 8192 first; a peer that did not run reads '-'.
    assert lines[2] == "| bf16 | 1 | 1 x 8,192 | 1000 | - | - | - | - |"
    assert lines[3] == "| bf16 | 1 | 8 x 32,768 | 4000 | 3200 | 5000 | 1.250 | 0.800 |"
    assert decode_bench.parse_args(["--host-calls", "500"]).host_calls == 500
    with pytest.raises(SystemExit):
        decode_bench.parse_args(["--host-calls", "0"])
    host_rows = [dataclasses.replace(row, host_us=us) for row, us in zip(rows[:3], (12.0, 30.0, 15.0))]
    lines = decode_bench.format_table(host_rows, [decode_bench.OURS, decode_bench.FA3, decode_bench.SDPA], "host_us")
    assert lines.splitlines()[2] == "| bf16 | 1 | 8 x 32,768 | 12.0 | 30.0 | 15.0 | 0.400 | 0.800 |"
    # A paged run's last column: ours on the unpaged cache's time over ours'.
    paged_rows = [rows[0], dataclasses.replace(rows[0], implementation=decode_bench.UNPAGED, time_ms=0.095)]
    lines = decode_bench.format_table(paged_rows, [decode_bench.OURS, decode_bench.UNPAGED]).splitlines()
    assert lines[0].endswith("| ours/FA3 | ours/SDPA | paged/dense |")
    assert lines[2].endswith("| - | - | 0.950 |")
    # --configs: named configurations, each a column of its own.
    args = decode_bench.parse_args(["--configs", SM90_128.short_form(), CFG_A.short_form()])
    assert args.configs == [SM90_128, CFG_A]
    with pytest.raises(SystemExit):
        decode_bench.parse_args(["--configs", "sm90(FP16, 128)"])
    named = decode_bench.named(SM90_128)
    lines = decode_bench.format_table([dataclasses.replace(rows[0], implementation=named)], [decode_bench.OURS, named])
    assert lines.splitlines()[0].startswith(f"| dtype | q | batch x keys | ours GB/s | {named} GB/s |")


def test_decode_bench_traces_split_steps_at_the_flush_and_tabulate_them():
    assert decode_bench.parse_args(["--trace-steps", "20"]).trace_steps == 20
    with pytest.raises(SystemExit):
        decode_bench.parse_args(["--trace-steps", "0"])
    flush = "flush"
    # Two steps: a forward kernel and a combine that starts inside it (a dependent launch) and ends 2
    # after it; the second step's kernels listed out of order. What precedes the first flush is not a step.
    activities = [
        (0.0, 1.0, "warm-up"),
        (10.0, 12.0, flush), (13.0, 23.0, "forward"), (14.0, 25.0, "combine"),
        (30.0, 32.0, flush), (34.0, 36.0, "combine"), (33.0, 35.0, "forward"),
    ]  # fmt: skip
    trace = decode_bench.step_trace(activities, {flush})
    # Steps of 12 and 3; the main kernel is the forward one (10 and 2 of its own; the combines' own
    # time is what outlasts it, 2 and 1), and 2 and 1 follow it.
    assert trace == decode_bench.StepTrace(kernels_per_step=2.0, step_us=7.5, main_kernel_us=6.0, after_main_us=1.5)
    # A short kernel first (a scheduler's) does not hide the main one.
    planned = [(0.0, 1.0, flush), (2.0, 3.0, "plan"), (3.5, 10.0, "forward"), (10.5, 12.0, "reduce")]
    trace = decode_bench.step_trace(planned, {flush})
    assert (trace.kernels_per_step, trace.step_us, trace.main_kernel_us, trace.after_main_us) == (3.0, 10.0, 6.5, 2.0)
    with pytest.raises(ValueError, match="no step"):
        decode_bench.step_trace([(0.0, 1.0, flush)], {flush})
    row = decode_bench.DecodeTiming("bf16", 1, 8192, 1, decode_bench.OURS, 0.02, 1700.0, **dataclasses.asdict(trace))
    untraced = decode_bench.DecodeTiming("bf16", 1, 8192, 1, decode_bench.SDPA, 0.02, 1700.0)
    lines = decode_bench.format_traces([untraced, row], [decode_bench.OURS, decode_bench.SDPA]).splitlines()
    headers = "| dtype | q | batch x keys | implementation | kernels | step µs | main kernel µs | after it µs |"
    assert lines[0] == headers
    assert lines[2:] == ["| bf16 | 1 | 1 x 8,192 | ours | 3.0 | 10.00 | 6.50 | 2.00 |"]


@pytest.mark.gpu
def test_decode_bench_traces_a_steps_kernels_on_the_gpu():
    torch = pytest.importorskip("torch")
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
    out = torch.empty_like(a)

    def step():  # an elementwise kernel, then the longer matrix product's
        torch.add(a, 1, out=out)
        torch.matmul(a, a, out=out)

    trace = decode_bench.trace_steps(torch, step, 5)
    # The flush before each step splits the trace into steps and is no kernel of theirs (the
    # elementwise kernel differs from the flush's fill by its dtype).
    assert 2.0 <= trace.kernels_per_step <= 4.0
    assert 0.0 < trace.main_kernel_us <= trace.step_us
    assert trace.after_main_us < trace.main_kernel_us


def test_decode_bench_takes_an_e4m3_cache_with_16_bit_queries(capsys):
    assert decode_bench.parse_args([]).kv_dtype == "same"
    args = decode_bench.parse_args(["--kv-dtype", "e4m3", "--dtypes", "bf16", "half"])
    assert (args.kv_dtype, args.dtypes) == ("e4m3", ["bf16", "fp16"])
    with pytest.raises(SystemExit) as exit_info:
        decode_bench.parse_args(["--kv-dtype", "fp16"])
    assert exit_info.value.code == 2 and "invalid choice: 'fp16'" in capsys.readouterr().err
    # The queries stay 16-bit: e4m3 among --dtypes is refused, with the option that makes the cache FP8.
    with pytest.raises(SystemExit) as exit_info:
        decode_bench.parse_args(["--kv-dtype", "e4m3", "--dtypes", "bf16", "e4m3"])
    assert exit_info.value.code == 2 and "an e4m3 cache is --kv-dtype e4m3" in capsys.readouterr().err


def test_varlen_bench_takes_the_ragged_lengths_given_or_draws_them():
    given = varlen_bench.parse_args(["--lengths", *map(str, [64] * 30), "8192"])
    lengths, origin = varlen_bench.ragged_batch(given)
    assert lengths == (64,) * 30 + (8192,) and "as given" in origin
    drawn = varlen_bench.parse_args(
        ["--total-tokens", "4096", "--min-len", "100", "--max-len", "900", "--seed", "3", "--equal-lengths", "512"]
    )
    lengths, origin = varlen_bench.ragged_batch(drawn)
    assert sum(lengths) == 4096 and all(length <= 900 for length in lengths)
    assert lengths == varlen_bench.ragged_lengths(4096, 100, 900, 3) and "seed 3" in origin
    with pytest.raises(SystemExit):
        varlen_bench.parse_args(["--lengths", "0"])


def test_varlen_bench_calls_fa3_by_position_and_fa4_by_keyword_and_keeps_the_output():
    batch = varlen_bench.Batch((3, 5), heads=2, d_head=64, causal=True)
    seen = {}

    def fa3(*args, **kwargs):
        seen["fa3"] = (args, kwargs)
        return "fa3 output"

    def fa4(*args, **kwargs):
        seen["fa4"] = (args, kwargs)
        return "fa4 output", "fa4 lse"

    assert varlen_bench.flash_peer_call(varlen_bench.FA3, fa3, batch, "q", "k", "v", "cu")() == "fa3 output"
    assert seen["fa3"] == (("q", "k", "v", "cu", "cu", 5, 5), {"causal": True})
    assert varlen_bench.flash_peer_call(varlen_bench.FA4, fa4, batch, "q", "k", "v", "cu")() == "fa4 output"
    keywords = {"cu_seqlens_q": "cu", "cu_seqlens_k": "cu", "max_seqlen_q": 5, "max_seqlen_k": 5, "causal": True}
    assert seen["fa4"] == (("q", "k", "v"), keywords)


def test_varlen_bench_config_runs_its_own_dtype_and_head_size():
    short_form = "sm90(BF16, 64, 128, 128, 2): ws+pingpong+overlap+persistent+qregs"
    args = varlen_bench.parse_args(["--config", short_form])
    assert args.config.short_form() == short_form and (args.dtypes, args.d_heads) == (["bf16"], [64])
    assert varlen_bench.parse_args([]).config is None
    with pytest.raises(SystemExit):
        varlen_bench.parse_args(["--config", short_form, "--d-heads", "128"])


def test_varlen_bench_runs_ours_on_the_named_configuration_packed_and_dense(monkeypatch):
    """--config: both of our calls go through forward on that configuration, the packed one with the
    batch's cu_seqlens and longest length; without it, the public calls (the automatic choice)."""
    seen = []
    fake = types.SimpleNamespace(
        forward=lambda *args, **kwargs: seen.append(("forward", args, kwargs)),
        flash_attn_varlen_func=lambda *args, **kwargs: seen.append(("flash_attn_varlen_func", args, kwargs)),
        flash_attn_func=lambda *args, **kwargs: seen.append(("flash_attn_func", args, kwargs)),
    )
    monkeypatch.setitem(sys.modules, "flash_attention", fake)

    class Packed:
        def __init__(self, name):
            self.name = name

        def view(self, *shape):
            return (self.name, shape)

    q, k, v = Packed("q"), Packed("k"), Packed("v")
    batch = varlen_bench.Batch((4, 4), heads=2, d_head=64, causal=True)
    varlen_bench.ours_packed_call("CFG", batch, q, k, v, "cu")()
    varlen_bench.ours_dense_call("CFG", batch, q, k, v)()
    varlen_bench.ours_packed_call(None, batch, q, k, v, "cu")()
    varlen_bench.ours_dense_call(None, batch, q, k, v)()
    lengths = {"cu_seqlens_q": "cu", "cu_seqlens_k": "cu", "max_seqlen_q": 4, "max_seqlen_k": 4}
    views = tuple((name, (2, 4, 2, 64)) for name in "qkv")
    assert seen == [
        ("forward", ("CFG", q, k, v), {"causal": True, **lengths}),
        ("forward", ("CFG", *views), {"causal": True}),
        ("flash_attn_varlen_func", (q, k, v, "cu", "cu", 4, 4), {"causal": True}),
        ("flash_attn_func", views, {"causal": True}),
    ]


def test_varlen_bench_table_shows_a_missing_peer_as_missing():
    batch = varlen_bench.Batch((100, 200), heads=16, d_head=128, causal=False)
    statuses = {varlen_bench.FA4: varlen_bench.NOT_INSTALLED, "sdpa_cudnn": varlen_bench.REFUSED}
    rows = [
        varlen_bench.timing("ragged", batch, "bf16", name, 2.0 if name == "ours" else 4.0, statuses.get(name, ""))
        for name in ("ours", *varlen_bench.PEERS)
    ]
    table = varlen_bench.format_ragged_table(rows)
    header, _, line = table.splitlines()
    assert "| FA3 | FA4 |" in header and "| ours/FA3 | ours/FA4 |" in header
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    by_header = dict(zip([cell.strip() for cell in header.strip("|").split("|")], cells))
    assert by_header["FA4"] == by_header["ours/FA4"] == varlen_bench.NOT_INSTALLED
    assert by_header["ours/FA3"] == "2.000" and by_header["ours/SDPA CUDNN"] == varlen_bench.REFUSED


def test_varlen_bench_kernel_times_group_a_calls_kernels():
    """--kernel-times: the profiler's events of several calls, one row per kernel in the order of
    its first launch, ours named by configuration, launches per call and mean time per launch."""
    cfg = parse_kernel_name_into_config("sm90(BF16, 128, 128, 128, 2): ws+pingpong+overlap+persistent")
    attention = cfg.demangled_kernel_name()
    plan = "flash::sm90::varlen_plan_sorted_forward_kernel<1>(flash::ForwardParams, flash::sm90::VarlenPlanLayout)"
    events = [("Memset (Device)", 1.0), (plan, 8.0), (attention, 500.0)] * 2
    events += [("Memset (Device)", 3.0), (plan, 10.0), (attention, 502.0)]
    times = varlen_bench.kernel_times(events, calls=3)
    assert [t.label for t in times] == ["Memset", "flash::sm90::varlen_plan_sorted_forward_kernel", cfg.short_form()]
    assert [t.launches_per_call for t in times] == [1.0, 1.0, 1.0]
    assert [round(t.us_per_launch, 3) for t in times] == [round(5 / 3, 3), round(26 / 3, 3), round(1502 / 3, 3)]

    batch = varlen_bench.Batch((512,) * 4, heads=16, d_head=128, causal=False)
    twice = [varlen_bench.KernelTime("memset", 2.0, 1.5)]
    table = varlen_bench.format_kernel_times([("bf16", batch, "varlen", times), ("bf16", batch, "dense", twice)])
    header, _, *lines = table.splitlines()
    assert [cell.strip() for cell in header.strip("|").split("|")][-3:] == ["launches per call", "µs per launch", "µs per call"]
    assert len(lines) == 4 and "| dense | memset | 2.00 | 1.5 | 3.0 |" in lines[-1]
    assert not varlen_bench.parse_args([]).kernel_times and varlen_bench.parse_args(["--kernel-times"]).kernel_times


def test_generate_bench_tabulates_tokens_per_second_and_agreement():
    args = generate_bench.parse_args(["--batches", "1", "32", "--layers", "2"])
    assert (args.batches, args.layers, args.prompt_tokens, args.new_tokens) == ([1, 32], 2, 128, 256)
    assert not args.continuous_batching and generate_bench.parse_args(["--continuous-batching"]).continuous_batching
    rows = [
        generate_bench.GenerateTiming(32, 128, 256, generate_bench.OURS, 2.0, 4096.0),
        generate_bench.GenerateTiming(32, 128, 256, generate_bench.SDPA, 2.5, 3276.8),
    ]
    lines = generate_bench.format_results(rows, {32: 0.5}).splitlines()
    assert lines[0] == "| batch | prompt | new tokens | ours tokens/s | SDPA tokens/s | ours/SDPA | same tokens |"
    assert lines[2] == "| 32 | 128 | 256 | 4096 | 3277 | 1.250 | 50.0% |"


def test_power_bench_reads_nvidia_smi_samples_and_leaves_out_the_settling():
    # nvidia-smi's csv,noheader,nounits lines; a field a GPU does not report reads [N/A].
    samples = power_bench.parse_samples("1980, 120.5, 40\n[N/A], 100.0, 41\n1500, 690.25, 58\n\n1560, 688.0, 59\n")
    assert samples == [
        power_bench.Sample(1980, 120.5, 40), power_bench.Sample(1500, 690.25, 58), power_bench.Sample(1560, 688.0, 59)
    ]  # fmt: skip
    # The first third of the timings and samples is the clock settling, left out.
    run = power_bench.summarize("k", "random", 2e12, [1.0, 4.0, 4.0, 5.0, 4.0, 3.0], samples)
    assert run.tflops == pytest.approx(2e12 / 4.0 / 1e9)
    assert (run.sm_clock_mhz, run.power_w, run.max_temperature_c) == (1530, 689.125, 59)


def test_power_bench_without_nvidia_smi_names_it(monkeypatch, capsys):
    monkeypatch.setattr(common, "gpu_available", lambda: True)
    assert power_bench.main(["4096", "128", "--nvidia-smi", "/nonexistent/nvidia-smi"]) == 1
    assert "/nonexistent/nvidia-smi not found" in capsys.readouterr().err


def test_power_bench_reports_work_per_cycle_and_energy_per_flop_and_names_a_missing_peer():
    runs = [
        power_bench.SustainedRun("ours", "random", 640.0, 1600.0, 690.0, 70.0),
        power_bench.SustainedRun("FA3", "random", 680.0, 1620.0, 680.0, 71.0),
    ]
    assert runs[0].tflops_per_ghz == pytest.approx(400.0)
    assert runs[1].tflop_per_joule == pytest.approx(1.0)
    text = power_bench.format_runs(runs, {"FA4": "ModuleNotFoundError: No module named 'flash_attn'"})
    assert "TFLOP/s per GHz" in text and "400.0" in text and "419.8" in text
    assert "TFLOP/J" in text and "0.928" in text and "1.000" in text
    assert text.splitlines()[-1] == "FA4: missing: ModuleNotFoundError: No module named 'flash_attn'"


def test_ceiling_bench_counts_each_warpgroup_s_products_and_their_depth_per_dtype():
    kernels = types.SimpleNamespace(wgmma_m=64, wgmma_k_bytes=32, warpgroups_per_sm=3, products_per_iteration=8)
    # 132 SMs x 3 warpgroups x 10 iterations x 8 products, each 2 * 64 * N * K: K = 16 for 16-bit, 32 for e4m3.
    assert ceiling_bench.tensor_flop(132, 256, 2, 10, kernels) == 132 * 3 * 10 * 8 * 2 * 64 * 256 * 16
    assert ceiling_bench.tensor_flop(132, 256, 1, 10, kernels) == 2 * ceiling_bench.tensor_flop(132, 256, 2, 10, kernels)


def test_ceiling_bench_rates_leave_out_the_settling_and_name_a_missing_ceiling():
    samples = [power_bench.Sample(1980, 300, 40), power_bench.Sample(1755, 690, 60), power_bench.Sample(1740, 688, 61)]
    # 4 GB per call: the settled median of 1.0 ms (2.0 is the settling third) is 4,000 GB/s.
    read = ceiling_bench.ceiling_from("HBM read", "GB/s", 4e9, [2.0, 1.0, 1.0], samples)
    assert read.rate == pytest.approx(4000.0) and (read.sm_clock_mhz, read.power_w) == (1747.5, 689.0)
    tensor = ceiling_bench.ceiling_from("tensor pipe", "TFLOP/s", 8.58e11, [1.0, 1.0, 1.0], samples)
    assert tensor.rate == pytest.approx(858.0) and tensor.rate_per_watt == pytest.approx(858.0 / 689.0)
    text = ceiling_bench.format_ceilings([read, tensor], {"torch.matmul 8192^3 e4m3": "RuntimeError: no fp8 gemm"})
    assert "4000.0" in text and "858.0" in text and "TFLOP/s" in text and "GB/s" in text
    assert text.splitlines()[-1] == "torch.matmul 8192^3 e4m3: missing: RuntimeError: no fp8 gemm"


def test_transposed_v_copy_bench_reference_orders_each_16_keys_as_p_holds_them():
    """Column c's row holds the keys rounded up to 16 with zeros, slots 4u .. 4u + 3 of each 16 being
    keys 2u, 2u + 1, 2u + 8 and 2u + 9."""
    torch = pytest.importorskip("torch")
    seq, d_head = 20, 16
    values = torch.arange(seq * d_head, dtype=torch.int32).remainder(251).add(1).to(torch.uint8)
    v = values.view(1, seq, 1, d_head).view(torch.float8_e4m3fn)
    copy = transposed_v_copy_bench.expected_copy(v)
    assert copy.shape == (1, 1, d_head, 32)
    key_of_slot = [0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15]
    for column in (0, 5, 15):
        row = copy[0, 0, column]
        assert row[:16].tolist() == [values[key * d_head + column].item() for key in key_of_slot]
        # The second group: keys 16 .. 19 at their slots, zeros for the keys past the sequence.
        assert row[16:].tolist() == [values[(16 + key) * d_head + column].item() if key < 4 else 0 for key in key_of_slot]


def test_ceiling_bench_arguments():
    args = ceiling_bench.parse_args(["--what", "tensor", "read", "--dtypes", "e4m3", "--n", "128", "256"])
    assert (args.what, args.dtypes, args.n) == (["tensor", "read"], ["e4m3"], [128, 256])
    for bad in (["--n", "100"], ["--seconds", "0"], ["--what", "softmax"]):
        with pytest.raises(SystemExit):
            ceiling_bench.parse_args(bad)


def test_ceiling_bench_without_nvidia_smi_names_it(monkeypatch, capsys):
    monkeypatch.setattr(common, "gpu_available", lambda: True)
    assert ceiling_bench.main(["--nvidia-smi", "/nonexistent/nvidia-smi"]) == 1
    assert "/nonexistent/nvidia-smi not found" in capsys.readouterr().err


def test_power_bench_peers_and_the_llama70b_shape():
    args = power_bench.parse_args(["8192", "128", "--peers", "fa3", "fa4", "--shape", "llama70b", "--causal"])
    assert args.peers == ["fa3", "fa4"]
    assert common.shape_problem(args.shape, args.seq_len, args.d_head, args.causal) == common.Problem(
        2, 8192, 8192, 64, 8, 128, True
    )
    assert common.shape_problem("standard", 4096, 64) == common.benchmark_problem(4096, 64)
    with pytest.raises(SystemExit):
        power_bench.parse_args(["8192", "64", "--shape", "llama70b"])


def test_power_bench_rejects_a_loop_of_no_time():
    with pytest.raises(SystemExit):
        power_bench.parse_args(["4096", "128", "--seconds", "0"])


def test_ncu_bench_without_ncu():
    result = run_tool(sys.executable, str(BENCHMARK_DIR / "ncu_bench.py"), "--ncu", "/nonexistent/ncu")
    assert result.returncode == 1
    assert "/nonexistent/ncu" in result.stderr and "not found" in result.stderr


# ----------------------------------------------------------------------------------------------
# Shared pieces


def test_benchmark_shapes():
    assert common.BATCH_BY_SEQ_LEN == {512: 16, 1024: 16, 2048: 16, 4096: 16, 8192: 8, 16384: 4}
    assert [common.batch_for_seq_len(seq_len) for seq_len in (1000, 4000, 8000, 100000)] == [16, 16, 8, 1]
    # heads * d_head is 2048, or the nearest below it where d_head does not divide 2048.
    assert common.HEADS_BY_D_HEAD == {32: 64, 48: 42, 64: 32, 80: 25, 96: 21, 128: 16, 160: 12, 192: 10, 224: 9, 256: 8}
    assert set(D_HEADS) == {32, 64, 96, 128, 192, 256}


def test_benchmark_problems():
    assert common.benchmark_problem(8000, 128) == common.Problem(8, 8000, 8000, 16, 16, 128, False)
    gqa = common.benchmark_problem(4096, 64, causal=True, gqa_ratio=4)
    assert gqa == common.Problem(16, 4096, 4096, 32, 8, 64, True)
    assert gqa.describe() == "batch 16, seq 4096, 32 heads (8 k/v heads), d_head 64, causal"
    with pytest.raises(ValueError, match="does not divide the 21 heads of d_head 96"):
        common.benchmark_problem(4096, 96, gqa_ratio=2)


def test_flop_counts_without_a_mask_are_the_problem_counts():
    assert common.flop_counts(128, 4, 16, 2048) == (attention_flop(4, 16, 2048, 128), total_flop(4, 16, 2048, 128))
    assert common.Problem(4, 2048, 2048, 16, 4, 128).flop_counts() == common.flop_counts(128, 4, 16, 2048)
    assert common.tflops(2e12, 1000.0) == pytest.approx(2.0)
    assert math.isnan(common.tflops(1e12, math.nan))


def _attended_pairs(seqlen_q: int, seqlen_k: int) -> int:
    """The pairs the bottom-right-aligned causal mask keeps, counted one by one."""
    return sum(1 for i in range(seqlen_q) for j in range(seqlen_k) if j <= i + seqlen_k - seqlen_q)


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(5, 9), (9, 5), (1, 7), (7, 1), (64, 1000), (1000, 64)])
def test_causal_flops_count_the_unmasked_pairs_for_other_lengths(seqlen_q, seqlen_k):
    assert common.score_pairs(seqlen_q, seqlen_k, causal=True) == _attended_pairs(seqlen_q, seqlen_k)
    problem = common.Problem(2, seqlen_q, seqlen_k, 8, 2, 64, causal=True)
    assert f"seq {seqlen_q} x {seqlen_k}, 8 heads (2 k/v heads)" in problem.describe()
    assert common.flop_rule(problem) == "4 * batch * heads_q * d_head per unmasked (query, key) pair (causal)"
    pairs = 2 * 8 * _attended_pairs(seqlen_q, seqlen_k)
    assert problem.flop_counts() == (4 * 64 * pairs, 4 * 64 * pairs + 5 * pairs + 2 * 8 * seqlen_q * 64)


@pytest.mark.parametrize("seq_len", [7, 4096])
def test_causal_flops_for_equal_lengths_are_half_as_flash_attention_counts(seq_len):
    assert common.score_pairs(seq_len, seq_len, causal=True) == seq_len**2 / 2  # not n (n + 1) / 2
    attn, total = common.flop_counts(128, 4, 16, seq_len, causal=True)
    assert attn == attention_flop(4, 16, seq_len, 128) / 2
    assert total == (total_flop(4, 16, seq_len, 128) - 4 * 16 * seq_len * 128) / 2 + 4 * 16 * seq_len * 128
    unmasked = "4 * batch * heads_q * seqlen_q * seqlen_k * d_head"
    assert common.flop_rule(common.benchmark_problem(seq_len, 128, causal=True)).startswith(f"half of {unmasked}")
    assert common.flop_rule(common.benchmark_problem(seq_len, 128)) == unmasked


def test_benchmark_lengths_are_multiples_of_the_unit_the_build_assumes():
    # variants_to_build compiles masked tails for tuning configurations whose blocks do not divide it.
    assert all(seq_len % BENCHMARK_LENGTH_UNIT == 0 for seq_len in common.SEQ_LENS)


class TestFits:
    """A configuration fits a problem if it has the problem's dtype and d_head and the kernel variant
    the problem needs is compiled: tuning builds have the aligned unmasked and causal variants,
    default builds every variant."""

    tuned = next(cfg for cfg in TUNE if cfg.dtype == DType.FP16 and cfg.d_head == 128 and cfg.B_r == 128)
    variants = {tuned: frozenset(BENCHMARK_VARIANTS), NOT_TUNED: frozenset(ALL_VARIANTS)}

    def test_aligned_lengths_fit_with_either_mask(self):
        for causal in (False, True):
            problem = common.benchmark_problem(4096, 128, causal)
            assert common.needed_variant(self.tuned, problem) == ProblemVariant(
                MaskKind.CAUSAL if causal else MaskKind.NONE
            )
            assert common.fits(self.tuned, DType.FP16, problem, self.variants)
            assert not common.fits(self.tuned, DType.BF16, problem, self.variants)
            assert not common.fits(self.tuned, DType.FP16, common.benchmark_problem(4096, 64, causal), self.variants)

    @pytest.mark.parametrize("seq_len", [1000, 4096 + 64])
    def test_other_lengths_need_the_masked_tails_variant(self, seq_len):
        problem = common.benchmark_problem(seq_len, 128, causal=True)  # 4160 is no multiple of B_r = 128
        assert common.needed_variant(self.tuned, problem) == CAUSAL_TAILS
        assert not common.fits(self.tuned, DType.FP16, problem, self.variants)
        assert common.fits(self.tuned, DType.FP16, problem, {self.tuned: frozenset(ALL_VARIANTS)})

    def test_a_configuration_not_compiled_fits_nothing(self):
        assert not common.fits(CFG_B, CFG_B.dtype, common.benchmark_problem(4096, 128), self.variants)

    def test_a_larger_head_size_fits_only_with_larger_heads(self):
        # d_head 96 served by 128: the SM80 family pads it with masked tails, the Hopper family's
        # tensor maps end at the call's columns, so its aligned variant serves it.
        problem = common.benchmark_problem(4096, 96)
        assert common.needed_variant(self.tuned, problem) == ProblemVariant(MaskKind.NONE, masked_tails=True)
        assert common.needed_variant(SM90_128, problem) == ProblemVariant(MaskKind.NONE)
        variants = {self.tuned: frozenset(ALL_VARIANTS), SM90_128: frozenset(BENCHMARK_VARIANTS)}
        for cfg in (self.tuned, SM90_128):
            assert not common.fits(cfg, DType.FP16, problem, variants)
            assert common.fits(cfg, DType.FP16, problem, variants, larger_heads=True)
        # ... where the variant it needs is compiled, and never a smaller head size.
        assert not common.fits(self.tuned, DType.FP16, problem, self.variants, larger_heads=True)
        assert not common.fits(SM90_128, DType.FP16, common.benchmark_problem(4096, 160), variants, larger_heads=True)


def test_harmonic_mean():
    assert common.harmonic_mean([100.0, 300.0]) == pytest.approx(150.0)
    assert common.harmonic_mean([100.0, math.nan, 300.0]) == pytest.approx(150.0)
    assert math.isnan(common.harmonic_mean([]))


def test_format_table_aligns_numbers_right_and_text_left():
    table = common.format_table(["name", "value"], [["a", 1.25], ["longer", math.nan]], float_formats={1: ".2f"})
    assert table.splitlines() == ["name    value", "------  -----", "a        1.25", "longer      -"]


def test_progress_in_a_log_prints_a_line_per_tenth():
    code = (
        "import bench_common\n"
        "with bench_common.Progress(25, 'work') as progress:\n"
        "    for i in range(25):\n"
        "        progress.update()\n"
        "        if i == 3:\n"
        "            progress.write('a note')\n"
    )
    result = run_tool(sys.executable, "-c", code, cwd=BENCHMARK_DIR)  # stderr is a pipe, not a terminal
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == "work 1/25" and "a note" in lines and lines[-1] == "work 25/25"
    assert len(lines) <= 12


class TestConfigSelection:
    compiled = sorted([CFG_A, NOT_TUNED])

    def test_default_is_every_compiled_configuration(self, monkeypatch):
        monkeypatch.delenv(KERNELS_ENV, raising=False)
        assert common.select_compiled_configs(None, self.compiled, "default") == self.compiled

    def test_named_configuration_not_compiled_is_an_error_naming_the_build_variable(self, monkeypatch):
        monkeypatch.delenv(KERNELS_ENV, raising=False)
        with pytest.raises(common.ConfigSelectionError, match=BUILD_KERNELS_ENV) as error:
            common.select_compiled_configs(f"{CFG_A.short_form()};{CFG_B.short_form()}", self.compiled, "default")
        listed = [line.strip() for line in str(error.value).splitlines() if line.startswith("  ")]
        assert listed == [CFG_B.short_form()]

    def test_set_is_intersected_with_the_build(self, monkeypatch, capsys):
        monkeypatch.setenv(KERNELS_ENV, "tune")
        assert common.select_compiled_configs(None, self.compiled, "default") == [CFG_A]
        assert BUILD_KERNELS_ENV in capsys.readouterr().err

    def test_set_with_nothing_compiled_is_an_error(self, monkeypatch):
        monkeypatch.delenv(KERNELS_ENV, raising=False)
        block_sizes = next((cfg.B_r, cfg.B_c) for cfg in TUNE if (cfg.B_r, cfg.B_c) != (CFG_A.B_r, CFG_A.B_c))
        with pytest.raises(common.ConfigSelectionError, match=BUILD_KERNELS_ENV):
            common.select_compiled_configs("%d,%d" % block_sizes, self.compiled, "default")

    def test_default_key_applies_only_without_kernels(self, monkeypatch):
        monkeypatch.delenv(KERNELS_ENV, raising=False)
        assert common.select_compiled_configs(None, self.compiled, "default", default_key="tune") == [CFG_A]
        monkeypatch.setenv(KERNELS_ENV, NOT_TUNED.short_form())
        assert common.select_compiled_configs(None, self.compiled, "default", default_key="tune") == [NOT_TUNED]

    def test_unknown_key(self, monkeypatch):
        monkeypatch.delenv(KERNELS_ENV, raising=False)
        with pytest.raises(common.ConfigSelectionError, match="unknown kernel set"):
            common.select_compiled_configs("fastest", self.compiled, "default")


class TestRunnableConfigs:
    """A build for sm_80 and sm_90 holds kernels some of its GPUs cannot run (``cfg.runs_on``): the
    tools that run kernels leave those out with a note, and refuse when none is left."""

    # An SM80 configuration whose shared memory fits sm_80's 163 KiB but not sm_86's 99 KiB.
    too_big_for_sm86 = next(
        cfg for cfg in TUNE if isinstance(cfg, FlashForwardKernelConfig) and 101376 < cfg.smem_bytes() <= 166912
    )

    def test_sm90_runs_both_families(self, capsys):
        assert common.select_runnable_configs([CFG_A, SM90_128], (9, 0), "H200") == [CFG_A, SM90_128]
        assert capsys.readouterr().err == ""

    def test_other_gpus_leave_the_hopper_family_out(self, capsys):
        assert common.select_runnable_configs([SM90_WS, CFG_A, SM90_128], (8, 0), "A100") == [CFG_A]
        err = capsys.readouterr().err
        assert err.startswith("note: 2 selected configuration(s) (2 of family sm90) do not run on A100 (sm_80)")

    def test_shared_memory_beyond_the_gpu_s_is_left_out_too(self, capsys):
        configs = [CFG_A, self.too_big_for_sm86]
        assert common.select_runnable_configs(configs, (8, 0), "A100") == configs
        assert common.select_runnable_configs(configs, (8, 6), "RTX") == [CFG_A]
        assert "(1 of family sm80) do not run on RTX (sm_86)" in capsys.readouterr().err

    def test_nothing_runnable_is_an_error(self):
        with pytest.raises(common.ConfigSelectionError, match=r"none of the selected configurations runs on this GPU"):
            common.select_runnable_configs([SM90_128], (8, 9), "L4")


def test_timing_csv_round_trip(tmp_path):
    causal_gqa = common.benchmark_problem(1000, 128, causal=True, gqa_ratio=4)
    rows = [
        common.timing_row("fp16", causal_gqa, "ours", CFG_A.short_form(), 0.5),
        common.timing_row("fp16", causal_gqa, "sdpa_efficient", common.GQA_REPEATED, 1.0),
        common.timing_row("fp16", common.benchmark_problem(1024, 128), "sdpa_flash", "", math.nan),
    ]
    assert rows[0].tflops == pytest.approx(4 * 16 * 16 * 1000**2 * 128 / 2 / 0.5e-3 / 1e12)
    common.write_csv(tmp_path / "sub" / "t.csv", rows, common.TIMING_FIELDS)
    with open(tmp_path / "sub" / "t.csv", newline="") as file:
        assert next(csv.reader(file)) == [
            "dtype", "d_head", "causal", "seq_len", "seqlen_k", "batch", "heads", "heads_kv",
            "implementation", "config", "time_ms", "tflops",
        ]  # fmt: skip
    read = common.read_timing_csv(tmp_path / "sub" / "t.csv")
    assert read[:2] == rows[:2] and read[0].problem == causal_gqa
    assert read[2].implementation == "sdpa_flash" and not read[2].causal and math.isnan(read[2].time_ms)


def test_timing_csv_from_before_masks_and_gqa(tmp_path):
    """Files written before the causal, seqlen_k and heads_kv columns are of unmasked self-attention
    without GQA."""
    (tmp_path / "old.csv").write_text(
        "dtype,d_head,seq_len,batch,heads,implementation,config,time_ms,tflops\n"
        f'fp16,128,1024,16,16,ours,"{CFG_A.short_form()}",0.5,549.8\n'
    )
    (row,) = common.read_timing_csv(tmp_path / "old.csv")
    assert row.problem == common.benchmark_problem(1024, 128)
    assert (row.config, row.time_ms, row.tflops) == (CFG_A.short_form(), 0.5, 549.8)


# ----------------------------------------------------------------------------------------------
# SDPA references (on the CPU, where only the FLASH backend of the three runs)


def _attention(q, k, v, causal: bool):
    """Attention in float32 in our (batch, seq, heads, d_head) layout: k and v heads repeated for
    GQA, the causal mask aligned bottom-right."""
    import torch

    group = q.shape[2] // k.shape[2]
    q, k, v = (t.float().transpose(1, 2) for t in (q, k, v))
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    if causal:
        seqlen_q, seqlen_k = scores.shape[-2:]
        keep = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool).tril(diagonal=seqlen_k - seqlen_q)
        scores = scores.masked_fill(~keep, -math.inf)
    return (scores.softmax(dim=-1) @ v).transpose(1, 2)


def _cpu_inputs(problem, dtype=DType.FP16, monkeypatch=None):
    monkeypatch.setattr(common, "DEVICE", "cpu")
    return common.make_inputs(problem, dtype, seed=0)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_call_groups_query_heads_and_masks_like_ours(causal, monkeypatch):
    pytest.importorskip("torch")
    q, k, v = _cpu_inputs(common.Problem(2, 64, 64, 8, 2, 32, causal), monkeypatch=monkeypatch)
    assert (q.shape, k.shape, v.shape) == ((2, 64, 8, 32), (2, 64, 2, 32), (2, 64, 2, 32))
    call = common.sdpa_call("flash", q, k, v, causal)
    assert call.gqa == common.GQA_NATIVE
    assert (call.output.float() - _attention(q, k, v, causal)).abs().max().item() < 1e-2
    assert (call.output.float() - _attention(q, k, v, not causal)).abs().max().item() > 1e-1
    assert common.sdpa_call("flash", q, k.repeat(1, 1, 4, 1), v.repeat(1, 1, 4, 1)).gqa == ""


def test_sdpa_call_repeats_kv_heads_for_a_backend_that_rejects_enable_gqa(monkeypatch):
    torch = pytest.importorskip("torch")
    q, k, v = _cpu_inputs(common.Problem(2, 64, 64, 8, 2, 32, True), monkeypatch=monkeypatch)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def without_gqa(*args, **kwargs):
        if kwargs.pop("enable_gqa", False):
            raise RuntimeError("No available kernel. Aborting execution.")
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", without_gqa)
    call = common.sdpa_call("flash", q, k, v, causal=True)
    assert call.gqa == common.GQA_REPEATED
    assert (call.output.float() - _attention(q, k, v, causal=True)).abs().max().item() < 1e-2


@pytest.mark.parametrize("reference", ["cudnn", "efficient"])
def test_sdpa_call_of_a_backend_that_cannot_run_raises(reference, monkeypatch):
    pytest.importorskip("torch")
    q, k, v = _cpu_inputs(common.Problem(1, 64, 64, 4, 1, 32), monkeypatch=monkeypatch)  # no CPU kernel
    with pytest.raises(RuntimeError):
        common.sdpa_call(reference, q, k, v)


def test_sdpa_causal_only_for_equal_lengths(monkeypatch):
    pytest.importorskip("torch")
    q, k, v = _cpu_inputs(common.Problem(1, 32, 64, 4, 4, 32, True), monkeypatch=monkeypatch)
    with pytest.raises(ValueError, match="seqlen_q = seqlen_k"):
        common.sdpa_runner(q, k, v, causal=True)


# ----------------------------------------------------------------------------------------------
# pt_bench tables and plot


def _pt_bench_rows(causal=False, gqa_ratio=1, efficient_gqa=""):
    def row(seq_len, implementation, config, time_ms):
        problem = common.benchmark_problem(seq_len, 128, causal, gqa_ratio)
        return common.timing_row("fp16", problem, implementation, config, time_ms)

    return [
        row(1024, "ours", CFG_A.short_form(), 1.0),
        row(1024, "ours", CFG_B.short_form(), 2.0),
        row(1024, pt_bench.AUTO, CFG_A.short_form(), 1.25),
        row(1024, "sdpa_flash", "", 0.5),
        row(1024, "sdpa_cudnn", "", 0.25),
        row(1024, "sdpa_efficient", pt_bench.MISSING + "RuntimeError: No available kernel.", math.nan),
        row(1024, "peer_fa3", "", 2.0),
        row(1024, "peer_fa4", pt_bench.MISSING + "ImportError: no flash_attn.cute", math.nan),
        row(2048, "ours", CFG_B.short_form(), 2.0),
        row(2048, pt_bench.AUTO, CFG_B.short_form(), 2.0),
        row(2048, "sdpa_flash", "", 1.0),
        row(2048, "sdpa_cudnn", "", 1.0),
        row(2048, "sdpa_efficient", efficient_gqa, 4.0),
        row(2048, "peer_fa3", "", 1.0),
        row(2048, "peer_fa4", pt_bench.MISSING + "ImportError: no flash_attn.cute", math.nan),
    ]


def test_pt_bench_table_shows_the_best_configuration_and_the_ratios_to_flash_cudnn_and_the_peers():
    lines = pt_bench.format_group_table(_pt_bench_rows()).splitlines()
    assert lines[0] == "fp16, d_head 128, 16 heads, no mask (TFLOP/s)"
    assert lines[1] == "FLOPs: 4 * batch * heads_q * seqlen_q * seqlen_k * d_head"
    assert lines[2].split() == [
        "seq", "batch", "best", "config", "ours", "auto", "FLASH", "CUDNN", "EFFICIENT", "FA3", "FA4", "ours/FLASH",
        "ours/CUDNN", "ours/FA3", "ours/FA4", "auto/ours", "choice/ours",
    ]  # fmt: skip
    # 1.0 ms against FLASH's 0.5 ms, CUDNN's 0.25 ms and FA3's 2.0 ms; EFFICIENT could not run at
    # 1024, FA4 nowhere (each is missing, and shown so with why); auto chose the best configuration,
    # and took 1.25 ms, 0.8 of its speed, timed apart.
    assert CFG_A.short_form() in lines[4]
    assert lines[4].split()[-9:] == ["-", "68.7", "-", "0.500", "0.250", "2.000", "-", "0.800", "1.000"]
    assert CFG_B.short_form() in lines[5]
    assert lines[5].split()[-6:] == ["0.500", "0.500", "0.500", "-", "1.000", "1.000"]
    assert lines[6:] == [
        "harmonic mean of ours/FLASH over 2 sequence lengths: 0.500",
        "harmonic mean of ours/CUDNN over 2 sequence lengths: 0.333",
        "harmonic mean of ours/FA3 over 2 sequence lengths: 0.800",
        "automatic configuration chose the best at 2 of 2 lengths; choice/ours lowest 1.000; auto/ours (timed apart) "
        "lowest 0.800",
        "SDPA EFFICIENT missing at seq 1024: RuntimeError: No available kernel.",
        "FA4 missing at every length: ImportError: no flash_attn.cute",
    ]


def test_pt_bench_compares_ragged_lengths_with_the_next_multiple_of_128_per_flop():
    def ours(seq_len, time_ms):
        return common.timing_row("fp16", common.benchmark_problem(seq_len, 128), "ours", CFG_A.short_form(), time_ms)

    # 1000 and 1024 in the same time (the same batch): 1024 does (1024 / 1000)^2 as many FLOPs, so
    # 1000 takes 4.9% more time per FLOP. 4000 has no 4096 to compare with; 2048 is a multiple.
    rows = [ours(1000, 1.0), ours(1024, 1.0), ours(2048, 3.0), ours(4000, 9.0)]
    lines = pt_bench.format_group_table(rows).splitlines()
    assert [line for line in lines if "time per FLOP" in line] == [
        "seq 1000: +4.9% time per FLOP against seq 1024 (ours at both)"
    ]
    assert pt_bench.ragged_length_lines({1000: 500.0, 1024: 480.0, 8000: 600.0, 8064: math.nan}) == [
        "seq 1000: -4.0% time per FLOP against seq 1024 (ours at both)"
    ]


def test_pt_bench_times_a_head_size_without_configurations_of_its_own_through_automatic_configuration():
    problem = common.benchmark_problem(1024, 80)
    assert (problem.heads_q, problem.d_head) == (25, 80)
    rows = [
        common.timing_row("bf16", problem, pt_bench.AUTO, CFG_B.short_form(), 1.0),
        common.timing_row("bf16", problem, "sdpa_flash", "", 2.0),
    ]
    lines = pt_bench.format_group_table(rows).splitlines()
    assert f"auto: {CFG_B.short_form()}" in lines[4]
    assert lines[4].split()[-6:-4] == ["2.000", "-"]  # ours/FLASH counts auto's timing; no CUDNN row
    # No peer rows at all (not timed): shown as missing, never dropped.
    assert lines[-2:] == ["FA3 missing at every length: not timed", "FA4 missing at every length: not timed"]
    assert pt_bench.parse_args(["--d-heads", "40", "80", "224"]).d_heads == [40, 80, 224]
    for bad in ("84", "264", "0"):
        with pytest.raises(SystemExit):
            pt_bench.parse_args(["--d-heads", bad])


def test_pt_bench_judges_the_automatic_choice_by_its_own_timing_among_ours():
    rows = _pt_bench_rows()
    at_1024 = [row for row in rows if row.seq_len == 1024]
    auto = next(row for row in at_1024 if row.implementation == pt_bench.AUTO)
    slower_choice = dataclasses.replace(auto, config=CFG_B.short_form())
    at_1024 = [slower_choice if row is auto else row for row in at_1024]
    # CFG_B took 2.0 ms among ours against CFG_A's 1.0 ms.
    assert pt_bench.choice_tflops(at_1024) == pytest.approx(pt_bench.best_ours(at_1024).tflops / 2)


def test_median_timings_keep_each_rows_median_time_and_recount_its_tflops():
    """pt_bench's rounds and autotune's repeats: one row per implementation, configuration and
    problem, in the order they first appear, with the median of the times that ran."""
    rounds = [_pt_bench_rows(), _pt_bench_rows(), _pt_bench_rows()]
    rounds[1] = [dataclasses.replace(row, time_ms=row.time_ms * 4) for row in rounds[1]]
    rounds[2] = [dataclasses.replace(row, time_ms=row.time_ms / 2) for row in rounds[2][:1]] + rounds[2][1:]
    merged = common.median_timings(row for rows in rounds for row in rows)
    assert [(row.implementation, row.config, row.seq_len) for row in merged] == [
        (row.implementation, row.config, row.seq_len) for row in _pt_bench_rows()
    ]
    # The first row took 1.0, 4.0 and 0.5 ms: its median is 1.0 ms, at the first round's TFLOP/s.
    assert merged[0].time_ms == 1.0 and merged[0].tflops == pytest.approx(rounds[0][0].tflops)
    assert [row.time_ms for row in merged[1:]] == [row.time_ms for row in _pt_bench_rows()[1:]]
    # A backend that could not run in any round stays without a time; one that ran in some rounds
    # keeps the median of those.
    efficient = next(row for row in merged if row.implementation == "sdpa_efficient")
    assert math.isnan(efficient.time_ms) and math.isnan(efficient.tflops)
    partly = common.median_timings([rounds[0][0], dataclasses.replace(rounds[0][0], time_ms=math.nan)])
    assert [row.time_ms for row in partly] == [1.0]


def test_pt_bench_table_of_causal_gqa_says_how_flops_and_heads_were_counted():
    rows = _pt_bench_rows(causal=True, gqa_ratio=4, efficient_gqa=common.GQA_REPEATED)
    lines = pt_bench.format_group_table(rows).splitlines()
    assert lines[0] == "fp16, d_head 128, 16 heads, 4 k/v heads, causal (TFLOP/s)"
    assert lines[1].startswith("FLOPs: half of 4 * batch * heads_q * seqlen_q * seqlen_k * d_head (causal)")
    # Half the FLOPs in the same time: half the TFLOP/s; the ratios are the same.
    assert rows[0].tflops == pytest.approx(_pt_bench_rows()[0].tflops / 2)
    assert lines[4].split()[-6:] == ["0.500", "0.250", "2.000", "-", "0.800", "1.000"]
    assert lines[-3] == "SDPA EFFICIENT rejects enable_gqa: it was given k and v with each head repeated"


def test_pt_bench_plot(tmp_path):
    pytest.importorskip("matplotlib")
    pt_bench.plot(str(tmp_path / "plot.png"), _pt_bench_rows() + _pt_bench_rows(causal=True))
    assert (tmp_path / "plot.png").read_bytes().startswith(b"\x89PNG")


def test_pt_bench_arguments_make_one_group_per_dtype_d_head_and_mask():
    args = pt_bench.parse_args(
        ["--seq-lens", "1000", "4000", "8000", "--d-heads", "64", "256", "--dtypes", "bf16", "--causal", "both",
         "--gqa-ratio", "4"]
    )  # fmt: skip
    groups = pt_bench.groups(args)
    assert [(g.dtype_name, g.d_head, g.causal) for g in groups] == [
        ("bf16", 64, False), ("bf16", 64, True), ("bf16", 256, False), ("bf16", 256, True)
    ]  # fmt: skip
    batches = {1000: 16, 4000: 16, 8000: 8}
    assert groups[1].problems == [common.Problem(batches[s], s, s, 32, 8, 64, True) for s in batches]
    assert groups[2].problems[0] == common.Problem(16, 1000, 1000, 8, 2, 256, False)


def test_pt_bench_shows_a_peer_that_raises_as_missing_with_its_error(stand_in_gpu, capsys, monkeypatch):
    stand_in_gpu()

    def fa4_rejects(q, k, v, causal):
        raise ValueError("fp16 is not supported\nmore detail")

    monkeypatch.setattr(
        pt_bench, "PEERS", {"fa3": lambda name: (None, "ImportError: stand-in"), "fa4": lambda name: (fa4_rejects, "")}
    )
    assert pt_bench.main(["--dtypes", "fp16", "--seq-lens", "128"]) == 0
    out, err = capsys.readouterr()
    assert "FA4 cannot run fp16, batch 16, seq 128" in err and "ValueError: fp16 is not supported" in err
    assert "FA4 missing at every length: ValueError: fp16 is not supported" in out
    assert "FA3 missing at every length: ImportError: stand-in" in out


def test_peer_loaders_say_why_a_peer_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # an import of it raises ImportError
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", None)
    for load in (common.load_fa3, common.load_fa4):
        function, why = load("flash_attn_func")
        assert function is None and "Error: import of" in why


def test_pt_bench_has_the_llama70b_gqa_shape():
    args = pt_bench.parse_args(["--shape", "llama70b", "--seq-lens", "4096", "16384", "--causal", "both"])
    groups = pt_bench.groups(args)
    assert [(g.d_head, g.causal) for g in groups] == [(128, False), (128, True)] * 2  # fp16 and bf16
    assert groups[1].problems == [common.Problem(2, s, s, 64, 8, 128, True) for s in (4096, 16384)]
    for bad in (["--d-heads", "64"], ["--gqa-ratio", "2"]):
        with pytest.raises(SystemExit):
            pt_bench.parse_args(["--shape", "llama70b", *bad])


@pytest.mark.parametrize(
    "flags, masks",
    [([], (False,)), (["--causal"], (True,)), (["--causal", "off"], (False,)), (["--causal", "both"], (False, True))],
)
def test_pt_bench_causal_flag(flags, masks):
    args = pt_bench.parse_args([*flags, "--d-heads", "128"])
    assert tuple(group.causal for group in pt_bench.groups(args) if group.dtype_name == "fp16") == masks


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--gqa-ratio", "2", "--d-heads", "64", "96"], "does not divide the 21 heads of d_head 96"),
        (["--seq-lens", "1000", "0"], "must be a positive integer, got 0"),
        (["--gqa-ratio", "0"], "must be a positive integer, got 0"),
    ],
)
def test_pt_bench_rejects_shapes_it_cannot_make(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        pt_bench.parse_args(flags)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("tool", [pt_bench, autotune, varlen_bench])
@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_timing_tools_reject_a_sustain_time_that_is_not_a_finite_non_negative_number(tool, value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        tool.parse_args(["--sustain-s", value])
    assert exit_info.value.code == 2 and "--sustain-s must be a finite number of seconds" in capsys.readouterr().err


def test_make_timer_with_a_sustain_time_times_sustained_loops(monkeypatch):
    calls = []
    monkeypatch.setattr(common, "sustained_ms", lambda fn, seconds: calls.append(seconds) or 3.0)
    timer, description = common.make_timer(50, sustain_s=1.5)
    assert timer(lambda: None) == 3.0 and calls == [1.5]
    assert "back-to-back calls over about 1.5 s after a warm-up as long" in description
    assert "do_bench" in common.make_timer(50)[1] or "CUDA-event" in common.make_timer(50)[1]


@pytest.mark.gpu
def test_sustained_loop_times_a_call_like_cuda_events():
    torch = pytest.importorskip("torch")
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    matmul = functools.partial(torch.matmul, a, a)
    sustained = common.sustained_ms(matmul, 0.2)
    single = common.median_ms_with_cuda_events(matmul, rep_ms=50)
    # The same unit and scale (milliseconds per call, not per batch of calls): back to back the calls
    # overlap their launch gaps, under the power limit the clock may sink, and under pytest-xdist the
    # other workers' kernels share the GPU with either timing, so only the order of magnitude is fixed.
    assert 0.2 * single < sustained < 5.0 * single


# ----------------------------------------------------------------------------------------------
# ncu output

OURS_NAME = nvcc_demangled_name(CFG_A)
FLASH_NAME = (
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::half_t, "
    "Flash_kernel_traits<128, 128, 64, 4, cutlass::half_t>>, false, false, false, false, true, true, false, false>"
    "(pytorch_flash::Flash_fwd_params)"
)
RANDN_NAME = (
    "void at::native::<unnamed>::distribution_elementwise_grid_stride_kernel<float, 4, "
    "at::native::templates::cuda::normal_and_transform<c10::Half, float, (unsigned long)4>(int, float)>(long, "
    "at::PhiloxCudaState, T3, T4)"
)
RAW_HEADER = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
    '"Device","CC","dram__throughput.avg.pct_of_peak_sustained_elapsed","gpu__time_duration.sum",'
    '"launch__registers_per_thread","launch__shared_mem_per_block_dynamic","launch__shared_mem_per_block_static",'
    '"lts__t_sector_hit_rate.pct","sm__cycles_elapsed.max",'
    '"sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",'
    '"sm__warps_active.avg.pct_of_peak_sustained_active"'
)
RAW_UNITS = (
    '"","","","","","","","","","","","%","nsecond","register/thread","byte/block","byte/block","%","cycle","%","%"'
)


def _raw_row(launch_id, name, dram, time, registers, dynamic, static, l2, cycles, tensor, occupancy):
    fields = [launch_id, "4242", "python3.12", "127.0.0.1", name, "1", "7", "(128, 1, 1)", "(32, 16, 16)", "0", "9.0"]
    fields += [dram, time, registers, dynamic, static, l2, cycles, tensor, occupancy]
    return ",".join(f'"{field}"' for field in fields)


NCU_RAW_OUTPUT = "\n".join(
    [
        "==PROF== Connected to process 4242 (/usr/bin/python3.12)",
        "batch 16, seq 4096, heads 16, d_head 128, fp16: 1 configuration(s), 0 skipped",
        '==PROF== Profiling "flash_forward_kernel": 0%....50%....100% - 9 passes',
        f"ran 2x {CFG_A.short_form()}",
        "ran 2x SDPA FLASH",
        "==PROF== Disconnected from process 4242",
        RAW_HEADER,
        RAW_UNITS,
        _raw_row("0", RANDN_NAME, "85.5", "30,112", "28", "0", "0", "12.5", "52,000", "0", "88.2"),
        _raw_row("1", OURS_NAME, "10.0", "1,402,000", "255", "49,152", "0", "80.0", "2,400,000", "40.0", "12.0"),
        _raw_row("2", OURS_NAME, "12.0", "1,398,000", "255", "49,152", "0", "84.0", "2,396,000", "42.0", "12.5"),
        _raw_row("3", FLASH_NAME, "20.0", "400,000", "255", "49,152", "0", "90.0", "700,000", "80.0", "11.5"),
        _raw_row("4", FLASH_NAME, "22.0", "410,000", "255", "49,152", "0", "92.0", "720,000", "82.0", "11.5"),
    ]
)


def test_ncu_raw_page_averages_and_names():
    summaries = ncu_bench.summarize(ncu_bench.parse_ncu_csv(NCU_RAW_OUTPUT))
    assert [s.kernel.label for s in summaries] == [CFG_A.short_form(), "SDPA FLASH (FA2)"]
    ours, flash = summaries
    assert ours.kernel.config == CFG_A and ours.launches == 2
    assert ours.metrics[ncu_bench.TIME] == pytest.approx(1_400_000)
    assert ours.metrics[ncu_bench.CYCLES] == pytest.approx(2_398_000)
    assert ours.metrics[ncu_bench.L2_HIT_RATE] == pytest.approx(82.0)
    assert flash.kernel.kind == "reference" and flash.metrics[ncu_bench.TENSOR_PIPE] == pytest.approx(81.0)

    problem = common.benchmark_problem(4096, 128)
    row = ncu_bench.profile_row(ours, "fp16", problem)
    assert row.duration_us == pytest.approx(1400.0)
    assert row.registers == 255 and row.smem_bytes == 49152
    assert row.occupancy_pct == pytest.approx(12.25) and row.dram_pct == pytest.approx(11.0)
    assert row.tflops == pytest.approx(total_flop(16, 16, 4096, 128) / 1.4e-3 / 1e12)
    assert row.attn_tflops == pytest.approx(attention_flop(16, 16, 4096, 128) / 1.4e-3 / 1e12)
    assert "SDPA FLASH (FA2)" in ncu_bench.format_profile_table([row, ncu_bench.profile_row(flash, "fp16", problem)])

    causal = ncu_bench.profile_row(ours, "fp16", common.benchmark_problem(4096, 128, causal=True))
    assert causal.causal and causal.attn_tflops == pytest.approx(row.attn_tflops / 2)


def test_ncu_bench_compares_ragged_lengths_with_the_next_multiple_of_128_per_flop():
    def row(seq_len, cycles, seqlen_k=None, kernel=CFG_A.short_form()):
        problem = common.benchmark_problem(seq_len, 128)
        keys = seqlen_k or seq_len
        return ncu_bench.ProfileRow(
            "fp16", 128, False, seq_len, keys, problem.batch, problem.heads_q, kernel, 2, 1.0, cycles, *[math.nan] * 15
        )

    # The same cycles for 1000 x 1000 as for 1024 x 1024: (1024 / 1000)^2 as many FLOPs at 1024. A
    # kernel profiled at one of the two lengths only gets no line.
    rows = [row(1000, 5.0e5), row(1024, 5.0e5), row(4000, 1.0e6), row(1000, 1.0e5, kernel=CFG_B.short_form())]
    assert ncu_bench.ragged_length_lines(rows) == [
        f"seq 1000 against 1024, d_head 128, no mask: +4.9% cycles per FLOP, {CFG_A.short_form()}"
    ]
    # With --seqlen_k 1000 both query lengths face 1000 keys: 1024 / 1000 as many FLOPs.
    fixed = [row(1000, 5.0e5, 1000), row(1024, 5.0e5, 1000)]
    assert ncu_bench.ragged_length_lines(fixed, seqlen_k=1000) == [
        f"seq 1000 against 1024, 1000 keys, d_head 128, no mask: +2.4% cycles per FLOP, {CFG_A.short_form()}"
    ]


def test_ncu_names_every_variant_of_a_configuration_by_the_configuration():
    for variant in ALL_VARIANTS:
        kernel = ncu_bench.classify_kernel(nvcc_demangled_name(CFG_B, variant))
        assert (kernel.kind, kernel.config, kernel.label) == ("ours", CFG_B, CFG_B.short_form())


# SM90_128's unmasked kernel as ncu prints it (c++filt of the symbol nvcc 13 writes for sm_90a).
SM90_NAME = (
    "void flash::sm90::hopper_forward_kernel<flash::sm90::StaticHopperKernelConfig<"
    "flash::sm90::HopperForwardKernelConfig{(flash::DType)5, 128, 128, 128, 2, true, true, true}>, "
    "(flash::MaskKind)0, false, false>(flash::sm90::KernelParams)"
)


def test_ncu_names_hopper_kernels_by_their_configuration():
    kernel = ncu_bench.classify_kernel(SM90_NAME)
    assert (kernel.kind, kernel.config) == ("ours", SM90_128)
    assert kernel.label == "sm90(FP16, 128, 128, 128, 2): ws+pingpong+overlap"
    for variant in ALL_VARIANTS:
        assert ncu_bench.classify_kernel(SM90_WS.demangled_kernel_name(variant)).config == SM90_WS


def test_ncu_averages_hopper_and_sm80_kernels_of_one_run_apart():
    sm90_rows = [
        _raw_row(str(i), SM90_NAME, "9.0", time, "240", "197,632", "0", "70.0", "1,800,000", "0", "18.0")
        for i, time in ((5, "1,000,000"), (6, "1,200,000"))
    ]
    summaries = ncu_bench.summarize(ncu_bench.parse_ncu_csv("\n".join([NCU_RAW_OUTPUT, *sm90_rows])))
    assert [(s.kernel.label, s.launches) for s in summaries] == [
        (CFG_A.short_form(), 2), ("SDPA FLASH (FA2)", 2), (SM90_128.short_form(), 2)
    ]  # fmt: skip
    assert summaries[2].kernel.config == SM90_128
    assert summaries[2].metrics[ncu_bench.TIME] == pytest.approx(1_100_000)
    assert summaries[2].metrics[ncu_bench.SMEM_DYNAMIC] == 197632


def test_ncu_other_kernels_only_on_request():
    summaries = ncu_bench.summarize(ncu_bench.parse_ncu_csv(NCU_RAW_OUTPUT), include_other=True)
    assert summaries[0].kernel.kind == "other"
    assert summaries[0].kernel.label == "at::native::"
    assert len(summaries) == 3


def test_ncu_details_page_with_scaled_units():
    header = (
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
    )

    def row(launch_id, name, metric, unit, value):
        fields = [launch_id, "7", "python3.12", "127.0.0.1", name, "1", "7", "(128, 1, 1)", "(8, 16, 16)", "0", "9.0"]
        fields += ["Command line profiler metrics", metric, unit, value]
        return ",".join(f'"{field}"' for field in fields)

    text = "\n".join(
        [
            header,
            row("0", OURS_NAME, "gpu__time_duration.sum", "msecond", "1.50"),
            row("0", OURS_NAME, "launch__shared_mem_per_block_dynamic", "Kbyte/block", "49.15"),
            row("1", OURS_NAME, "gpu__time_duration.sum", "usecond", "1,300.00"),
            row("1", OURS_NAME, "launch__shared_mem_per_block_dynamic", "byte/block", "49,150"),
            row(
                "2",
                "fmha_cutlassF_f16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<>::Params)",
                "gpu__time_duration.sum",
                "nsecond",
                "2,000,000",
            ),
            row(
                "3",
                "cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x64_4x1x1_kernel0_0",
                "gpu__time_duration.sum",
                "nsecond",
                "n/a",
            ),
        ]
    )
    summaries = ncu_bench.summarize(ncu_bench.parse_ncu_csv(text))
    assert [(s.kernel.label, s.launches) for s in summaries] == [
        (CFG_A.short_form(), 2),
        ("SDPA EFFICIENT", 1),
        ("SDPA CUDNN", 1),
    ]
    assert summaries[0].metrics[ncu_bench.TIME] == pytest.approx(1_400_000)
    assert summaries[0].metrics[ncu_bench.SMEM_DYNAMIC] == pytest.approx(49150)
    assert summaries[1].metrics[ncu_bench.TIME] == pytest.approx(2_000_000)
    assert ncu_bench.TIME not in summaries[2].metrics  # n/a is no value


def test_ncu_output_without_a_table():
    with pytest.raises(ncu_bench.NcuOutputError):
        ncu_bench.parse_ncu_csv("==ERROR== ERR_NVGPUCTRPERM - no permission to access NVIDIA GPU performance counters")


def test_ncu_command_profiles_run_kernels_with_every_metric():
    args = ncu_bench.parse_args(["--runs", "2", "--kernels", CFG_A.short_form(), "--reference", "all"])
    command = ncu_bench.ncu_command("ncu", args, common.benchmark_problem(8000, 256))
    assert command[:3] == ["ncu", "--clock-control", "none"]
    assert "--csv" in command and command[command.index("--metrics") + 1].split(",") == list(ncu_bench.NCU_METRICS)
    tail = command[command.index(sys.executable) :]
    assert tail[1:4] == [str(BENCHMARK_DIR / "run_kernels.py"), "8000", "256"]
    assert tail[tail.index("--batch") + 1] == "8" and tail[tail.index("--heads") + 1] == "8"
    assert tail[tail.index("--kernels") + 1] == CFG_A.short_form() and "--check" not in tail
    assert "--causal" not in tail
    causal = ncu_bench.ncu_command("ncu", args, common.benchmark_problem(8000, 256, causal=True))
    assert [arg for arg in causal if arg != "--causal"] == command and causal.count("--causal") == 1
    assert run_kernels.parse_args(causal[causal.index(sys.executable) + 2 :]).causal


def test_ncu_bench_stall_reasons_are_asked_for_printed_and_written(tmp_path):
    args = ncu_bench.parse_args(["--stall-reasons"])
    metrics = ncu_bench.ncu_command("ncu", args, common.benchmark_problem(4096, 128))
    asked = metrics[metrics.index("--metrics") + 1].split(",")
    assert asked == [*ncu_bench.NCU_METRICS, *ncu_bench.STALL_METRICS.values()]
    assert "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio" in asked
    plain = ncu_bench.ncu_command("ncu", ncu_bench.parse_args([]), common.benchmark_problem(4096, 128))
    assert plain[plain.index("--metrics") + 1].split(",") == list(ncu_bench.NCU_METRICS)
    # Two kernels' stalls as ncu's raw page gives them ("inst" units, left as they are).
    wait, barrier, gmma = (ncu_bench.STALL_METRICS[reason] for reason in ("wait", "barrier", "gmma"))
    summaries = [
        ncu_bench.KernelSummary(ncu_bench.KernelName("ours", "ours"), 1, {wait: 2.32, barrier: 0.97, gmma: 0.001}),
        ncu_bench.KernelSummary(ncu_bench.KernelName("FA3", "peer"), 1, {wait: 1.49, barrier: 0.59, gmma: 0.36}),
    ]
    stalls = [ncu_bench.stall_reasons(summary) for summary in summaries]
    assert stalls[0] == {"wait": 2.32, "barrier": 0.97, "gmma": 0.001}
    problem = common.benchmark_problem(2048, 128, causal=True)
    rows = [ncu_bench.profile_row(summary, "bf16", problem) for summary in summaries]
    table = ncu_bench.format_stall_table(rows, stalls).splitlines()
    assert table[0].split() == ["kernel", "wait", "barrier", "gmma", "total"]  # largest first over the table
    assert table[2].split() == ["ours", "2.32", "0.97", "0.00", "3.29"]
    assert table[3].split() == ["FA3", "1.49", "0.59", "0.36", "2.44"]
    # Reasons no kernel stalls on are left out.
    assert "misc" not in ncu_bench.format_stall_table(rows, stalls)


def _stand_in_ncu(tmp_path, output: str, status: int = 0) -> pathlib.Path:
    """An executable that records its arguments and prints ``output`` the way ncu would."""
    (tmp_path / "ncu_output.txt").write_text(output)
    ncu = tmp_path / "ncu"
    ncu.write_text(
        f"#!{sys.executable}\n"
        "import pathlib, sys\n"
        f"pathlib.Path({str(tmp_path / 'ncu_argv.txt')!r}).write_text('\\n'.join(sys.argv[1:]))\n"
        f"print(pathlib.Path({str(tmp_path / 'ncu_output.txt')!r}).read_text())\n"
        f"sys.exit({status})\n"
    )
    ncu.chmod(0o755)
    return ncu


def test_ncu_bench_with_a_stand_in_ncu(tmp_path):
    ncu = _stand_in_ncu(tmp_path, NCU_RAW_OUTPUT)
    result = run_tool(
        sys.executable, BENCHMARK_DIR / "ncu_bench.py", "--ncu", ncu, "--seq_lens", "4096", "--d_heads", "128",
        "--runs", "2", "--csv", tmp_path / "profile.csv",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "fp16, batch 16, seq 4096, 16 heads, d_head 128, no mask (averages over 2 run(s))" in result.stdout
    assert CFG_A.short_form() in result.stdout and "SDPA FLASH (FA2)" in result.stdout
    assert "distribution" not in result.stdout
    argv = (tmp_path / "ncu_argv.txt").read_text().splitlines()
    assert argv[argv.index("--n_runs") + 1] == "2" and argv[argv.index("--reference") + 1] == "flash"
    assert "--causal" not in argv
    with open(tmp_path / "profile.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [row["kernel"] for row in rows] == [CFG_A.short_form(), "SDPA FLASH (FA2)"]
    assert float(rows[0]["duration_us"]) == pytest.approx(1400.0) and rows[0]["launches"] == "2"
    assert rows[0]["causal"] == "False"


def test_ncu_bench_with_a_stand_in_ncu_writes_stall_reasons(tmp_path):
    # NCU_RAW_OUTPUT with one stall reason's column added: its values per launch, "inst" its unit.
    wait = ncu_bench.STALL_METRICS["wait"]
    lines = NCU_RAW_OUTPUT.splitlines()
    header = lines.index(RAW_HEADER)
    column = [wait, "inst", "", "2.0", "3.0", "", ""]  # header, units, then per launch: ours twice, the others none
    for offset, value in enumerate(column):
        lines[header + offset] += f',"{value}"'
    ncu = _stand_in_ncu(tmp_path, "\n".join(lines))
    result = run_tool(
        sys.executable, BENCHMARK_DIR / "ncu_bench.py", "--ncu", ncu, "--seq_lens", "4096", "--stall-reasons",
        "--csv", tmp_path / "profile.csv",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "warps stalled per issued instruction, by reason" in result.stdout
    with open(tmp_path / "profile.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert float(rows[0]["stalled_wait"]) == pytest.approx(2.5) and rows[1]["stalled_wait"] == ""
    assert "stalled_barrier" in rows[0]


def test_ncu_bench_causal_profiles_each_mask(tmp_path):
    ncu = _stand_in_ncu(tmp_path, NCU_RAW_OUTPUT)
    result = run_tool(
        sys.executable, BENCHMARK_DIR / "ncu_bench.py", "--ncu", ncu, "--seq_lens", "1000", "--d_heads", "192",
        "--causal", "both", "--csv", tmp_path / "profile.csv",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for mask in ("no mask", "causal"):
        assert f"fp16, batch 16, seq 1000, 10 heads, d_head 192, {mask} (averages over 3 run(s))" in result.stdout
    assert "attention FLOPs: half of 4 * batch * heads_q * seqlen_q * seqlen_k * d_head (causal)" in result.stdout
    argv = (tmp_path / "ncu_argv.txt").read_text().splitlines()  # the last run: causal
    assert argv[argv.index(str(BENCHMARK_DIR / "run_kernels.py")) + 1 :][:2] == ["1000", "192"] and "--causal" in argv
    with open(tmp_path / "profile.csv", newline="") as file:
        rows = [row for row in csv.DictReader(file) if row["kernel"] == CFG_A.short_form()]
    assert [row["causal"] for row in rows] == ["False", "True"]
    assert float(rows[1]["attn_tflops"]) == pytest.approx(float(rows[0]["attn_tflops"]) / 2)


def test_ncu_bench_profiles_keys_of_a_length_of_their_own(tmp_path):
    """--seqlen_k profiles a query tail without a key tail (and the reverse), e.g. seq 1000 x 1024."""
    ncu = _stand_in_ncu(tmp_path, NCU_RAW_OUTPUT)
    result = run_tool(
        sys.executable, BENCHMARK_DIR / "ncu_bench.py", "--ncu", ncu, "--seq_lens", "1000", "--seqlen_k", "1024",
        "--causal", "both", "--reference", "none", "--csv", tmp_path / "profile.csv",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "fp16, batch 16, seq 1000 x 1024, 16 heads, d_head 128, causal" in result.stdout
    argv = (tmp_path / "ncu_argv.txt").read_text().splitlines()
    assert argv[argv.index("--seqlen_k") + 1] == "1024"
    with open(tmp_path / "profile.csv", newline="") as file:
        rows = [row for row in csv.DictReader(file) if row["kernel"] == CFG_A.short_form()]
    assert [(row["seq_len"], row["seqlen_k"], row["causal"]) for row in rows] == [
        ("1000", "1024", "False"),
        ("1000", "1024", "True"),
    ]


FA3_NAME = (
    "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<"
    "2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1>>, cute::tuple<cute::C<128>, cute::C<176>, cute::C<128>>>>>>"
    "(T1::Params)"
)
FA3_PREPARE_NAME = "void flash::prepare_varlen_num_blocks_kernel(int, int, int, const int *, int *)"


def _peer_output(*names: str) -> str:
    """ncu's raw page for a peer's run: the inputs' fill, then two launches of each kernel named."""
    rows = [_raw_row("0", RANDN_NAME, "85.5", "30,112", "28", "0", "0", "12.5", "52,000", "0", "88.2")]
    for i, name in enumerate(names):
        for run in range(2):
            metrics = ("9.0", "1,300,000", "168", "196,608", "0", "70.0", "2,300,000", "60.0", "12.0")
            rows.append(_raw_row(str(1 + 2 * i + run), name, *metrics))
    return "\n".join([RAW_HEADER, RAW_UNITS, *rows])


def test_a_peer_run_s_kernels_but_pytorch_s_are_the_peer_s():
    """In a peer's run (run_kernels.py --peer), every kernel that is not PyTorch's own is the peer's,
    whatever its name: the peer's name alone for one kernel, with each kernel's where there are several."""
    (fa3,) = ncu_bench.summarize(ncu_bench.parse_ncu_csv(_peer_output(FA3_NAME)), peer="fa3")
    assert (fa3.kernel.label, fa3.kernel.kind, fa3.launches) == ("FA3", "peer", 2)
    assert fa3.metrics[ncu_bench.TIME] == pytest.approx(1_300_000)
    several = ncu_bench.summarize(ncu_bench.parse_ncu_csv(_peer_output(FA3_PREPARE_NAME, FA3_NAME)), peer="fa3")
    assert [s.kernel.label for s in several] == [
        "FA3: flash::prepare_varlen_num_blocks_kernel",
        "FA3: cutlass::device_kernel",
    ]
    # By name alone FA3's kernel would pass for cuDNN's (enable_sm90_or_later holds "sm90_"): why a
    # peer is profiled in a run of its own.
    (by_name,) = ncu_bench.summarize(ncu_bench.parse_ncu_csv(_peer_output(FA3_NAME)))
    assert by_name.kernel.label == "SDPA CUDNN"
    assert ncu_bench.is_torch_kernel(RANDN_NAME) and not ncu_bench.is_torch_kernel(FA3_NAME)


def test_ncu_command_of_a_peer_runs_the_peer_alone_on_the_same_problem():
    args = ncu_bench.parse_args(["--kernels", CFG_A.short_form(), "--reference", "all", "--peers", "fa3", "fa4"])
    problem = common.llama70b_problem(4096, causal=True)
    ours = ncu_bench.ncu_command("ncu", args, problem)
    peer = ncu_bench.ncu_command("ncu", args, problem, "fa3")
    assert "--peer" not in ours and ours[ours.index("--reference") + 1] == "all"
    assert peer[peer.index("--peer") + 1] == "fa3" and "--reference" not in peer and "--kernels" not in peer
    run_args = run_kernels.parse_args(peer[peer.index(sys.executable) + 2 :])
    shape = (run_args.batch, run_args.heads, run_args.heads_kv, run_args.causal, run_args.peer)
    assert shape == (2, 64, 8, True, "fa3")


def test_ncu_bench_llama70b_shape():
    args = ncu_bench.parse_args(["--shape", "llama70b", "--seq_lens", "4096", "8192", "--causal", "both"])
    assert ncu_bench.shape_problems(args) == [
        common.Problem(2, s, s, 64, 8, 128, causal) for s in (4096, 8192) for causal in (False, True)
    ]
    with pytest.raises(SystemExit):
        ncu_bench.parse_args(["--shape", "llama70b", "--d_heads", "64"])


def test_ncu_profile_row_reports_the_clock_pipes_and_issue_slots():
    summary = ncu_bench.KernelSummary(
        ncu_bench.KernelName("FA3", "peer"),
        1,
        {
            ncu_bench.TIME: 1_000_000,
            ncu_bench.SM_CLOCK: 1.755e9,
            ncu_bench.FMA_PIPE: 31.5,
            ncu_bench.XU_PIPE: 48.0,
            ncu_bench.ISSUE_ACTIVE: 55.5,
            ncu_bench.INSTRUCTIONS: 123_400_000,
            ncu_bench.SMEM_READS: 27.0,
            ncu_bench.SMEM_WRITES: 13.5,
        },
    )
    row = ncu_bench.profile_row(summary, "bf16", common.benchmark_problem(4096, 128))
    assert (row.clock_mhz, row.fma_pct, row.mufu_pct, row.issue_pct) == pytest.approx((1755, 31.5, 48.0, 55.5))
    assert row.instructions_m == pytest.approx(123.4)
    assert (row.smem_read_pct, row.smem_write_pct) == pytest.approx((27.0, 13.5))
    table = ncu_bench.format_profile_table([row])
    assert all(
        header in table for header in ("MHz", "FMA %", "MUFU %", "issue %", "inst (M)", "smem rd %", "smem wr %")
    )


def test_ncu_bench_profiles_each_peer_in_a_run_of_its_own(tmp_path):
    """A stand-in ncu that prints a peer's kernels when run_kernels.py is given --peer, ours otherwise."""
    (tmp_path / "ours.txt").write_text(NCU_RAW_OUTPUT)
    (tmp_path / "peer.txt").write_text(_peer_output(FA3_NAME))
    ncu = tmp_path / "ncu"
    ncu.write_text(
        f"#!{sys.executable}\n"
        "import pathlib, sys\n"
        f"with open({str(tmp_path / 'calls.txt')!r}, 'a') as calls: calls.write(' '.join(sys.argv[1:]) + '\\n')\n"
        f"print(pathlib.Path({str(tmp_path)!r}, 'peer.txt' if '--peer' in sys.argv else 'ours.txt').read_text())\n"
    )
    ncu.chmod(0o755)
    result = run_tool(
        sys.executable, BENCHMARK_DIR / "ncu_bench.py", "--ncu", ncu, "--seq_lens", "4096", "--dtype", "bf16",
        "--peers", "fa3", "--csv", tmp_path / "profile.csv",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert len(calls) == 2 and "--peer fa3" in calls[1] and "--peer" not in calls[0]
    with open(tmp_path / "profile.csv", newline="") as file:
        assert [row["kernel"] for row in csv.DictReader(file)] == [CFG_A.short_form(), "SDPA FLASH (FA2)", "FA3"]


def test_run_kernels_refuses_kv_heads_that_do_not_divide_and_a_check_of_a_peer(capsys):
    with pytest.raises(SystemExit):
        run_kernels.parse_args(["4096", "128", "--heads", "16", "--heads_kv", "3"])
    assert "--heads_kv must divide the 16 query heads" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_kernels.parse_args(["4096", "128", "--peer", "fa3", "--check"])
    assert "--peer runs none of them" in capsys.readouterr().err
    assert run_kernels.parse_args(["4096", "128", "--heads_kv", "4"]).heads_kv == 4


@pytest.mark.parametrize("tool", ["ncu_bench", "run_kernels"])
def test_causal_keys_of_another_length_refuse_an_sdpa_reference(tool, capsys):
    """SDPA aligns is_causal top-left and we align bottom-right: with seqlen_q != seqlen_k they are
    different problems, so the tools ask for --reference none instead of timing SDPA on another one."""
    parse, argv = {
        "ncu_bench": (ncu_bench.parse_args, ["--seq_lens", "1000", "1024", "--seqlen_k", "1024", "--causal", "both"]),
        "run_kernels": (run_kernels.parse_args, ["1000", "128", "--seqlen_k", "1024", "--causal"]),
    }[tool]
    with pytest.raises(SystemExit):
        parse(argv)
    assert "SDPA's is_causal (aligned top-left)" in capsys.readouterr().err
    assert parse([*argv, "--reference", "none"]).seqlen_k == 1024
    # Equal lengths, or no mask, keep the reference.
    assert parse([arg for arg in argv if arg not in ("--causal", "both")]).reference == "flash"


def test_run_kernels_gives_the_keys_their_own_length(stand_in_gpu, capsys):
    extension = stand_in_gpu()
    assert run_kernels.main(["200", "128", "--seqlen_k", "300", "--reference", "none"]) == 0
    assert capsys.readouterr().out.startswith("batch 16, seq 200 x 300, 16 heads, d_head 128, no mask, fp16")
    assert {(q[1], k[1]) for _, q, k, _ in extension.calls} == {(200, 300)}
    assert run_kernels.parse_args(["200", "128"]).seqlen_k == 200  # self-attention by default
    for tool, argv in ((run_kernels, ["200", "128"]), (ncu_bench, [])):
        with pytest.raises(SystemExit):
            tool.parse_args([*argv, "--seqlen_k", "0"])


def test_ncu_bench_reports_a_failing_ncu(tmp_path):
    message = "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters"
    ncu = _stand_in_ncu(tmp_path, message, status=1)
    result = run_tool(sys.executable, BENCHMARK_DIR / "ncu_bench.py", "--ncu", ncu)
    assert result.returncode == 1
    assert "ncu exited with status 1" in result.stderr and "ERR_NVGPUCTRPERM" in result.stderr


# ----------------------------------------------------------------------------------------------
# SASS


def _sass_function(symbol: str, instructions: list[str]) -> str:
    lines = [f"\t\tFunction : {symbol}", '\t.headerflags\t@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS"']
    for index, instruction in enumerate(instructions):
        lines.append(f"        /*{index * 16:04x}*/  {instruction:<50} /* 0x000fe20000000f00 */")
        lines.append(f"{'':<60}/* 0x000fc40000000f00 */")
    return "\n".join([*lines, "\t\t.........."])


# What a masked kernel adds: comparisons and selects on the scores.
SASS_MASKING = ["ISETP.GE.AND P0, PT, R3, R4, PT ;", "FSEL R5, R5, -INF , P0 ;"]
# The kernels of each listing: two configurations unmasked and causal, one also with masked tails.
SASS_KERNELS = [
    (CFG_A, ProblemVariant()), (CFG_A, CAUSAL), (CFG_B, ProblemVariant()), (CFG_B, CAUSAL), (CFG_B, CAUSAL_TAILS)
]  # fmt: skip
# CFG_A's symbols are written like nvcc's, CFG_B's by the configuration class itself.
SASS_SYMBOLS = [
    nvcc_device_symbol(cfg, variant) if cfg == CFG_A else cfg.mangled_kernel_name(variant)
    for cfg, variant in SASS_KERNELS
] + ["_Z12other_kernelPf"]


def _sass_listing(arch: str, extra_hmma: int) -> str:
    head = f"\nFatbin elf code:\n================\narch = {arch}\ncode version = [1,7]\nhost = linux\n"
    head += f"compile_size = 64bit\n\n\tcode for {arch}"
    cfg_a = (
        ["IMAD.MOV.U32 R1, RZ, RZ, c[0x0][0x28] ;", "LDGSTS.E.BYPASS.128 [R5], desc[UR4][R2.64] ;"]
        + ["HMMA.16816.F32 R4, R8, R12, R4 ;"] * (2 + extra_hmma)
        + [
            "@P0 HMMA.16816.F32 R16, R8, R14, R16 ;",
            "@!PT LDS.U16 R2, [R3] ;",
            "LDSM.16.M88.4 R8, [R2] ;",
            "MUFU.EX2 R3, R3 ;",
            "@!P1 BRA `(.L_x_3) ;",
            "BAR.SYNC.DEFER_BLOCKING 0x0 ;",
            "EXIT ;",
            "BRA 0x100;",
            "NOP;",
            "NOP;",
        ]
    )
    cfg_b = [
        "HMMA.16816.F32 R4, R8, R12, R4 ;",
        "STL.64 [R1], R2 ;",
        "LDL.64 R2, [R1] ;",
        "SHFL.BFLY PT, R5, R4, 0x1, 0x1f ;",
        "@UP0 FMNMX R3, R3, R4, !PT ;",
        "EXIT ;",
    ]
    instructions = [cfg_a, SASS_MASKING + cfg_a, cfg_b, SASS_MASKING + cfg_b, 2 * SASS_MASKING + cfg_b, ["EXIT ;"]]
    functions = [_sass_function(symbol, code) for symbol, code in zip(SASS_SYMBOLS, instructions, strict=True)]
    return "\n".join([head, *functions])


SASS_LISTING = (
    _sass_listing("sm_80", 0)
    + "\n\n"
    + _sass_listing("sm_90", 3)
    + ("\n\nFatbin ptx code:\n================\narch = sm_90\ncode version = [8,8]\nhost = linux\ncompressed\n")
)



def test_sass_tools_find_cuobjdump_in_nvidia_s_wheel(monkeypatch, tmp_path):
    """Without cuobjdump on PATH or in a toolkit, the one of the nvidia-cuda-cuobjdump wheel
    disassembles the extension: no toolkit or GPU needed."""
    import importlib.machinery

    binary = tmp_path / "nvidia" / "cu13" / "bin" / "cuobjdump"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    monkeypatch.setattr(sass_counts.shutil, "which", lambda name: None)
    monkeypatch.setattr(sass_counts, "toolkit_roots", lambda: [])
    spec = importlib.machinery.ModuleSpec("nvidia", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path / "nvidia")]
    monkeypatch.setattr(sass_counts.importlib.util, "find_spec", lambda name: spec if name == "nvidia" else None)
    assert sass_counts.find_cuobjdump() is None  # not executable: not a program
    binary.chmod(0o755)
    assert sass_counts.find_cuobjdump() == str(binary)
    monkeypatch.setattr(sass_counts.importlib.util, "find_spec", lambda name: None)
    assert sass_counts.find_cuobjdump() is None

def test_sass_parser_counts_per_function_and_architecture():
    functions = sass_counts.parse_sass(SASS_LISTING)
    assert [(f.arch, f.symbol) for f in functions] == [
        (arch, symbol) for arch in ("sm_80", "sm_90") for symbol in SASS_SYMBOLS
    ]
    sm80_a = functions[0].opcodes
    assert sm80_a["HMMA.16816.F32"] == 3  # two plain, one predicated
    assert sm80_a["LDS.U16"] == 1 and sm80_a["LDSM.16.M88.4"] == 1 and sm80_a["LDGSTS.E.BYPASS.128"] == 1
    assert sm80_a["BRA"] == 2 and sm80_a["NOP"] == 2 and sm80_a["BAR.SYNC.DEFER_BLOCKING"] == 1
    assert sum(sm80_a.values()) == 14
    assert functions[len(SASS_SYMBOLS)].opcodes["HMMA.16816.F32"] == 6
    assert functions[2].opcodes["FMNMX"] == 1


def test_sass_functions_map_to_their_configurations_and_variants():
    kernels, others = sass_counts.map_to_configs(sass_counts.parse_sass(SASS_LISTING))
    assert [(k.arch, k.config, k.variant) for k in kernels] == [
        (arch, cfg, variant) for arch in ("sm_80", "sm_90") for cfg, variant in sorted(SASS_KERNELS)
    ]
    assert [f.symbol for f in others] == ["_Z12other_kernelPf"] * 2
    by_key = {(k.arch, k.config, k.variant): k for k in kernels}
    families = by_key["sm_80", CFG_A, ProblemVariant()].families
    assert families["HMMA"] == 3 and families["LDS"] == 1 and families["LDSM"] == 1 and families["MUFU"] == 1
    assert families[sass_counts.TOTAL] == 12  # 14 instructions less the 2 padding NOPs
    assert families["ISETP"] == 0 and by_key["sm_80", CFG_A, CAUSAL].families["ISETP"] == 1
    assert by_key["sm_90", CFG_A, ProblemVariant()].families["HMMA"] == 6
    cfg_b = by_key["sm_80", CFG_B, ProblemVariant()].families
    assert cfg_b["STL"] == 1 and cfg_b["LDL"] == 1 and cfg_b["SHFL"] == 1 and cfg_b["FMNMX"] == 1
    assert by_key["sm_80", CFG_B, CAUSAL_TAILS].families["FSEL"] == 2


def test_sass_symbols_of_every_variant_with_trailing_zero_fields_left_out():
    """Host compilers leave the configuration's trailing zero fields out of a symbol; nvcc keeps them.
    Either way each of the twenty-one variants maps back to its configuration."""
    cfg = parse_kernel_name_into_config("(FP16, 128, 128, 64, 4): async")  # every field after async_copy is 0
    symbols = sass_counts.KernelSymbols([CFG_A, cfg])
    for variant in ALL_VARIANTS + VARLEN_VARIANTS + KV_E4M3_VARIANTS:
        nvcc = cfg.mangled_kernel_name(variant)
        config_end = nvcc.index("EEEELNS_8MaskKindE")
        host = nvcc[:config_end].removesuffix("Lb0ELi0ELi0ELi0ELb0ELb0E") + nvcc[config_end:]
        assert host != nvcc
        assert symbols.lookup(nvcc) == symbols.lookup(host) == (cfg, variant)
        assert symbols.lookup(CFG_A.mangled_kernel_name(variant)) == (CFG_A, variant)
    assert len(sass_counts.VARIANTS_BY_NAME) == 21 and "local+tails+mods+varlen+kv_e4m3" in sass_counts.VARIANTS_BY_NAME
    assert symbols.lookup("_Z12other_kernelPf") is None


def _run_sass_tool(tool, capsys, *args) -> subprocess.CompletedProcess:
    """Runs a SASS tool's main in this process (the candidate configurations, slow to list, are
    listed once) and returns what it printed."""
    status = tool.main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, status, out, err)


def test_sass_counts_shows_the_unmasked_variant_unless_asked(tmp_path, capsys):
    listing = tmp_path / "sass.txt"
    listing.write_text(SASS_LISTING)
    result = _run_sass_tool(sass_counts, capsys, "--sass-file", listing, "--csv", tmp_path / "c.csv")
    assert result.returncode == 0, result.stderr
    assert "sm_80: instructions per family (2 kernels)" in result.stdout and "sm_90" in result.stdout
    table = result.stdout.split("\n\n")[0].splitlines()
    # SM80 kernels only: the Hopper family's instruction families are not shown.
    assert table[1].split() == ["config", "variant", *sass_counts.shown_families([]), sass_counts.TOTAL]
    assert "HGMMA" not in result.stdout and "HMMA" in table[1]
    shown = len(sass_counts.FAMILIES) - len(sass_counts.WHERE_USED_FAMILIES)
    assert [line.split()[-shown - 2] for line in table[3:]] == ["none", "none"]  # the variant
    with open(tmp_path / "c.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    hmma = [r for r in rows if r["config"] == CFG_A.short_form() and r["opcode"] == "HMMA.16816.F32"]
    assert [(r["arch"], r["variant"], r["count"]) for r in hmma] == [("sm_80", "none", "3"), ("sm_90", "none", "6")]

    result = _run_sass_tool(sass_counts, capsys, "--sass-file", listing, "--variants", "all", "--arch", "sm_80")
    assert result.returncode == 0, result.stderr
    assert "sm_80: instructions per family (5 kernels)" in result.stdout and "causal+tails" in result.stdout

    result = _run_sass_tool(
        sass_counts, capsys, "--sass-file", listing, "--variants", "causal", "causal+tails", "--opcodes",
        "--csv", tmp_path / "causal.csv",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"sm_90: {CFG_B.short_form()}, causal+tails" in result.stdout
    with open(tmp_path / "causal.csv", newline="") as file:
        assert {(r["config"], r["variant"]) for r in csv.DictReader(file)} == {
            (CFG_A.short_form(), "causal"), (CFG_B.short_form(), "causal"), (CFG_B.short_form(), "causal+tails")
        }  # fmt: skip


def test_sass_diff_compares_two_configurations_in_one_variant(tmp_path, capsys):
    listing = tmp_path / "sass.txt"
    listing.write_text(SASS_LISTING)
    for variant in ("none", "causal"):
        flags = [] if variant == "none" else ["--variant", variant]
        result = _run_sass_tool(
            sass_diff, capsys, CFG_B.short_form(), CFG_A.short_form(), "--sass-file", listing, "--arch", "sm_90", *flags
        )
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[:3] == [f"sm_90, variant {variant}", f"A = {CFG_B.short_form()}", f"B = {CFG_A.short_form()}"]
        opcode_table = lines[lines.index(next(line for line in lines if line.startswith("opcode"))) :]
        assert opcode_table[2].split() == ["HMMA.16816.F32", "1", "6", "5"]  # the largest difference comes first
        masking = [line.split() for line in opcode_table if line.startswith(("ISETP", "FSEL"))]
        assert masking == ([] if variant == "none" else [["FSEL", "1", "1", "0"], ["ISETP.GE.AND", "1", "1", "0"]])

    result = _run_sass_tool(
        sass_diff, capsys, CFG_A.short_form(), CFG_B.short_form(), "--sass-file", listing, "--variant", "causal+tails"
    )
    assert result.returncode == 1 and "in variant causal+tails" in result.stderr
    assert f"missing: {CFG_A.short_form()}" in result.stderr
    result = _run_sass_tool(
        sass_diff, capsys, CFG_A.short_form(), "(BF16, 64, 64, 64, 4): async", "--sass-file", listing
    )
    assert result.returncode == 1 and "missing: (BF16, 64, 64, 64, 4): async" in result.stderr


# The Hopper family's kernels in an sm_90a listing, as cuobjdump prints them: warpgroup MMAs (their
# shape in lower case), their fences and waits, TMA copies, mbarrier operations, named barriers.
SASS_SM90 = [
    "WARPGROUP.ARRIVE ;",
    "HGMMA.64x128x16.F32 R24, gdesc[UR12], RZ, !UPT ;",
    "@P0 HGMMA.64x128x16.F32 R24, gdesc[UR16], R24, gsb0 ;",
    "WARPGROUP.DEPBAR.LE gsb0, 0x0 ;",
    "@!P0 BAR.ARV 0x1, 0x100 ;",
    "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR9], R10 ;",
    "@!P5 SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR11], RZ ;",
    "@P0 ELECT P1, URZ, PT ;",
    "UTMALDG.4D [UR24], [UR16] ;",
    "UTMASTG.4D [UR8], [UR4] ;",
    "MUFU.EX2 R185, R184 ;",
    "EXIT ;",
]
SASS_SM90_KERNELS = [(SM90_128, ProblemVariant()), (SM90_128, CAUSAL_TAILS), (SM90_WS, ProblemVariant())]
# The first symbol as nvcc 13 writes it for sm_90a (read off a cubin); the others written by the class.
SASS_SM90_SYMBOLS = [
    "_ZN5flash4sm9021hopper_forward_kernelINS0_24StaticHopperKernelConfigIXtlNS0_25HopperForwardKernelConfigE"
    "LNS_5DTypeE5ELi128ELi128ELi128ELi2ELb1ELb1ELb1EEEEELNS_8MaskKindE0ELb0ELb0ELb0ELb0EEEvNS0_12KernelParamsE",
    *(cfg.mangled_kernel_name(variant) for cfg, variant in SASS_SM90_KERNELS[1:]),
]
# An sm_80 and sm_90a build: the SM80 kernels for both, the Hopper ones for sm_90a, where the SM80
# kernels' HMMA count is that of SASS_LISTING's sm_90.
SASS_SM90_LISTING = "\n\n".join(
    [
        _sass_listing("sm_80", 0),
        _sass_listing("sm_90a", 3),
        *(
            _sass_function(symbol, (2 * SASS_MASKING if variant.masked_tails else []) + SASS_SM90)
            for symbol, (_, variant) in zip(SASS_SM90_SYMBOLS, SASS_SM90_KERNELS, strict=True)
        ),
    ]
)


def test_sass_maps_and_counts_hopper_kernels():
    kernels, others = sass_counts.map_to_configs(sass_counts.parse_sass(SASS_SM90_LISTING))
    assert [f.symbol for f in others] == ["_Z12other_kernelPf"] * 2
    at_sm90a = [(k.config, k.variant) for k in kernels if k.arch == "sm_90a"]
    assert at_sm90a == sorted(SASS_KERNELS + SASS_SM90_KERNELS)  # both families, SM80 first
    assert [(k.config, k.variant) for k in kernels if k.arch == "sm_80"] == sorted(SASS_KERNELS)
    sm90_kernel = next(k for k in kernels if (k.config, k.variant) == SASS_SM90_KERNELS[0])
    assert sm90_kernel.opcodes["HGMMA.64x128x16.F32"] == 2 and sm90_kernel.opcodes["UTMALDG.4D"] == 1
    families = sm90_kernel.families
    assert (families["HGMMA"], families["WARPGROUP"], families["SYNCS"]) == (2, 2, 2)
    assert (families["UTMALDG"], families["UTMASTG"], families["BAR"], families["HMMA"]) == (1, 1, 1, 0)
    assert families[sass_counts.TOTAL] == len(SASS_SM90)
    assert sass_counts.shown_families([sm90_kernel]) == SHOWN_WITHOUT_E4M3


# The families a table of 16-bit kernels shows: all but the e4m3 products.
SHOWN_WITHOUT_E4M3 = [family for family in sass_counts.FAMILIES if family != "QGMMA"]


def test_sass_counts_shows_the_e4m3_products_where_a_kernel_has_them():
    e4m3_product = "QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR16], RZ, !UPT ;"
    listing = "\n".join(["\tcode for sm_90a", _sass_function(SASS_SM90_SYMBOLS[0], [*SASS_SM90, e4m3_product])])
    (kernel,), _ = sass_counts.map_to_configs(sass_counts.parse_sass(listing))
    assert (kernel.families["QGMMA"], kernel.families["HGMMA"]) == (1, 2)
    assert sass_counts.shown_families([kernel]) == list(sass_counts.FAMILIES)


def test_sass_parser_keeps_each_instruction_in_order():
    assert all(not f.instructions for f in sass_counts.parse_sass(SASS_SM90_LISTING))  # counts alone by default
    functions = sass_counts.parse_sass(SASS_SM90_LISTING, keep_instructions=True)
    sm90 = next(f for f in functions if f.symbol == SASS_SM90_SYMBOLS[0])
    expected_opcodes = [line.split()[1 if line.startswith("@") else 0] for line in SASS_SM90]
    assert [i.opcode for i in sm90.instructions] == expected_opcodes
    assert [i.offset for i in sm90.instructions] == [16 * n for n in range(len(SASS_SM90))]
    arrive = sm90.instructions[4]
    assert (arrive.predicate, arrive.opcode, arrive.operands) == ("@!P0", "BAR.ARV", "0x1, 0x100")
    assert sm90.instructions[2].opcode == "HGMMA.64x128x16.F32" and sm90.instructions[2].predicate == "@P0"
    assert sm90.instructions[2].operands == "R24, gdesc[UR16], R24, gsb0"


def test_sass_order_prints_the_scheduling_instructions_in_program_order(tmp_path, capsys):
    listing = tmp_path / "sass.txt"
    listing.write_text(SASS_SM90_LISTING)
    result = _run_sass_tool(sass_order, capsys, SM90_128.short_form(), "--sass-file", listing)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == f"sm_90a, variant none: {SM90_128.short_form()}"
    assert lines[1].startswith(f"{len(SASS_SM90)} instructions; kept: BAR BRA F2FP HGMMA")
    assert lines[2:] == [
        "000000  WARPGROUP.ARRIVE",
        "000010  HGMMA.64x128x16.F32 R24, gdesc[UR12], RZ, !UPT  x 2",  # a run, shown by its first
        "000030  WARPGROUP.DEPBAR.LE gsb0, 0x0",
        "000040  @!P0 BAR.ARV 0x1, 0x100",
        "000050  SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR9], R10",
        "000060  @!P5 SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR11], RZ",
        "0000a0  MUFU.EX2 R185, R184",
    ]
    # Runs are counted among the kept instructions: the masked kernel's two FSELs, an ISETP apart, are one.
    flags = ("--variant", "causal+tails", "--families", "FSEL", "UTMALDG")
    result = _run_sass_tool(sass_order, capsys, SM90_128.short_form(), "--sass-file", listing, *flags)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[2:] == [
        "000010  FSEL R5, R5, -INF , P0  x 2",
        "0000c0  UTMALDG.4D [UR24], [UR16]",
    ]
    result = _run_sass_tool(sass_order, capsys, SM90_128.short_form(), "--sass-file", listing, "--all")
    assert len(result.stdout.strip().splitlines()) == 2 + len(SASS_SM90) - 1  # the two HGMMAs are one run

    result = _run_sass_tool(sass_order, capsys, SM90_128.short_form(), "--sass-file", listing, "--arch", "sm_80")
    assert result.returncode == 1 and f"missing: {SM90_128.short_form()}" in result.stderr


def test_sass_counts_shows_the_hopper_families_where_a_kernel_has_them(tmp_path, capsys):
    listing = tmp_path / "sass.txt"
    listing.write_text(SASS_SM90_LISTING)
    result = _run_sass_tool(sass_counts, capsys, "--sass-file", listing, "--variants", "all")
    assert result.returncode == 0, result.stderr
    sm80, sm90a = result.stdout.strip().split("\n\n")
    assert sm80.startswith("sm_80: instructions per family (5 kernels)") and "HGMMA" not in sm80
    assert sm90a.startswith("sm_90a: instructions per family (8 kernels)")
    header = sm90a.splitlines()[1].split()
    assert header == ["config", "variant", *SHOWN_WITHOUT_E4M3, sass_counts.TOTAL]
    name = SM90_128.short_form().split()
    rows = [line.split()[len(name) :] for line in sm90a.splitlines() if line.split()[: len(name)] == name]
    row = next(row for row in rows if row[0] == "none")
    counts = dict(zip(header[2:], map(int, row[1:]), strict=True))
    assert (counts["HGMMA"], counts["UTMALDG"], counts["UTMASTG"], counts["SYNCS"], counts["HMMA"]) == (2, 1, 1, 2, 0)

    # sm_90 names the sm_90a code; --kernels takes Hopper short forms.
    result = _run_sass_tool(
        sass_counts, capsys, "--sass-file", listing, "--arch", "sm_90", "--kernels", SM90_WS.short_form()
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("sm_90a: instructions per family (1 kernels)")
    assert SM90_WS.short_form() in result.stdout and "sm_80" not in result.stdout


@pytest.mark.parametrize("arch, wanted, matches", [
    ("sm_90a", "sm_90", True), ("sm_90a", "sm_90a", True), ("sm_90", "sm_90", True), ("sm_80", "sm_90", False),
    ("sm_90a", "sm_80", False), ("sm_80", None, True),
])  # fmt: skip
def test_sass_arch_names_arch_specific_code_too(arch, wanted, matches):
    assert sass_counts.arch_matches(arch, wanted) == matches


def test_sass_diff_compares_hopper_configurations(tmp_path, capsys):
    listing = tmp_path / "sass.txt"
    listing.write_text(SASS_SM90_LISTING)
    assert sass_counts.parse_config(SM90_WS.short_form()) == SM90_WS
    assert sass_counts.parse_config(SM90_NAME) == SM90_128
    result = _run_sass_tool(
        sass_diff, capsys, SM90_128.short_form(), SM90_WS.short_form(), "--sass-file", listing, "--arch", "sm_90"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:3] == ["sm_90a, variant none", f"A = {SM90_128.short_form()}", f"B = {SM90_WS.short_form()}"]
    assert ["HGMMA", "2", "2", "0"] in [line.split() for line in lines]

    # Across families: the SM80 kernel against the Hopper one, the Hopper families shown.
    result = _run_sass_tool(sass_diff, capsys, CFG_A.short_form(), SM90_128.short_form(), "--sass-file", listing)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.split("\n\n")[1].splitlines()[2:]}
    assert rows["HMMA"] == ["6", "0", "-6"] and rows["HGMMA"] == ["0", "2", "2"]


# ----------------------------------------------------------------------------------------------
# Autotuning summary

# At seq 512 A beats D by 5.3 %; at 1024 C beats B by 5 %. A has the best arithmetic mean (250)
# but B the best harmonic mean (222.2, against A's 160 and C's 135.5): B is the candidate. D has no
# timing at 1024, so it cannot be the default for both lengths.
TUNING = {
    "A": {512: 400.0, 1024: 100.0},
    "B": {512: 250.0, 1024: 200.0},
    "C": {512: 100.0, 1024: 210.0},
    "D": {512: 380.0},
}


# With the causal mask C is best at both lengths.
TUNING_CAUSAL = {"A": {512: 150.0, 1024: 160.0}, "C": {512: 200.0, 1024: 190.0}}
TUNING_NAMES = {
    name: f"(FP16, 128, {64 + 64 * (i % 2)}, {32 * 2 ** (i // 2)}, 4): async" for i, name in enumerate(TUNING)
}


def _tuning_rows(tuning=TUNING, causal=False):
    rows = []
    for name, by_seq in tuning.items():
        for seq_len, tflops in by_seq.items():
            problem = common.benchmark_problem(seq_len, 128, causal)
            time_ms = problem.flop_counts()[0] / tflops / 1e9
            rows.append(common.timing_row("fp16", problem, "ours", TUNING_NAMES[name], time_ms))
    # Not ours: ignored.
    rows.append(common.timing_row("fp16", common.benchmark_problem(512, 128, causal), "sdpa_flash", "", 0.001))
    return rows


def test_autotune_ranking():
    names = TUNING_NAMES
    rows = _tuning_rows()
    shapes = autotune.rank_shapes(rows)
    assert [(r.seq_len, r.winner.config, r.runner_up.config) for r in shapes] == [
        (512, names["A"], names["D"]),
        (1024, names["C"], names["B"]),
    ]
    assert shapes[0].margin_pct == pytest.approx(400 / 380 * 100 - 100)
    assert shapes[1].margin_pct == pytest.approx(5.0)
    assert [row.config for row in shapes[0].ranked] == [names[n] for n in "ADBC"]

    (group,) = autotune.rank_groups(rows)
    assert group.seq_lens == [512, 1024]
    assert [c.config for c in group.ranked] == [names["B"], names["A"], names["C"]]
    assert group.candidate.harmonic_mean_tflops == pytest.approx(2 / (1 / 250 + 1 / 200))


def test_autotune_ranks_repeated_timings_by_their_median():
    """Rounds (or runs appended to one file) time each configuration several times at a shape: the
    ranking takes the median, so one slow or fast outlier does not decide the winner."""
    names = TUNING_NAMES
    once = _tuning_rows()
    # A second and third timing of everything; at 512 the winner A is once 4 times slower and D
    # once 2 times faster, which alone would swap them.
    slow_a = [dataclasses.replace(row, time_ms=row.time_ms * (4 if row.config == names["A"] else 1)) for row in once]
    fast_d = [dataclasses.replace(row, time_ms=row.time_ms / (2 if row.config == names["D"] else 1)) for row in once]
    rows = once + slow_a + fast_d
    shapes, single = autotune.rank_shapes(rows), autotune.rank_shapes(once)
    assert [[row.config for row in r.ranked] for r in shapes] == [[row.config for row in r.ranked] for r in single]
    assert [row.time_ms for row in shapes[0].ranked] == pytest.approx([row.time_ms for row in single[0].ranked])
    (group,) = autotune.rank_groups(rows)
    assert [c.config for c in group.ranked] == [names["B"], names["A"], names["C"]]


def test_autotune_ranks_causal_and_unmasked_apart():
    rows = _tuning_rows(TUNING_CAUSAL, causal=True) + _tuning_rows()
    shapes = autotune.rank_shapes(rows)
    assert [(r.causal, r.seq_len, r.winner.config) for r in shapes] == [
        (False, 512, TUNING_NAMES["A"]),
        (False, 1024, TUNING_NAMES["C"]),
        (True, 512, TUNING_NAMES["C"]),
        (True, 1024, TUNING_NAMES["C"]),
    ]
    unmasked, causal = autotune.rank_groups(rows)
    assert (unmasked.causal, unmasked.candidate.config) == (False, TUNING_NAMES["B"])
    assert (causal.causal, causal.candidate.config) == (True, TUNING_NAMES["C"])
    assert causal.candidate.harmonic_mean_tflops == pytest.approx(2 / (1 / 200 + 1 / 190))

    summary = autotune.format_summary(rows, top=2)
    assert "Top 2 of 2: fp16, d_head 128, causal, seq 1024" in summary
    assert "Candidate default for fp16, d_head 128, no mask: best harmonic mean" in summary
    defaults = summary.split("Candidate defaults\n")[1].splitlines()
    assert defaults[0].split()[:4] == ["dtype", "d_head", "mask", "candidate"]
    assert [line.split()[:4] for line in defaults[2:]] == [
        ["fp16", "128", "no", "mask"],
        ["fp16", "128", "causal", TUNING_NAMES["C"].split()[0]],
    ]


def test_autotune_summary_only_needs_no_gpu(tmp_path):
    rows = _tuning_rows() + _tuning_rows(TUNING_CAUSAL, causal=True)
    common.write_csv(tmp_path / "tune.csv", rows, common.TIMING_FIELDS)
    result = run_tool(
        sys.executable, str(BENCHMARK_DIR / "autotune.py"), "--summary-only", str(tmp_path / "tune.csv"),
        "--top", "2", "--summary", str(tmp_path / "summary.txt"),
        env_changes={"CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"candidate default: {TUNING_NAMES['B']}" in result.stdout
    assert f"candidate default: {TUNING_NAMES['C']}" in result.stdout
    assert "Top 2 of 4: fp16, d_head 128, no mask, seq 512" in result.stdout
    assert (tmp_path / "summary.txt").read_text().strip() == result.stdout.strip()


def test_autotune_writes_the_rankings_as_a_dispatch_table(tmp_path):
    from flash_helpers.dispatch_table import DispatchTable

    rows = _tuning_rows() + _tuning_rows(TUNING_CAUSAL, causal=True)
    common.write_csv(tmp_path / "tune.csv", rows, common.TIMING_FIELDS)
    command = [sys.executable, str(BENCHMARK_DIR / "autotune.py"), "--summary-only", str(tmp_path / "tune.csv")]
    command += ["--dispatch-table", str(tmp_path / "sm_90.json")]
    refused = run_tool(*command)
    assert refused.returncode == 2 and "needs --arch and --gpu" in refused.stderr
    result = run_tool(*command, "--arch", "sm_90", "--gpu", "Test GPU")
    assert result.returncode == 0, result.stderr
    table = DispatchTable.load(tmp_path / "sm_90.json")
    assert (table.arch, table.gpu) == ("sm_90", "Test GPU") and "--summary-only" in table.command
    rankings = autotune.rank_shapes(rows)
    assert [(e.dtype, e.causal, e.seq_len, e.ranked, e.times_ms) for e in table.entries] == sorted(
        ("FP16", r.causal, r.seq_len, tuple(row.config for row in r.ranked), tuple(row.time_ms for row in r.ranked))
        for r in rankings
    )
    assert table.entry_for("FP16", 128, True, 600).ranked[0] == TUNING_NAMES["C"]


def test_autotune_merges_its_rankings_into_an_existing_dispatch_table(tmp_path):
    from flash_helpers.dispatch_table import DispatchTable

    table_path = tmp_path / "sm_90.json"
    gpu = ["--arch", "sm_90", "--gpu", "Test GPU"]
    both = _tuning_rows() + _tuning_rows(TUNING_CAUSAL, causal=True)
    common.write_csv(tmp_path / "both.csv", both, common.TIMING_FIELDS)
    autotune_py = [sys.executable, str(BENCHMARK_DIR / "autotune.py"), "--summary-only"]
    assert run_tool(*autotune_py, str(tmp_path / "both.csv"), "--dispatch-table", str(table_path), *gpu).returncode == 0
    before = DispatchTable.load(table_path)

    # The causal shapes re-measured alone, with another winner: only their entries change.
    remeasured = {"A": {512: 300.0, 1024: 310.0}, "C": {512: 200.0, 1024: 190.0}}
    common.write_csv(tmp_path / "causal.csv", _tuning_rows(remeasured, causal=True), common.TIMING_FIELDS)
    merge = [*autotune_py, str(tmp_path / "causal.csv"), "--dispatch-table", str(table_path), *gpu, "--merge"]
    result = run_tool(*merge)
    assert result.returncode == 0, result.stderr
    after = DispatchTable.load(table_path)
    assert [e for e in after.entries if not e.causal] == [e for e in before.entries if not e.causal]
    assert [e.ranked[0] for e in after.entries if e.causal] == [TUNING_NAMES["A"]] * 2
    assert after.command.startswith(before.command + " && ") and "causal.csv" in after.command

    # Nothing at the path yet: the run's own table.
    fresh = tmp_path / "fresh.json"
    into_fresh = [*autotune_py, str(tmp_path / "causal.csv"), "--dispatch-table", str(fresh), *gpu, "--merge"]
    assert run_tool(*into_fresh).returncode == 0
    assert [e.causal for e in DispatchTable.load(fresh).entries] == [True, True]

    refused = run_tool(*autotune_py, str(tmp_path / "causal.csv"), "--merge")
    assert refused.returncode == 2 and "--merge needs --dispatch-table" in refused.stderr
    other_gpu = run_tool(*merge[:-5], "--arch", "sm_90", "--gpu", "Other GPU", "--merge")
    assert other_gpu.returncode == 1 and "cannot merge" in other_gpu.stderr and "Traceback" not in other_gpu.stderr


def test_autotune_summary_only_reads_files_from_before_the_causal_column(tmp_path):
    old_fields = [name for name in common.TIMING_FIELDS if name not in ("causal", "seqlen_k", "heads_kv")]
    rows = [{name: getattr(row, name) for name in old_fields} for row in _tuning_rows()]
    common.write_csv(tmp_path / "old.csv", rows, old_fields)
    result = run_tool(sys.executable, str(BENCHMARK_DIR / "autotune.py"), "--summary-only", str(tmp_path / "old.csv"))
    assert result.returncode == 0, result.stderr
    assert f"candidate default: {TUNING_NAMES['B']}" in result.stdout and "causal" not in result.stdout


def test_autotune_summary_only_rejects_other_files(tmp_path):
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    result = run_tool(sys.executable, str(BENCHMARK_DIR / "autotune.py"), "--summary-only", str(tmp_path / "other.csv"))
    assert result.returncode == 1 and "not a timing CSV file" in result.stderr


# ----------------------------------------------------------------------------------------------
# The timing tools on a stand-in GPU: the extension replaced by a CPU stand-in, timings made up

TUNED_128 = next(cfg for cfg in TUNE if cfg.dtype == DType.FP16 and cfg.d_head == 128 and cfg.B_r == 128)
DEFAULT_128 = next(
    cfg
    for cfg in map(parse_kernel_name_into_config, DEFAULT_BUILD_KERNELS)
    if cfg.dtype == DType.FP16 and cfg.d_head == 128 and cfg != TUNED_128
)
# Like the builds: the tuning configuration has the benchmark variants, the default one every variant.
STAND_IN_KERNELS = [(TUNED_128, variant) for variant in BENCHMARK_VARIANTS] + [
    (DEFAULT_128, variant) for variant in ALL_VARIANTS
]


class StandInExtension:
    """The compiled extension ``flash_attention`` as the tools use it, on the CPU: its kernels are the
    (configuration, variant) pairs given; forward refuses a problem whose variant is not among them,
    as the binding does, computes attention in float32 (``_attention``) into an output of the call's
    dtype and records each call (and, in ``fp8_keywords``, the FP8 keywords it was given);
    automatic configuration takes the first configuration of q's dtype with the variant; the timer
    returns ``times[(configuration, causal)]`` for our calls and 0.5 ms for SDPA's."""

    def __init__(self, kernels, times, honours_causal=True):
        self.kernels, self.times, self.honours_causal = kernels, times, honours_causal
        self.calls, self.fp8_keywords = [], []

    def compiled_kernels(self):
        return list(self.kernels)

    def compiled_configs(self):
        return list(dict.fromkeys(cfg for cfg, _ in self.kernels))

    def compiled_kernel_set(self):
        return "stand-in"

    @staticmethod
    def _variant(cfg, q, k, causal):
        masked_tails = cfg.needs_masked_tails(q.shape[1], k.shape[1], q.shape[-1])
        return ProblemVariant(MaskKind.CAUSAL if causal else MaskKind.NONE, masked_tails)

    def choose_config(self, q, k, *, causal=False):
        dtype = DType.from_torch_dtype(q.dtype)
        config = next(
            cfg for cfg, variant in self.kernels if cfg.dtype == dtype and variant == self._variant(cfg, q, k, causal)
        )
        return types.SimpleNamespace(config=config)

    def flash_attn_func(self, q, k, v, *, causal=False, **fp8):
        return self.forward(self.choose_config(q, k, causal=causal).config, q, k, v, causal=causal, **fp8)

    def forward(self, cfg, q, k, v, o=None, *, causal=False, **fp8):
        cfg = parse_kernel_name_into_config(cfg) if isinstance(cfg, str) else cfg  # a short form, as the API takes
        variant = self._variant(cfg, q, k, causal)
        if (cfg, variant) not in self.kernels:
            raise ValueError(f"{cfg.short_form()} has no kernel for {variant.describe()}")
        self.calls.append((cfg, tuple(q.shape), tuple(k.shape), causal))
        self.fp8_keywords.append(fp8)
        o = common.make_output(q) if o is None else o
        return o.copy_(_attention(q, k, v, causal and self.honours_causal))

    def time(self, fn) -> float:
        calls = len(self.calls)
        fn()
        if len(self.calls) == calls:
            return 0.5
        cfg, _, _, causal = self.calls[-1]
        return self.times[cfg, causal]


@pytest.fixture
def stand_in_gpu(monkeypatch):
    """Installs a StandInExtension(kernels, times, honours_causal) and makes the tools believe a GPU of
    compute capability ``capability`` is there: inputs are made on the CPU and timed by the stand-in."""
    torch = pytest.importorskip("torch")

    def install(kernels=STAND_IN_KERNELS, times=None, honours_causal=True, capability=(9, 0)) -> StandInExtension:
        times = times or {(cfg, causal): 1.0 for cfg, _ in kernels for causal in (False, True)}
        extension = StandInExtension(kernels, times, honours_causal)
        monkeypatch.setitem(sys.modules, "flash_attention", extension)
        monkeypatch.setattr(common, "gpu_available", lambda: True)
        monkeypatch.setattr(common, "DEVICE", "cpu")
        monkeypatch.setattr(
            common, "make_timer", lambda rep_ms, sustain_s=0.0: (extension.time, "the stand-in's timings")
        )
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "stand-in GPU")
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
        monkeypatch.delenv(KERNELS_ENV, raising=False)
        return extension

    return install


def _record_sustain_times(extension, monkeypatch) -> list[float]:
    """Replaces the timer with the stand-in's, recording the --sustain-s each tool asks it for."""
    asked = []

    def timer(rep_ms, sustain_s=0.0):
        asked.append(sustain_s)
        return extension.time, "sustained stand-in"

    monkeypatch.setattr(common, "make_timer", timer)
    return asked


def test_pt_bench_sustain_flag_selects_the_sustained_timer(stand_in_gpu, monkeypatch, capsys):
    asked = _record_sustain_times(stand_in_gpu(), monkeypatch)
    assert pt_bench.main(["--dtypes", "fp16", "--seq-lens", "128", "--sustain-s", "0.5"]) == 0
    assert asked == [0.5] and "sustained stand-in" in capsys.readouterr().out

def test_autotune_sustain_flag_selects_the_sustained_timer(stand_in_gpu, monkeypatch, capsys):
    asked = _record_sustain_times(stand_in_gpu(), monkeypatch)
    argv = ["--dtypes", "fp16", "--d-heads", "128", "--seq-lens", "128", "--causal", "off", "--kernels", "default"]
    assert autotune.main([*argv, "--sustain-s", "0.5", "--csv", os.devnull]) == 0
    assert asked == [0.5] and "sustained stand-in" in capsys.readouterr().out


def test_pt_bench_times_each_mask_length_and_gqa_shape(stand_in_gpu, tmp_path, capsys, monkeypatch):
    times = {(TUNED_128, False): 0.25, (TUNED_128, True): 0.5, (DEFAULT_128, False): 1.0, (DEFAULT_128, True): 1.0}
    extension = stand_in_gpu(times=times)
    # FA3 as a stand-in (timed at the stand-in's 0.5 ms), FA4 missing.
    peer_calls = []

    def fa3_stand_in(q, k, v, causal):
        peer_calls.append((q.shape[1], k.shape[2], causal))
        return q

    monkeypatch.setattr(
        pt_bench, "PEERS", {"fa3": lambda name: (fa3_stand_in, ""), "fa4": lambda name: (None, "ImportError: stand-in")}
    )
    status = pt_bench.main(
        ["--dtypes", "fp16", "--seq-lens", "128", "200", "--causal", "both", "--gqa-ratio", "4",
         "--csv", str(tmp_path / "bench.csv")]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert status == 0, err
    # 200 is no multiple of the block sizes: only the configuration with masked tails runs it. Each
    # configuration is timed, then automatic configuration, then the fastest is checked.
    timed = [(TUNED_128, 128), (DEFAULT_128, 128), (DEFAULT_128, 200)]
    auto = [(TUNED_128, 128), (DEFAULT_128, 200)]
    checked = [(TUNED_128, 128), (DEFAULT_128, 200)]
    assert sorted((cfg.short_form(), q[1], k, causal) for cfg, q, k, causal in extension.calls) == sorted(
        (cfg.short_form(), seq_len, (16, seq_len, 4, 128), causal)
        for causal in (False, True)
        for cfg, seq_len in timed + auto + checked
    )
    for mask in ("no mask", "causal"):
        assert f"fp16, d_head 128, 16 heads, 4 k/v heads, {mask} (TFLOP/s)" in out
    tables = out.split("\n\n")[1:]
    assert [line.split()[:2] for line in tables[0].splitlines()[4:6]] == [["128", "16"], ["200", "16"]]
    assert TUNED_128.short_form() in tables[0].splitlines()[4] and DEFAULT_128.short_form() in tables[0].splitlines()[5]
    assert "SDPA CUDNN cannot run fp16, batch 16, seq 128, 16 heads (4 k/v heads), d_head 128, causal" in err

    assert sorted(set(peer_calls)) == [(seq_len, 4, causal) for seq_len in (128, 200) for causal in (False, True)]
    assert "FA4 missing at every length: ImportError: stand-in" in tables[0]

    rows = common.read_timing_csv(tmp_path / "bench.csv")
    assert len(rows) == 2 * ((2 + 1 + 3 + 2) + (1 + 1 + 3 + 2))
    fa4 = [row for row in rows if row.implementation == "peer_fa4"]
    assert len(fa4) == 4 and all(r.config == "missing: ImportError: stand-in" and math.isnan(r.time_ms) for r in fa4)
    flash = [row for row in rows if row.implementation == "sdpa_flash"]
    assert [(r.causal, r.seq_len, r.heads, r.heads_kv, r.config, r.time_ms) for r in flash] == [
        (causal, seq_len, 16, 4, common.GQA_NATIVE, 0.5) for causal in (False, True) for seq_len in (128, 200)
    ]
    causal_tuned = next(row for row in rows if row.config == TUNED_128.short_form() and row.causal)
    assert causal_tuned.tflops == pytest.approx(common.flop_counts(128, 16, 16, 128, causal=True)[0] / 0.5e-3 / 1e12)


def test_pt_bench_larger_heads_times_the_configurations_that_serve_a_smaller_head_size(stand_in_gpu, tmp_path):
    # d_head 96 on the d_head 128 configurations, which the SM80 family runs with masked tails: the
    # tuned one, compiled without them, cannot serve it.
    extension = stand_in_gpu()
    argv = ["--dtypes", "fp16", "--d-heads", "96", "--seq-lens", "128", "--causal", "off"]

    def ours_timed(flags):
        assert pt_bench.main([*argv, *flags, "--csv", str(tmp_path / "bench.csv")]) == 0
        return [row.config for row in common.read_timing_csv(tmp_path / "bench.csv") if row.implementation == "ours"]

    assert ours_timed([]) == []  # automatic configuration alone
    assert ours_timed(["--larger-heads"]) == [DEFAULT_128.short_form()]
    assert {q[-1] for _, q, _, _ in extension.calls} == {96}


def test_pt_bench_checks_against_flash_on_the_same_problem(stand_in_gpu, capsys):
    stand_in_gpu(honours_causal=False)  # our kernels ignore the mask: only the causal check fails
    status = pt_bench.main(["--dtypes", "fp16", "--seq-lens", "128", "--causal", "both"])
    err = capsys.readouterr().err
    assert status == 1
    assert [line.split(":")[0] for line in err.splitlines() if "CORRECTNESS FAILURE" in line] == ["CORRECTNESS FAILURE"]
    assert "d_head 128, causal: max |ours - SDPA FLASH|" in err


def test_power_bench_runs_each_configuration_and_the_reference_on_random_and_constant_inputs(
    stand_in_gpu, monkeypatch, capsys
):
    extension = stand_in_gpu()
    loops = []

    def stand_in_loop(fn, seconds, smi):
        fn()
        loops.append(seconds)
        return [1.0, 2.0, 2.0], [power_bench.Sample(1500, 690, 57)] * 3

    monkeypatch.setattr(power_bench, "run_sustained", stand_in_loop)
    status = power_bench.main(["128", "128", "--seconds", "0.5", "--constant-inputs", "--nvidia-smi", sys.executable])
    out, err = capsys.readouterr()
    assert status == 0, err
    # Both compiled d_head 128 configurations fit seq 128, on each kind of inputs; the CUDNN reference
    # cannot run on the stand-in's CPU tensors and is reported.
    assert sorted((cfg.short_form(), causal) for cfg, _, _, causal in extension.calls) == sorted(
        [(TUNED_128.short_form(), False), (DEFAULT_128.short_form(), False)] * 2
    )
    assert loops == [0.5] * 4 and err.count("SDPA CUDNN cannot run this shape") == 2
    table = out.splitlines()[3:]
    assert [line.split()[-7] for line in table] == ["random", "random", "constant", "constant"]
    assert all(line.split()[-5] == "1500" and line.split()[-3] == "690" and line.split()[-1] == "57" for line in table)


def test_power_bench_runs_the_peers_and_names_the_missing_one(stand_in_gpu, monkeypatch, capsys):
    stand_in_gpu()
    calls = []
    monkeypatch.setitem(common.PEER_LOADERS, "fa3", lambda name: (lambda q, k, v, causal: calls.append(causal), ""))
    monkeypatch.setitem(common.PEER_LOADERS, "fa4", lambda name: (None, "ModuleNotFoundError: flash_attn"))

    def stand_in_loop(fn, seconds, smi):
        fn()
        return [1.0] * 3, [power_bench.Sample(1600, 680, 60)] * 3

    monkeypatch.setattr(power_bench, "run_sustained", stand_in_loop)
    argv = ["128", "64", "--reference", "none", "--peers", "fa3", "fa4", "--causal"]
    monkeypatch.setattr(common, "select_configs", lambda key: [])
    assert power_bench.main([*argv, "--nvidia-smi", sys.executable]) == 0
    out = capsys.readouterr().out
    assert calls == [True]
    assert any(line.split()[:2] == ["FA3", "random"] for line in out.splitlines())
    assert out.splitlines()[-1] == "FA4: missing: ModuleNotFoundError: flash_attn"


def test_run_kernels_runs_a_peer_alone_and_reports_one_that_is_missing_or_refuses(stand_in_gpu, monkeypatch, capsys):
    extension = stand_in_gpu()
    calls = []
    monkeypatch.setitem(
        common.PEER_LOADERS, "fa3", lambda name: (lambda q, k, v, causal: calls.append((k.shape[2], causal)), "")
    )
    argv = ["128", "128", "--heads", "8", "--heads_kv", "2", "--n_runs", "3", "--causal", "--peer", "fa3"]
    assert run_kernels.main(argv) == 0
    assert calls == [(2, True)] * 3 and extension.calls == []  # the peer alone: none of ours
    assert "ran 3x fa3" in capsys.readouterr().out

    monkeypatch.setitem(common.PEER_LOADERS, "fa3", lambda name: (None, "ModuleNotFoundError: fa3_fwd_interface"))
    assert run_kernels.main(argv) == 1
    assert "fa3 is missing: ModuleNotFoundError: fa3_fwd_interface" in capsys.readouterr().err

    def refuses(q, k, v, causal):
        raise ValueError("bfloat16 only")

    monkeypatch.setitem(common.PEER_LOADERS, "fa3", lambda name: (refuses, ""))
    assert run_kernels.main(argv) == 1
    assert "fa3 cannot run this shape: ValueError: bfloat16 only" in capsys.readouterr().err


def test_power_bench_with_nothing_to_run_says_so(stand_in_gpu, capsys):
    stand_in_gpu()
    assert power_bench.main(["128", "64", "--reference", "none", "--nvidia-smi", sys.executable]) == 1
    assert "nothing to run: no selected configuration fits this shape" in capsys.readouterr().err


@pytest.mark.parametrize("honours_causal", [True, False])
def test_run_kernels_runs_and_checks_the_causal_problem(stand_in_gpu, honours_causal, monkeypatch, capsys):
    extension = stand_in_gpu(honours_causal=honours_causal)
    references = []

    class RecordingReference:
        """A float32 reference that records the keywords it is made with."""

        def __init__(self, q, k, v, **semantics):
            references.append(semantics)
            self.ref = _attention(q, k, v, semantics.get("causal", False))

        def compare(self, out):
            return ReferenceComparison((out.float() - self.ref).abs().max().item(), 1e-3, 0.0, 0.0)

    monkeypatch.setattr(run_kernels, "FloatReference", RecordingReference)
    status = run_kernels.main(["200", "128", "--causal", "--check", "--n_runs", "2", "--reference", "all"])
    out, err = capsys.readouterr()
    assert status == (0 if honours_causal else 1), err
    assert out.startswith("batch 16, seq 200, 16 heads, d_head 128, causal, fp16: 1 configuration(s), 1 skipped")
    assert [(cfg, causal) for cfg, _, _, causal in extension.calls] == [(DEFAULT_128, True)] * 2
    assert references == [{"causal": True}]
    assert "ran 2x SDPA FLASH" in out and "SDPA EFFICIENT cannot run this shape" in err
    assert ("ok" if honours_causal else "MISMATCH") in out.splitlines()[-1]


@pytest.mark.parametrize("capability", [(9, 0), (8, 0)])
def test_timing_tools_run_hopper_kernels_on_sm90_only(stand_in_gpu, capability, capsys):
    """A build for sm_80 and sm_90 holds the Hopper family's kernels too: they run on sm_90, and are left
    out elsewhere with a note."""
    kernels = STAND_IN_KERNELS + [(SM90_128, variant) for variant in ALL_VARIANTS]
    extension = stand_in_gpu(kernels=kernels, capability=capability)
    on_sm90 = capability == (9, 0)
    assert run_kernels.main(["256", "128", "--reference", "none"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"batch 16, seq 256, 16 heads, d_head 128, no mask, fp16: {3 if on_sm90 else 2} configuration")
    assert {cfg for cfg, *_ in extension.calls} == {TUNED_128, DEFAULT_128, *([SM90_128] if on_sm90 else [])}
    assert ("(1 of family sm90) do not run on stand-in GPU (sm_80)" in err) != on_sm90

    extension.calls.clear()
    sweep = ["--dtypes", "fp16", "--d-heads", "128", "--seq-lens", "256", "--causal", "on", "--csv", os.devnull]
    assert autotune.main(sweep) == 0
    assert (SM90_128 in {cfg for cfg, *_ in extension.calls}) == on_sm90


def test_autotune_rounds_time_each_configuration_once_per_round_in_a_repeatable_order(stand_in_gpu, tmp_path):
    sweep = ["--dtypes", "fp16", "--d-heads", "128", "--seq-lens", "128", "256", "--causal", "off", "--rounds", "3"]
    orders = []
    for run in range(2):
        extension = stand_in_gpu(times={(TUNED_128, False): 1.0, (DEFAULT_128, False): 2.0})
        csv_path = tmp_path / f"tune{run}.csv"
        assert autotune.main([*sweep, "--csv", str(csv_path)]) == 0
        orders.append([(q[1], cfg) for cfg, q, _, _ in extension.calls])
    order = orders[0]
    # Round robin over the shapes, each shape's configurations once per round.
    for start in range(0, 12, 2):
        seq = (128, 256)[start // 2 % 2]
        assert sorted(order[start : start + 2]) == sorted((seq, cfg) for cfg in (TUNED_128, DEFAULT_128))
    assert orders[1] == order, "the order is seeded: a run repeats"
    # Every timing is in the file; the summary counts each configuration once per shape.
    rows = common.read_timing_csv(csv_path)
    assert len(rows) == 12 and len(autotune.rank_shapes(rows)[0].ranked) == 2


def test_timing_order_shuffles_each_round_and_shape_afresh():
    items = list("ABCDE")
    orders = [tuple(common.timing_order(items, r, ("fp16", 1024))) for r in range(6)]
    assert all(sorted(order) == items for order in orders)
    assert orders == [tuple(common.timing_order(items, r, ("fp16", 1024))) for r in range(6)], "seeded"
    assert len(set(orders)) == 6, "each round its own order"
    assert [tuple(common.timing_order(items, r, ("fp16", 2048))) for r in range(6)] != orders, "each shape its own"


def test_autotune_sweeps_both_masks_and_ranks_them_apart(stand_in_gpu, tmp_path, capsys):
    times = {(TUNED_128, False): 1.0, (DEFAULT_128, False): 2.0, (TUNED_128, True): 2.0, (DEFAULT_128, True): 1.0}
    extension = stand_in_gpu(times=times)
    status = autotune.main(
        ["--dtypes", "fp16", "--d-heads", "128", "--seq-lens", "128", "256", "--csv", str(tmp_path / "tune.csv")]
    )
    out = capsys.readouterr().out
    assert status == 0
    assert sorted((cfg, q[1], causal) for cfg, q, _, causal in extension.calls) == sorted(
        (cfg, seq_len, causal) for cfg in (TUNED_128, DEFAULT_128) for seq_len in (128, 256) for causal in (False, True)
    )
    defaults = out.split("Candidate defaults\n")[1].splitlines()[2:]
    assert [(TUNED_128 if TUNED_128.short_form() in line else DEFAULT_128, "causal" in line) for line in defaults] == [
        (TUNED_128, False),
        (DEFAULT_128, True),
    ]
    rows = common.read_timing_csv(tmp_path / "tune.csv")
    assert {(row.causal, row.seq_len) for row in rows} == {(c, s) for c in (False, True) for s in (128, 256)}


# ----------------------------------------------------------------------------------------------
# FP8 (e4m3) inputs: ours and FlashAttention-3 with descales, the others shown as missing

E4M3_128 = next(
    cfg
    for cfg in map(parse_kernel_name_into_config, DEFAULT_BUILD_KERNELS)
    if cfg.dtype == DType.E4M3 and cfg.d_head == 128
)
# A build for sm_90 with the default set's e4m3 configuration of d_head 128 beside the 16-bit ones.
FP8_STAND_IN_KERNELS = STAND_IN_KERNELS + [(E4M3_128, variant) for variant in ALL_VARIANTS]
DESCALE_NAMES = ("q_descale", "k_descale", "v_descale")


def _assert_descales_of_one(keywords: dict, batch: int, heads_kv: int) -> None:
    """``keywords`` are the three descales, each float32 ones of shape (batch, heads_kv)."""
    torch = pytest.importorskip("torch")
    assert sorted(keywords) == sorted(DESCALE_NAMES)
    for descale in keywords.values():
        assert descale.dtype == torch.float32 and descale.shape == (batch, heads_kv) and bool((descale == 1).all())


@pytest.mark.parametrize(
    "parse, flag",
    [
        (pt_bench.parse_args, "--dtypes"),
        (autotune.parse_args, "--dtypes"),
        (lambda argv: run_kernels.parse_args(["1024", "128", *argv]), "--dtype"),
        (lambda argv: power_bench.parse_args(["1024", "128", *argv]), "--dtype"),
        (ncu_bench.parse_args, "--dtype"),
    ],
    ids=["pt_bench", "autotune", "run_kernels", "power_bench", "ncu_bench"],
)
def test_tools_that_run_fp8_take_every_name_of_each_dtype(parse, flag, capsys):
    def parsed(*names):
        return parse([flag, *names])

    many = flag == "--dtypes"
    for names, wanted in [(["e4m3"], "e4m3"), (["FP8"], "e4m3"), (["torch.float8_e4m3fn"], "e4m3"), (["half"], "fp16")]:
        assert getattr(parsed(*names), flag[2:]) == ([wanted] if many else wanted)
    if many:
        assert parsed("bfloat16", "fp8").dtypes == ["bf16", "e4m3"]
    with pytest.raises(SystemExit) as exit_info:
        parsed("fp32")
    assert exit_info.value.code == 2 and "unsupported dtype 'fp32'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "parse, flag, reason",
    [
        (varlen_bench.parse_args, "--dtypes", "its e4m3 runs are not written yet"),
        (decode_bench.parse_args, "--dtypes", "the queries are 16-bit (flash_attn_with_kvcache takes no FP8 q)"),
        (model_bench.parse_args, "--dtypes", "the models compute in a 16-bit dtype"),
        (call_bench.parse_args, "--dtype", "PyTorch's SDPA, which it times beside flash_attn_func, take no e4m3"),
        (progression.parse_args, "--dtype", "the steps of previous_kernels/ are 16-bit kernels"),
    ],
    ids=["varlen_bench", "decode_bench", "model_bench", "call_bench", "progression"],
)
def test_tools_that_cannot_run_fp8_refuse_it_with_the_reason(parse, flag, reason, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse([flag, "fp8"])
    assert exit_info.value.code == 2 and f"argument {flag}: fp8: " in (err := capsys.readouterr().err) and reason in err
    assert getattr(parse([flag, "half"]), flag[2:]) == (["fp16"] if flag == "--dtypes" else "fp16")


def test_fp8_inputs_are_the_bf16_draws_rounded_to_e4m3_with_descales_of_one(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(common, "DEVICE", "cpu")
    problem = common.Problem(2, 64, 96, 8, 2, 128)
    q, k, v = common.make_inputs(problem, DType.E4M3, seed=3)
    assert [t.dtype for t in (q, k, v)] == [torch.float8_e4m3fn] * 3
    assert [tuple(t.shape) for t in (q, k, v)] == [(2, 64, 8, 128), (2, 96, 2, 128), (2, 96, 2, 128)]
    drawn = common.make_inputs(problem, DType.BF16, seed=3)
    for made, bf16 in zip((q, k, v), drawn, strict=True):
        assert torch.equal(made.view(torch.uint8), bf16.to(torch.float8_e4m3fn).view(torch.uint8))
    _assert_descales_of_one(common.make_descales(problem, DType.E4M3), batch=2, heads_kv=2)
    assert common.make_descales(problem, DType.BF16) == {} == common.make_descales(problem, DType.FP16)
    # o is written in bfloat16 for e4m3 q, in q's own dtype otherwise.
    assert common.make_output(q).dtype == torch.bfloat16 and common.make_output(q).shape == q.shape
    assert common.make_output(drawn[0]).dtype == torch.bfloat16
    assert common.make_output(drawn[0].half()).dtype == torch.float16


def test_fa3_gets_fp8_descales_by_its_keywords_and_sdpa_and_fa4_are_refused_e4m3():
    seen = {}
    descales = {name: f"{name} tensor" for name in DESCALE_NAMES}
    def fa3(*args, **kwargs):
        seen.update(args=args, kwargs=kwargs)

    common.peer_call(fa3, "q", "k", "v", True, **descales)()
    assert seen == {"args": ("q", "k", "v"), "kwargs": {"causal": True, **descales}}
    common.peer_call(fa3, "q", "k", "v", False)()
    assert seen["kwargs"] == {"causal": False}  # 16-bit inputs: no descales
    for reference in common.SDPA_REFERENCES:
        assert "SDPA takes no float8_e4m3fn inputs" in common.dtype_refusal(reference, DType.E4M3)
    assert "FlashAttention-4's flash_attn_func takes float16 and bfloat16" in common.dtype_refusal("fa4", DType.E4M3)
    assert common.dtype_refusal("fa3", DType.E4M3) is None
    assert all(
        common.dtype_refusal(name, dtype) is None
        for name in (*common.SDPA_REFERENCES, *common.PEER_LOADERS)
        for dtype in (DType.FP16, DType.BF16)
    )


def test_pt_bench_times_e4m3_beside_fa3_and_shows_sdpa_and_fa4_as_missing(stand_in_gpu, tmp_path, capsys, monkeypatch):
    extension = stand_in_gpu(kernels=FP8_STAND_IN_KERNELS, times={(E4M3_128, False): 1.0})
    peer_calls = {"fa3": [], "fa4": []}

    def peer(name):
        def call(q, k, v, causal, **descales):
            peer_calls[name].append((q.dtype, descales))
            return q

        return lambda function: (call, "")

    monkeypatch.setattr(pt_bench, "PEERS", {"fa3": peer("fa3"), "fa4": peer("fa4")})
    status = pt_bench.main(["--dtypes", "fp8", "--seq-lens", "128", "--csv", str(tmp_path / "bench.csv")])
    out, err = capsys.readouterr()
    assert status == 0, err
    # Ours: the e4m3 configuration alone, timed, then as automatic configuration's choice, each call
    # with descales of 1 for (batch 16, 16 kv heads); FA3 with the same; FA4 and SDPA never called.
    assert [cfg for cfg, *_ in extension.calls] == [E4M3_128] * 2
    for keywords in extension.fp8_keywords:
        _assert_descales_of_one(keywords, batch=16, heads_kv=16)
    torch = pytest.importorskip("torch")
    assert [dtype for dtype, _ in peer_calls["fa3"]] == [torch.float8_e4m3fn] and not peer_calls["fa4"]
    _assert_descales_of_one(peer_calls["fa3"][0][1], batch=16, heads_kv=16)
    assert "e4m3: no SDPA backend takes it, so our output is not checked here" in out
    table = out.split("\n\n")[1].splitlines()
    assert table[0] == "e4m3, d_head 128, 16 heads, no mask (TFLOP/s)"
    assert table[1] == "FLOPs: 4 * batch * heads_q * seqlen_q * seqlen_k * d_head"
    # Ours (and auto) took 1.0 ms, FA3 the stand-in's 0.5 ms: ours/FA3 0.5; SDPA's backends, FA4: '-'.
    assert E4M3_128.short_form() in table[4]
    assert table[4].split()[-13:] == ["2.1", "2.1", "-", "-", "-", "4.3", "-", "-", "-", "0.500", "-", "1.000", "1.000"]
    assert table[5:] == [
        "harmonic mean of ours/FA3 over 1 sequence lengths: 0.500",
        "automatic configuration chose the best at 1 of 1 lengths; choice/ours lowest 1.000; auto/ours (timed apart) "
        "lowest 1.000",
        *(f"{label} missing at every length: PyTorch's SDPA takes no float8_e4m3fn inputs"
          for label in common.SDPA_REFERENCES.values()),
        "FA4 missing at every length: FlashAttention-4's flash_attn_func takes float16 and bfloat16 inputs alone",
    ]  # fmt: skip
    rows = common.read_timing_csv(tmp_path / "bench.csv")
    assert {row.dtype for row in rows} == {"e4m3"}
    missing = {row.implementation: row.config for row in rows if math.isnan(row.time_ms)}
    assert sorted(missing) == ["peer_fa4", "sdpa_cudnn", "sdpa_efficient", "sdpa_flash"]
    assert all(config.startswith(pt_bench.MISSING) for config in missing.values())
    ours = next(row for row in rows if row.implementation == "ours")
    assert ours.tflops == pytest.approx(common.flop_counts(128, 16, 16, 128)[0] / 1e-3 / 1e12)


def test_run_kernels_runs_and_checks_e4m3_against_the_fp8_reference(stand_in_gpu, monkeypatch, capsys):
    extension = stand_in_gpu(kernels=FP8_STAND_IN_KERNELS)
    argv = ["128", "128", "--batch", "2", "--heads", "4", "--heads_kv", "2", "--dtype", "e4m3", "--causal"]
    assert run_kernels.main([*argv, "--check", "--reference", "all"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("batch 2, seq 128, 4 heads (2 k/v heads), d_head 128, causal, e4m3: 1 configuration(s)")
    assert [cfg for cfg, *_ in extension.calls] == [E4M3_128]
    _assert_descales_of_one(extension.fp8_keywords[0], batch=2, heads_kv=2)
    for label in common.SDPA_REFERENCES.values():
        assert f"{label} cannot run e4m3: PyTorch's SDPA takes no float8_e4m3fn inputs" in err
    assert out.splitlines()[-1].split()[-1] == "ok"  # the stand-in's float32 output meets the FP8 criterion

    fa3_calls = []
    fa3 = lambda q, k, v, causal, **descales: fa3_calls.append(descales)  # noqa: E731
    monkeypatch.setitem(common.PEER_LOADERS, "fa3", lambda name: (fa3, ""))
    assert run_kernels.main([*argv, "--peer", "fa3"]) == 0
    _assert_descales_of_one(fa3_calls[0], batch=2, heads_kv=2)
    monkeypatch.setitem(common.PEER_LOADERS, "fa4", lambda name: pytest.fail("FA4 is not loaded for e4m3"))
    assert run_kernels.main([*argv, "--peer", "fa4"]) == 1
    assert "fa4 cannot run e4m3: FlashAttention-4's flash_attn_func takes" in capsys.readouterr().err


def test_power_bench_runs_e4m3_with_fa3_and_names_what_takes_none(stand_in_gpu, monkeypatch, capsys):
    extension = stand_in_gpu(kernels=FP8_STAND_IN_KERNELS)
    fa3_calls = []
    fa3 = lambda q, k, v, causal, **descales: fa3_calls.append(descales)  # noqa: E731
    monkeypatch.setitem(common.PEER_LOADERS, "fa3", lambda name: (fa3, ""))
    monkeypatch.setitem(common.PEER_LOADERS, "fa4", lambda name: pytest.fail("FA4 is not loaded for e4m3"))

    def stand_in_loop(fn, seconds, smi):
        fn()
        return [1.0] * 3, [power_bench.Sample(1600, 680, 60)] * 3

    monkeypatch.setattr(power_bench, "run_sustained", stand_in_loop)
    argv = ["128", "128", "--dtype", "e4m3", "--peers", "fa3", "fa4", "--constant-inputs"]
    assert power_bench.main([*argv, "--nvidia-smi", sys.executable]) == 0
    out, err = capsys.readouterr()
    assert "SDPA CUDNN cannot run e4m3: PyTorch's SDPA takes no float8_e4m3fn inputs" in err
    assert [cfg for cfg, *_ in extension.calls] == [E4M3_128] * 2  # random and constant inputs
    assert len(fa3_calls) == 2
    for keywords in [*extension.fp8_keywords, *fa3_calls]:
        _assert_descales_of_one(keywords, batch=16, heads_kv=16)
    runs = [line.rsplit(None, 7)[:2] for line in out.splitlines()[3:-1]]
    assert runs == [[label, inputs] for inputs in ("random", "constant") for label in (E4M3_128.short_form(), "FA3")]
    assert out.splitlines()[-1] == f"FA4: missing: {common.dtype_refusal('fa4', DType.E4M3)}"


def test_ncu_bench_profiles_e4m3_through_run_kernels():
    args = ncu_bench.parse_args(["--dtype", "fp8", "--peers", "fa3"])
    command = ncu_bench.ncu_command("ncu", args, common.benchmark_problem(4096, 128), "fa3")
    run_args = run_kernels.parse_args(command[command.index(sys.executable) + 2 :])
    assert (run_args.dtype, run_args.peer) == ("e4m3", "fa3")


def test_profiling_and_sass_tools_name_the_default_sets_e4m3_kernels_by_their_configuration():
    e4m3 = [cfg for cfg in map(parse_kernel_name_into_config, DEFAULT_BUILD_KERNELS) if cfg.dtype == DType.E4M3]
    assert e4m3 and set(e4m3) <= set(get_kernel_configs("default"))
    symbols = sass_counts.KernelSymbols()
    for cfg in e4m3:
        for variant in ALL_VARIANTS:
            assert symbols.lookup(cfg.mangled_kernel_name(variant)) == (cfg, variant)
            assert ncu_bench.classify_kernel(cfg.demangled_kernel_name(variant)).label == cfg.short_form()


def test_autotune_sweeps_e4m3_configurations_into_e4m3_dispatch_table_entries(stand_in_gpu, tmp_path, capsys):
    from flash_helpers.dispatch_table import DispatchTable

    extension = stand_in_gpu(kernels=FP8_STAND_IN_KERNELS)
    sweep = ["--dtypes", "e4m3", "--d-heads", "128", "--seq-lens", "128", "--causal", "off"]
    # The tuning set, the default selection, has no e4m3 configuration: nothing runs, and a note says so.
    assert autotune.main([*sweep, "--csv", str(tmp_path / "tune.csv")]) == 0
    assert "note: no selected configuration runs e4m3" in capsys.readouterr().err and extension.calls == []

    table_path = tmp_path / "sm_90.json"
    argv = [*sweep, "--kernels", "default", "--csv", str(tmp_path / "tune.csv"), "--dispatch-table", str(table_path)]
    assert autotune.main([*argv, "--arch", "sm_90", "--gpu", "stand-in GPU"]) == 0
    assert [cfg for cfg, *_ in extension.calls] == [E4M3_128]
    _assert_descales_of_one(extension.fp8_keywords[0], batch=16, heads_kv=16)
    (entry,) = DispatchTable.load(table_path).entries
    # The dtype as automatic configuration reads it (flash_attention.dispatch: DType[entry.dtype]).
    assert (DType[entry.dtype], entry.d_head, entry.causal, entry.ranked) == (
        DType.E4M3, 128, False, (E4M3_128.short_form(),)
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# progression


def _progression_timings(steps) -> list:
    """FLASH at 2.0 ms; the first step 4x and the second 2x slower, each with two configurations
    (the faster counts) at seq 1024 and 4096."""

    def timing(step, config, seq_len, time_ms):
        return progression.StepTiming(step, config, "fp16", seq_len, 16, 16, time_ms, 1000 / time_ms)

    timings = []
    for seq_len in (1024, 4096):
        timings.append(timing("sdpa_flash", "", seq_len, 2.0))
        for step, slowdown in zip(steps, (4, 2), strict=True):
            timings += [timing(step.name, "a", seq_len, 2.0 * slowdown), timing(step.name, "b", seq_len, 100.0)]
    return timings


def test_progression_table_per_step():
    steps = progression.snapshots.all_steps()[:2]
    rows = progression.summary_rows(steps, _progression_timings(steps), [1024, 4096])
    lines = progression.format_summary(rows, [1024, 4096], "fp16").splitlines()
    assert lines[1].split()[:3] == ["step", "what", "changed"]
    first, second = lines[3], lines[4]
    assert first.startswith(steps[0].name) and steps[0].title in first
    assert first.split()[-3:] == ["25.0", "0.250", "125.0"]  # % of FLASH at 4096, harmonic mean, TFLOP/s
    assert second.split()[-3:] == ["50.0", "0.500", "250.0"]


def test_progression_plot(tmp_path):
    pytest.importorskip("matplotlib")
    steps = progression.snapshots.all_steps()[:2]
    timings = _progression_timings(steps)
    rows = progression.summary_rows(steps, timings, [1024, 4096])
    progression.plot(str(tmp_path / "steps.png"), rows, timings, [1024, 4096], "fp16")
    assert (tmp_path / "steps.png").read_bytes().startswith(b"\x89PNG")


def test_progression_reports_a_tree_that_fails_to_build(tmp_path):
    result = progression.build_in_subprocess("99_no_such_step", tmp_path, jobs=1)
    assert result.error.startswith("build failed (exit status 2;")
    assert "no step '99_no_such_step'" in result.error


@pytest.mark.parametrize("flag", ["--seq-lens", "--seq_lens"])
def test_progression_arguments(flag):
    args = progression.parse_args(["--steps", "1", "10_lazy_rescale", flag, "512", "4096", "--dtype", "bf16"])
    assert [step.name for step in args.steps] == ["01_base", "10_lazy_rescale"]
    assert args.seq_lens == [512, 4096] and args.dtype == "bf16"


def test_progression_steps_end_with_the_hopper_steps_of_the_current_tree():
    tree = progression.tree_steps()
    assert [step.name for step in tree] == [name for name, _ in SM90_PROGRESSION_STEPS]
    assert list(progression.all_steps()) == [*progression.snapshots.all_steps(), *tree]
    assert progression.parse_args([]).steps == progression.all_steps()
    assert [step.title for step in tree] == [progression.tree_step_title(name) for name, _ in SM90_PROGRESSION_STEPS]
    for step, (_, flags) in zip(tree, SM90_PROGRESSION_STEPS, strict=True):
        assert step.configs and all(isinstance(cfg, HopperForwardKernelConfig) for cfg in step.configs)
        assert {(cfg.d_head, cfg.stages) for cfg in step.configs} == {(progression.D_HEAD, 2)}
        assert {cfg.short_form().partition(": ")[2] for cfg in step.configs} == {flags}
    args = progression.parse_args(["--steps", "3", "hopper_pingpong"])
    assert [step.name for step in args.steps] == ["03_swizzled", "hopper_pingpong"]


def test_each_hopper_step_has_its_step_md_numbered_after_the_trees_steps():
    directories = progression.tree_step_dirs()
    assert list(directories) == [name for name, _ in SM90_PROGRESSION_STEPS]
    last_tree_step = progression.snapshots.all_steps()[-1].number
    for number, (name, directory) in enumerate(directories.items(), start=last_tree_step + 1):
        assert directory.name == f"{number:02d}_{name}"
        heading = (directory / "STEP.md").read_text().splitlines()[0]
        assert heading.startswith(f"# {number:02d} {name}: ") and progression.tree_step_title(name)


def test_a_hopper_step_without_its_step_md_is_named(monkeypatch, tmp_path):
    monkeypatch.setattr(progression, "TREE_STEPS_DIR", tmp_path)
    with pytest.raises(FileNotFoundError, match="'hopper_ws' has no directory NN_hopper_ws"):
        progression.tree_step_title("hopper_ws")


class StandInBuild:
    """The built extension as progression.py uses it, on the CPU: the configurations compiled, and
    ``_C.forward`` returning (o, lse, runtime) like the binding, computing attention in float32 and
    recording the configurations it ran."""

    def __init__(self, compiled):
        self.compiled, self.ran = list(compiled), []
        self._C = types.SimpleNamespace(forward=self._forward)

    def compiled_configs(self):
        return self.compiled

    def compiled_kernel_set(self):
        return "stand-in"

    def _forward(self, cfg, q, k, v, o=None):
        self.ran.append(cfg)
        out = _attention(q, k, v, causal=False).to(q.dtype)
        return (out if o is None else o.copy_(out)), None, None


PROG = get_kernel_configs("prog")


def test_progression_runs_the_compiled_hopper_steps_on_sm90():
    build = StandInBuild(PROG)
    runs, skipped = progression.tree_runs(progression.tree_steps(), "bf16", (9, 0), "H200", build)
    assert skipped == []
    head = "sm90(BF16, 128, {}, {}, {})".format(*SM90_PROGRESSION_BLOCK)
    assert [(run.step, run.config.short_form()) for run in runs] == [
        (name, f"{head}: {flags}" if flags else head) for name, flags in SM90_PROGRESSION_STEPS
    ]
    assert all(run.module is build._C for run in runs)


def test_progression_skips_the_hopper_steps_with_the_reason():
    steps = progression.tree_steps()
    runs, skipped = progression.tree_runs(steps, "fp16", (8, 0), "A100", StandInBuild(PROG))
    assert runs == [] and len(skipped) == len(steps)
    assert skipped[0] == (
        "hopper_base: skipped: A100 is sm_80, and the Hopper family's sm_90a code runs on sm_90 only"
    )
    sm80_only = StandInBuild(cfg for cfg in PROG if not isinstance(cfg, HopperForwardKernelConfig))
    runs, skipped = progression.tree_runs(steps, "fp16", (9, 0), "H200", sm80_only)
    assert runs == [] and [line.split(":")[0] for line in skipped] == [step.name for step in steps]
    assert "build (kernel set 'stand-in') has none of its fp16 configurations" in skipped[0]
    assert f"{BUILD_KERNELS_ENV}=prog" in skipped[0] and "9.0 in TORCH_CUDA_ARCH_LIST" in skipped[0]


@pytest.mark.parametrize("capability", [(9, 0), (8, 6)])
def test_progression_measures_and_labels_the_hopper_steps(capability, monkeypatch, capsys):
    """The whole command with today's build stood in for on the CPU: the Hopper steps are timed, checked
    against FLASH and labelled on sm_90, and skipped with the reason elsewhere."""
    torch = pytest.importorskip("torch")
    build = StandInBuild(PROG)
    monkeypatch.setitem(sys.modules, "flash_attention", build)
    monkeypatch.setattr(common, "gpu_available", lambda: True)
    monkeypatch.setattr(common, "DEVICE", "cpu")
    monkeypatch.setattr(common, "make_timer", lambda rep_ms: (lambda fn: (fn(), 2.0)[1], "the stand-in's timings"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "stand-in GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda: capability)
    status = progression.main(["--steps", "hopper_base", "hopper_overlap", "--seq-lens", "128", "256"])
    out, err = capsys.readouterr()
    assert status == 0, err
    table = out.split("FLASH = SDPA's FlashAttention-2")[1].split("TFLOP/s by sequence length")[0]
    if capability == (9, 0):
        assert {cfg.short_form() for cfg in build.ran} == {
            "sm90(FP16, 128, 128, 128, 2)", "sm90(FP16, 128, 128, 128, 2): ws+pingpong+overlap"
        }  # fmt: skip
        steps = [line for line in table.splitlines() if line.startswith("hopper_")]
        assert [line.split()[0] for line in steps] == ["hopper_base", "hopper_overlap"]
        assert all(progression.tree_step_title(line.split()[0]) in line for line in steps)
        assert "skipped" not in out and "CORRECTNESS" not in err
    else:
        assert build.ran == []
        assert "hopper_base: skipped: stand-in GPU is sm_86" in out and "hopper_overlap: skipped" in out
        assert not [line for line in table.splitlines() if line.startswith("hopper_")]


@pytest.mark.parametrize("error, fails", [(0.005, False), (0.02, True), (math.nan, True)])
def test_flash_mismatch(error, fails):
    torch = pytest.importorskip("torch")
    flash_output = torch.zeros(2, 3)
    out = flash_output.clone()
    out[1, 2] = error
    message = common.flash_mismatch(out, flash_output, "fp16", "cfg X at seq 512")
    assert (message is not None) == fails
    if fails:
        assert message.startswith("CORRECTNESS FAILURE: cfg X at seq 512: max |ours - SDPA FLASH|")


def test_progression_rejects_an_unknown_step():
    result = run_tool(sys.executable, str(BENCHMARK_DIR / "progression.py"), "--steps", "99")
    assert result.returncode == 2 and "no step '99'" in result.stderr


def test_work_order_numbers_every_query_block_of_every_head_once():
    for Q_blocks, units, chunk in [(16, 256, 16), (5, 7, 3), (8, 6, 6), (3, 10, 1), (4, 9, 64)]:
        order = work_order_tail.work_order(Q_blocks, units, min(chunk, units))
        assert sorted(order) == [(q, u) for q in range(Q_blocks) for u in range(units)]
    # One head per chunk is each head's query blocks, longest first, head after head.
    assert work_order_tail.work_order(3, 2, 1) == [(2, 0), (1, 0), (0, 0), (2, 1), (1, 1), (0, 1)]
    # Inside a chunk, every head's longest query block first.
    assert work_order_tail.work_order(2, 3, 3) == [(1, 0), (1, 1), (1, 2), (0, 0), (0, 1), (0, 2)]


def test_work_order_tail_models_the_kernels_chunk_budget():
    # The model's budget is the kernel's: WORK_CHUNK_KV_BYTES as work_order.cuh states it.
    header = (REPO_ROOT / "src" / "sm90" / "work_order.cuh").read_text()
    stated = re.search(r"constexpr int64_t WORK_CHUNK_KV_BYTES = (\d+) << (\d+);", header)
    assert stated, "work_order.cuh states WORK_CHUNK_KV_BYTES as a shift"
    assert work_order_tail.KERNEL_CHUNK_KV_BYTES == int(stated[1]) << int(stated[2])


def test_work_order_tail_of_the_kernels_order_is_shorter(capsys):
    costs = lambda chunk: [q + 2.0 for q, _ in work_order_tail.work_order(16, 256, chunk)]  # noqa: E731
    assert work_order_tail.efficiency(costs(16), 132) > work_order_tail.efficiency(costs(1), 132) + 0.01
    assert work_order_tail.efficiency([1.0] * 264, 132) == 1.0
    assert work_order_tail.main(["--seq-lens", "2048"]) == 0
    assert "2048" in capsys.readouterr().out


# An exported source page: the kernel's name first, then the header, then a row per instruction.
STALL_PATHS_CSV = """"Kernel Name","void kernel()"
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","Instructions Executed","stall_wait","stall_barrier","stall_wait (Not Issued)"
"0x10","  FFMA R1, R2, R3, R4","30","20","800","25","0","20"
"0x20","  @!P0  BRA 0x10","10","10","800","0","10","0"
"0x30","  STS [R5], R6","6","4","100","1","5","1"
"0x40","  MUFU.RCP R7, R8","4","4","100","4","0","4"
"0x50","  EXIT","0","0","0","0","0","0"
"""


def test_stall_paths_groups_instructions_by_their_execution_count(tmp_path, capsys):
    instructions = stall_paths.read_instructions(STALL_PATHS_CSV.splitlines())
    assert [instruction.opcode for instruction in instructions] == ["FFMA", "BRA", "STS", "MUFU", "EXIT"]
    assert instructions[0].stalls == {"wait": 25.0}  # the not-issued column is left out
    groups = stall_paths.group_by_executions(instructions)
    assert [(group.executed, group.samples, len(group.instructions)) for group in groups] == [(800, 40, 2), (100, 10, 2)]
    text = stall_paths.report(instructions, groups=4, hottest=1)
    # 40 of 50 samples in the loop's group; a pass of the other costs (10 / 100) / (40 / 800) = 2 of the loop's.
    assert "| 800 | 80.0 | 2 | 1.00 |" in text and "| 100 | 20.0 | 2 | 2.00 |" in text
    assert "wait 60.0, barrier 30.0" in text and "60.00 FFMA R1, R2, R3, R4" in text
    path = tmp_path / "sass.csv"
    path.write_text(STALL_PATHS_CSV)
    assert stall_paths.main([str(path), "--groups", "1", "--hottest", "0"]) == 0
    assert "(1 more groups, 20.0% of the samples)" in capsys.readouterr().out


def test_stall_paths_rejects_a_file_without_its_columns(tmp_path, capsys):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")
    assert stall_paths.main([str(path)]) == 1
    assert "no header with the columns" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        stall_paths.parse_args([str(path), "--groups", "0"])


# ----------------------------------------------------------------------------------------------
# ab_builds

# A stand-in benchmark: imports the benchmarks' common module as they do, then writes a CSV row per
# implementation whose gbps says which build's flash_attention package it would import (base 2.0,
# change 3.0; the peer 5.0 either way), and appends that build to a log.
_AB_BENCHMARK = """
import csv, importlib.util, pathlib, sys
sys.path.insert(0, {benchmarks!r})
import bench_common
package = pathlib.Path(importlib.util.find_spec("flash_attention").origin).parent
build = "change" if package == pathlib.Path({repo!r}) / "py" / "flash_attention" else "base"
with open({log!r}, "a") as log:
    log.write(build + " " + " ".join(sys.argv[1:-2]) + "\\n")
path = sys.argv[sys.argv.index("--csv") + 1]
with open(path, "w", newline="") as file:
    writer = csv.writer(file)
    writer.writerow(["dtype", "keys", "implementation", "time_ms", "gbps"])
    writer.writerow(["bf16", 8192, "ours", 0.25, 2.0 if build == "base" else 3.0])
    writer.writerow(["bf16", 8192, "SDPA", 0.125, 5.0])
"""


def test_ab_builds_runs_the_builds_in_turn_and_compares_them(tmp_path):
    log = tmp_path / "runs.log"
    script = tmp_path / "stand_in_bench.py"
    script.write_text(_AB_BENCHMARK.format(benchmarks=str(BENCHMARK_DIR), repo=str(REPO_ROOT), log=str(log)))
    # The base tree's own packages: what its runs import, not this checkout's.
    shutil.copytree(REPO_ROOT / "py" / "flash_helpers", tmp_path / "base" / "py" / "flash_helpers")
    (tmp_path / "base" / "py" / "flash_attention").mkdir(parents=True)
    (tmp_path / "base" / "py" / "flash_attention" / "__init__.py").write_text("")
    combined = tmp_path / "all.csv"
    result = run_tool(
        sys.executable, BENCHMARK_DIR / "ab_builds.py", "--base-tree", tmp_path / "base", "--no-build", "--rounds", "2",
        "--work-dir", tmp_path / "work", "--csv", combined, "--", script, "--shapes", "1x8192",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert log.read_text().splitlines() == ["base --shapes 1x8192", "change --shapes 1x8192"] * 2
    table = result.stdout.splitlines()
    assert "| implementation | base gbps | change gbps | change/base | base runs | change runs |" in table
    assert "| ours | 2 | 3 | 1.500 | 2, 2 | 3, 3 |" in table
    assert "| SDPA | 5 | 5 | 1.000 | 5, 5 | 5, 5 |" in table
    with open(combined, newline="") as file:
        rows = list(csv.DictReader(file))
    runs = [(row["build"], row["run"]) for row in rows[::2]]
    assert runs == [("base", "1"), ("change", "2"), ("base", "3"), ("change", "4")]


def test_ab_builds_summary_names_rows_by_their_non_measurement_columns():
    rows = [
        {"build": build, "run": str(run), "dtype": "bf16", "seq_len": seq, "config": "sm90(...)", "tflops": tflops,
         "time_ms": time}
        for build, run, values in (("base", 1, (100.0, 200.5)), ("change", 2, (110.0, float("nan"))))
        for seq, tflops, time in zip(("512", "1024"), values, ("0.51", "0.25"))
    ]  # fmt: skip
    rows = [{k: str(v) for k, v in row.items()} for row in rows]
    metric, columns, lines = ab_builds.summarize(rows)
    assert metric == "tflops" and columns == ["seq_len"]  # time_ms is a measurement; dtype, config never vary
    assert lines[0]["seq_len"] == "512" and lines[0]["ratio"] == pytest.approx(1.1)
    assert math.isnan(lines[1]["change_median"]) and math.isnan(lines[1]["ratio"])
    assert ab_builds.summarize(rows, "time_ms")[0] == "time_ms"
    with pytest.raises(ValueError, match="--metric gbps"):
        ab_builds.summarize(rows, "gbps")
    with pytest.raises(ValueError, match="name --metric"):
        ab_builds.summarize([{"build": "base", "run": "1", "implementation": "ours", "host_us": "1.5"}])


@pytest.mark.parametrize("status", [0, 3])
def test_ab_builds_builds_a_tree_in_place_with_the_selection_and_jobs(tmp_path, status):
    """build() runs the tree's own setup.py (here a stand-in that records what it got) in the tree, with
    the kernel selection and MAX_JOBS, its output in the log, and returns its exit status."""
    (tmp_path / "setup.py").write_text(
        "import os, sys\n"
        f"print(sys.argv[1:], os.environ['{BUILD_KERNELS_ENV}'], os.environ['MAX_JOBS'], os.getcwd())\n"
        f"sys.exit({status})\n"
    )
    log = tmp_path / "build.log"
    assert ab_builds.build(tmp_path, log, "(FP16, 64, 16, 64, 4)", 3) == status
    expected = ["['build_ext',", "'--inplace']", "(FP16,", "64,", "16,", "64,", "4)", "3", str(tmp_path)]
    assert log.read_text().split() == expected


def test_ab_builds_runs_base_first_then_in_turn():
    assert ab_builds.run_order(3) == [("base", 1), ("change", 1), ("base", 2), ("change", 2), ("base", 3),
                                      ("change", 3)]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--base", "HEAD"], "name the benchmark after '--'"),
        (["--base", "HEAD", "--", "decode_bench"], "name the benchmark after '--'"),
        (["--base", "HEAD", "--", "tools/benchmark/decode_bench.py", "--csv", "x.csv"], "--csv is ab_builds' own"),
        (["--base", "HEAD", "--rounds", "0", "--", "tools/benchmark/decode_bench.py"], "--rounds must be at least 1"),
        (["--", "tools/benchmark/decode_bench.py"], "one of the arguments --base --base-tree is required"),
        (["--base", "HEAD", "--base-tree", "x", "--", "tools/benchmark/decode_bench.py"], "not allowed with argument"),
    ],
)
def test_ab_builds_rejects_bad_arguments(argv, words, capsys):
    with pytest.raises(SystemExit) as error:
        ab_builds.parse_args(argv)
    assert error.value.code == 2 and words in capsys.readouterr().err


def test_ab_builds_refuses_a_base_tree_that_is_not_one(tmp_path):
    result = run_tool(
        sys.executable, BENCHMARK_DIR / "ab_builds.py", "--base-tree", tmp_path, "--no-build", "--work-dir",
        tmp_path / "work", "--", "tools/benchmark/decode_bench.py",
    )  # fmt: skip
    assert result.returncode == 1 and "holds no tree of this repository" in result.stderr


@pytest.mark.skipif(not (REPO_ROOT / ".git").exists(), reason="this checkout has no git history to export from")
def test_ab_builds_exports_a_revision(tmp_path):
    ab_builds.export_revision("HEAD", tmp_path / "base")
    assert (tmp_path / "base" / "setup.py").is_file() and (tmp_path / "base" / "py" / "flash_helpers").is_dir()
    with pytest.raises(SystemExit, match="git archive no-such-revision failed"):
        ab_builds.export_revision("no-such-revision", tmp_path / "other")
