"""Tests of the benchmark and analysis tools that need no GPU, ncu or cuobjdump: every command line
answers --help, the parsers read realistic ncu and cuobjdump output, the autotuning summary ranks
correctly, configuration selection explains what is not compiled, and the tools that time kernels
refuse clearly where no GPU is visible."""

import csv
import dataclasses
import math
import os
import pathlib
import subprocess
import sys

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCHMARK_DIR = REPO_ROOT / "tools" / "benchmark"
ANALYSIS_DIR = REPO_ROOT / "tools" / "analysis"
sys.path[:0] = [str(BENCHMARK_DIR), str(ANALYSIS_DIR)]

import autotune  # noqa: E402
import bench_common as common  # noqa: E402
import ncu_bench  # noqa: E402
import progression  # noqa: E402
import pt_bench  # noqa: E402
import sass_counts  # noqa: E402
from flash_helpers.dtypes import DType  # noqa: E402
from flash_helpers.problem import attention_flop, total_flop  # noqa: E402
from flash_helpers.kernel_sets import (  # noqa: E402
    BUILD_KERNELS_ENV,
    KERNELS_ENV,
    get_all_kernel_configs,
    get_autotuning_kernel_configs,
)

PYTHON_TOOLS = [
    BENCHMARK_DIR / "pt_bench.py",
    BENCHMARK_DIR / "run_kernels.py",
    BENCHMARK_DIR / "ncu_bench.py",
    BENCHMARK_DIR / "autotune.py",
    BENCHMARK_DIR / "progression.py",
    ANALYSIS_DIR / "sass_counts.py",
    ANALYSIS_DIR / "sass_diff.py",
]

# Configurations from the current sets, so the tests follow changes to the configuration space:
# two tuning configurations with d_head 128 and different block sizes, and a valid one outside it.
TUNE = get_autotuning_kernel_configs()
CFG_A = next(cfg for cfg in TUNE if cfg.d_head == 128)
CFG_B = next(cfg for cfg in TUNE if cfg.d_head == 128 and (cfg.B_r, cfg.B_c) != (CFG_A.B_r, CFG_A.B_c))
NOT_TUNED = next(cfg for cfg in get_all_kernel_configs() if cfg not in set(TUNE))


# nvcc's device symbols hold all 13 fields of the configuration, trailing zeros too, then the
# problem variant's mask kind and masked tails (checked against nvcc 13 on an object file); ncu
# prints them demangled.


def nvcc_demangled_name(cfg) -> str:
    """The kernel's name as ncu prints it (the demangled device symbol)."""

    def literal(value) -> str:
        if isinstance(value, DType):
            return f"(flash::DType){int(value)}"
        return str(value).lower()  # true / false, or the number

    items = ", ".join(literal(value) for value in dataclasses.astuple(cfg))
    return (
        "void flash::sm80::flash_forward_kernel<flash::sm80::StaticForwardKernelConfig<"
        f"flash::sm80::FlashForwardKernelConfig{{{items}}}>, (flash::MaskKind)0, false>(flash::ForwardParams)"
    )


def nvcc_device_symbol(cfg) -> str:
    """The kernel's device symbol as cuobjdump prints it."""

    def literal(value) -> str:
        if isinstance(value, DType):
            return f"LNS_5DTypeE{int(value)}E"
        return f"Lb{int(value)}E" if isinstance(value, bool) else f"Li{value}E"

    items = "".join(literal(value) for value in dataclasses.astuple(cfg))
    return (
        "_ZN5flash4sm8020flash_forward_kernelINS0_25StaticForwardKernelConfigIXtlNS0_24FlashForwardKernelConfigE"
        f"{items}EEEELNS_8MaskKindE0ELb0EEEvNS_13ForwardParamsE"
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


# CUDA_VISIBLE_DEVICES="" hides every GPU, so these run the same on a GPU machine.
@pytest.mark.parametrize(
    "command",
    [
        [BENCHMARK_DIR / "run_kernels.py", "1024", "128"],
        [BENCHMARK_DIR / "pt_bench.py"],
        [BENCHMARK_DIR / "autotune.py", "--csv", "unused.csv"],
        [BENCHMARK_DIR / "progression.py", "--csv", "unused.csv"],
    ],
    ids=lambda command: command[0].name,
)
def test_timing_tools_refuse_without_a_gpu(command, tmp_path):
    result = run_tool(sys.executable, *map(str, command), env_changes={"CUDA_VISIBLE_DEVICES": ""}, cwd=tmp_path)
    assert result.returncode == 1
    assert "no CUDA GPU visible" in result.stderr
    assert not (tmp_path / "unused.csv").exists()


def test_ncu_bench_without_ncu():
    result = run_tool(sys.executable, str(BENCHMARK_DIR / "ncu_bench.py"), "--ncu", "/nonexistent/ncu")
    assert result.returncode == 1
    assert "/nonexistent/ncu" in result.stderr and "not found" in result.stderr


# ----------------------------------------------------------------------------------------------
# Shared pieces


def test_benchmark_shapes():
    assert common.BATCH_BY_SEQ_LEN == {512: 16, 1024: 16, 2048: 16, 4096: 16, 8192: 8, 16384: 4}
    assert common.HEADS_BY_D_HEAD == {64: 32, 128: 16}


def test_flop_counts_are_the_problem_counts():
    assert common.flop_counts(128, 4, 16, 2048) == (attention_flop(4, 16, 2048, 128), total_flop(4, 16, 2048, 128))
    assert common.tflops(2e12, 1000.0) == pytest.approx(2.0)
    assert math.isnan(common.tflops(1e12, math.nan))


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


def test_timing_csv_round_trip(tmp_path):
    rows = [
        common.timing_row("fp16", 128, 1024, 16, 16, "ours", CFG_A.short_form(), 0.5),
        common.timing_row("fp16", 128, 1024, 16, 16, "sdpa_flash", "", math.nan),
    ]
    common.write_csv(tmp_path / "sub" / "t.csv", rows, common.TIMING_FIELDS)
    read = common.read_timing_csv(tmp_path / "sub" / "t.csv")
    assert read[0] == rows[0]
    assert read[1].implementation == "sdpa_flash" and math.isnan(read[1].time_ms)


# ----------------------------------------------------------------------------------------------
# pt_bench tables and plot


def _pt_bench_rows():
    row = common.timing_row
    return [
        row("fp16", 128, 1024, 16, 16, "ours", CFG_A.short_form(), 1.0),
        row("fp16", 128, 1024, 16, 16, "ours", CFG_B.short_form(), 2.0),
        row("fp16", 128, 1024, 16, 16, "sdpa_flash", "", 0.5),
        row("fp16", 128, 1024, 16, 16, "sdpa_cudnn", "", 0.25),
        row("fp16", 128, 1024, 16, 16, "sdpa_efficient", "", math.nan),
        row("fp16", 128, 2048, 16, 16, "ours", CFG_B.short_form(), 2.0),
        row("fp16", 128, 2048, 16, 16, "sdpa_flash", "", 1.0),
        row("fp16", 128, 2048, 16, 16, "sdpa_cudnn", "", 1.0),
        row("fp16", 128, 2048, 16, 16, "sdpa_efficient", "", 4.0),
    ]


def test_pt_bench_table_shows_the_best_configuration_and_the_ratio_to_flash():
    text = pt_bench.format_group_table("fp16", 128, _pt_bench_rows())
    lines = text.splitlines()
    assert lines[1].split() == ["seq", "batch", "best", "config", "ours", "FLASH", "CUDNN", "EFFICIENT", "ours/FLASH"]
    assert CFG_A.short_form() in lines[3] and lines[3].endswith("0.500")  # 1.0 ms against FLASH's 0.5 ms
    assert CFG_B.short_form() in lines[4] and lines[4].endswith("0.500")
    assert lines[3].split()[-2] == "-"  # EFFICIENT could not run at 1024
    assert lines[-1] == "harmonic mean of ours/FLASH over 2 sequence lengths: 0.500"


def test_pt_bench_plot(tmp_path):
    pytest.importorskip("matplotlib")
    pt_bench.plot(str(tmp_path / "plot.png"), _pt_bench_rows())
    assert (tmp_path / "plot.png").read_bytes().startswith(b"\x89PNG")


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

    row = ncu_bench.profile_row(ours, "fp16", 128, 4096, 16, 16)
    assert row.duration_us == pytest.approx(1400.0)
    assert row.registers == 255 and row.smem_bytes == 49152
    assert row.occupancy_pct == pytest.approx(12.25) and row.dram_pct == pytest.approx(11.0)
    assert row.tflops == pytest.approx(total_flop(16, 16, 4096, 128) / 1.4e-3 / 1e12)
    assert row.attn_tflops == pytest.approx(attention_flop(16, 16, 4096, 128) / 1.4e-3 / 1e12)
    assert "SDPA FLASH (FA2)" in ncu_bench.format_profile_table(
        [row, ncu_bench.profile_row(flash, "fp16", 128, 4096, 16, 16)]
    )


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
    command = ncu_bench.ncu_command("ncu", args, 4096, 128, 16, 16)
    assert command[:3] == ["ncu", "--clock-control", "none"]
    assert "--csv" in command and command[command.index("--metrics") + 1].split(",") == list(ncu_bench.NCU_METRICS)
    tail = command[command.index(sys.executable) :]
    assert tail[1:4] == [str(BENCHMARK_DIR / "run_kernels.py"), "4096", "128"]
    assert tail[tail.index("--kernels") + 1] == CFG_A.short_form() and "--check" not in tail


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
    assert "fp16, seq 4096, d_head 128, batch 16, 16 heads (averages over 2 run(s))" in result.stdout
    assert CFG_A.short_form() in result.stdout and "SDPA FLASH (FA2)" in result.stdout
    assert "distribution" not in result.stdout
    argv = (tmp_path / "ncu_argv.txt").read_text().splitlines()
    assert argv[argv.index("--n_runs") + 1] == "2" and argv[argv.index("--reference") + 1] == "flash"
    with open(tmp_path / "profile.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [row["kernel"] for row in rows] == [CFG_A.short_form(), "SDPA FLASH (FA2)"]
    assert float(rows[0]["duration_us"]) == pytest.approx(1400.0) and rows[0]["launches"] == "2"


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


def _sass_listing(arch: str, extra_hmma: int) -> str:
    head = f"\nFatbin elf code:\n================\narch = {arch}\ncode version = [1,7]\nhost = linux\n"
    head += f"compile_size = 64bit\n\n\tcode for {arch}"
    cfg_a = _sass_function(
        nvcc_device_symbol(CFG_A),
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
        ],
    )
    cfg_b = _sass_function(
        CFG_B.mangled_kernel_name(),
        [
            "HMMA.16816.F32 R4, R8, R12, R4 ;",
            "STL.64 [R1], R2 ;",
            "LDL.64 R2, [R1] ;",
            "SHFL.BFLY PT, R5, R4, 0x1, 0x1f ;",
            "@UP0 FMNMX R3, R3, R4, !PT ;",
            "EXIT ;",
        ],
    )
    other = _sass_function("_Z12other_kernelPf", ["EXIT ;"])
    return "\n".join([head, cfg_a, cfg_b, other])


SASS_LISTING = (
    _sass_listing("sm_80", 0)
    + "\n\n"
    + _sass_listing("sm_90", 3)
    + ("\n\nFatbin ptx code:\n================\narch = sm_90\ncode version = [8,8]\nhost = linux\ncompressed\n")
)


def test_sass_parser_counts_per_function_and_architecture():
    functions = sass_counts.parse_sass(SASS_LISTING)
    assert [(f.arch, f.symbol) for f in functions] == [
        (arch, symbol)
        for arch in ("sm_80", "sm_90")
        for symbol in (nvcc_device_symbol(CFG_A), CFG_B.mangled_kernel_name(), "_Z12other_kernelPf")
    ]
    sm80_a = functions[0].opcodes
    assert sm80_a["HMMA.16816.F32"] == 3  # two plain, one predicated
    assert sm80_a["LDS.U16"] == 1 and sm80_a["LDSM.16.M88.4"] == 1 and sm80_a["LDGSTS.E.BYPASS.128"] == 1
    assert sm80_a["BRA"] == 2 and sm80_a["NOP"] == 2 and sm80_a["BAR.SYNC.DEFER_BLOCKING"] == 1
    assert sum(sm80_a.values()) == 14
    assert functions[3].opcodes["HMMA.16816.F32"] == 6
    assert functions[1].opcodes["FMNMX"] == 1


def test_sass_functions_map_to_their_configurations():
    kernels, others = sass_counts.map_to_configs(sass_counts.parse_sass(SASS_LISTING))
    assert [(k.arch, k.config) for k in kernels] == [
        (arch, cfg) for arch in ("sm_80", "sm_90") for cfg in sorted([CFG_A, CFG_B])
    ]
    assert [f.symbol for f in others] == ["_Z12other_kernelPf"] * 2
    by_key = {(k.arch, k.config): k for k in kernels}
    families = by_key["sm_80", CFG_A].families
    assert families["HMMA"] == 3 and families["LDS"] == 1 and families["LDSM"] == 1 and families["MUFU"] == 1
    assert families[sass_counts.TOTAL] == 12  # 14 instructions less the 2 padding NOPs
    assert by_key["sm_90", CFG_A].families["HMMA"] == 6
    cfg_b = by_key["sm_80", CFG_B].families
    assert cfg_b["STL"] == 1 and cfg_b["LDL"] == 1 and cfg_b["SHFL"] == 1 and cfg_b["FMNMX"] == 1


def test_sass_counts_and_diff_command_lines(tmp_path):
    listing = tmp_path / "sass.txt"
    listing.write_text(SASS_LISTING)
    result = run_tool(
        sys.executable,
        str(ANALYSIS_DIR / "sass_counts.py"),
        "--sass-file",
        str(listing),
        "--csv",
        str(tmp_path / "c.csv"),
    )
    assert result.returncode == 0, result.stderr
    assert "sm_80: instructions per family" in result.stdout and "sm_90" in result.stdout
    assert CFG_A.short_form() in result.stdout
    with open(tmp_path / "c.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    hmma = [r for r in rows if r["config"] == CFG_A.short_form() and r["opcode"] == "HMMA.16816.F32"]
    assert [(r["arch"], r["count"]) for r in hmma] == [("sm_80", "3"), ("sm_90", "6")]

    result = run_tool(
        sys.executable, str(ANALYSIS_DIR / "sass_diff.py"), CFG_B.short_form(), CFG_A.short_form(),
        "--sass-file", str(listing), "--arch", "sm_90",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:3] == ["sm_90", f"A = {CFG_B.short_form()}", f"B = {CFG_A.short_form()}"]
    opcode_table = lines[lines.index(next(line for line in lines if line.startswith("opcode"))) :]
    assert opcode_table[2].split() == ["HMMA.16816.F32", "1", "6", "5"]  # the largest difference comes first

    result = run_tool(
        sys.executable, str(ANALYSIS_DIR / "sass_diff.py"), CFG_A.short_form(), "(BF16, 64, 64, 64, 4): async",
        "--sass-file", str(listing),
    )  # fmt: skip
    assert result.returncode == 1 and "missing: (BF16, 64, 64, 64, 4): async" in result.stderr


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


def _tuning_rows():
    names = {name: f"(FP16, 128, {64 + 64 * (i % 2)}, {32 * 2 ** (i // 2)}, 4): async" for i, name in enumerate(TUNING)}
    rows = []
    for name, by_seq in TUNING.items():
        for seq_len, tflops in by_seq.items():
            batch, heads = common.batch_for_seq_len(seq_len), common.heads_for_d_head(128)
            attn_flop, _ = common.flop_counts(128, batch, heads, seq_len)
            time_ms = attn_flop / tflops / 1e9
            rows.append(common.timing_row("fp16", 128, seq_len, batch, heads, "ours", names[name], time_ms))
    rows.append(common.timing_row("fp16", 128, 512, 16, 16, "sdpa_flash", "", 0.001))  # not ours: ignored
    return rows, names


def test_autotune_ranking():
    rows, names = _tuning_rows()
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


def test_autotune_summary_only_needs_no_gpu(tmp_path):
    rows, names = _tuning_rows()
    common.write_csv(tmp_path / "tune.csv", rows, common.TIMING_FIELDS)
    result = run_tool(
        sys.executable, str(BENCHMARK_DIR / "autotune.py"), "--summary-only", str(tmp_path / "tune.csv"),
        "--top", "2", "--summary", str(tmp_path / "summary.txt"),
        env_changes={"CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"candidate default: {names['B']}" in result.stdout
    assert "Top 2 of 4: fp16, d_head 128, seq 512" in result.stdout
    assert (tmp_path / "summary.txt").read_text().strip() == result.stdout.strip()


def test_autotune_summary_only_rejects_other_files(tmp_path):
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    result = run_tool(sys.executable, str(BENCHMARK_DIR / "autotune.py"), "--summary-only", str(tmp_path / "other.csv"))
    assert result.returncode == 1 and "not a timing CSV file" in result.stderr


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
