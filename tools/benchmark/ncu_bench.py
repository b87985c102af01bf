#!/usr/bin/env python3
"""Profiles the compiled forward kernels (and PyTorch SDPA references and the peers) with Nsight Compute.

For each (seq_len, d_head, mask) it runs

    ncu --clock-control none --csv --page raw --metrics <NCU_METRICS> python run_kernels.py SEQ D_HEAD ...

at the benchmark shape (batch 16, at most 64Ki tokens: 16/16/16/16/8/4 for seq 512..16384;
heads * d_head = 2048: 16 heads for d_head 128, 32 for d_head 64; --seqlen_k gives the keys and
values another length than the queries'; --shape llama70b: batch 2, 64 query heads over 8
key/value heads of 128, as pt_bench.py has it), with the causal mask or without (--causal), maps
each profiled kernel back to its configuration's short form (SDPA kernels to the backend's name;
other kernels, such as the inputs' random fill, are left out), averages over the runs and prints
per kernel: duration, cycles, the SM clock, registers per thread, shared memory
per block, achieved occupancy, L2 hit rate, DRAM throughput, the tensor pipe's, the FMA pipe's
and the MUFU (XU) pipe's utilization, the issue slots used, the instructions executed, shared
memory's bank reads and writes (of their peak), and
TFLOP/s counting all the work (total_flop) or only the two matmuls (attn_flop); with the causal
mask, half of the unmasked problem's, as FlashAttention counts. Then, for each kernel at a length
that is not a multiple of 128 and at the next multiple (both among --seq_lens), how many more
cycles per attention FLOP it takes at the former. With --stall-reasons, also per kernel why its warps
did not issue: for each reason Nsight Compute's warp state statistics name (waiting on a fixed
latency, a barrier, a long or short scoreboard, a matrix instruction, ...), the warps stalled on it
per issued instruction (the reasons add up to the warp cycles per issued instruction), the peers'
beside ours: where one kernel's warps wait more than another's, and on what.

--peers fa3 fa4 profiles each peer's flash_attn_func on the same shapes (bfloat16 or e4m3 for FA3's
fa3-fwd build), each in an ncu run of its own (run_kernels.py --peer): every kernel of that run
but PyTorch's own (the inputs' fills) is the peer's, named "FA3" where it launches one kernel and
"FA3: <kernel>" per kernel where it launches several. A peer that is missing or cannot run a
shape is reported and makes the exit status 1; the peers' wheels are installed apart, as
decode_bench.py says. --dtype e4m3 profiles FP8 inputs as run_kernels.py runs them: descales of 1
given to ours and to FA3, no SDPA backend (none takes e4m3), and FA4's run refused (nor does it).

--clock-control none leaves the GPU at its normal clocks, so durations are comparable with the
benchmark's. Needs Nsight Compute (ncu) and a GPU.
"""

from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import itertools
import math
import pathlib
import re
import shutil
import subprocess
import sys

import bench_common as common  # first: it makes flash_helpers importable from a bare checkout
from flash_helpers.families import FAMILIES
from flash_helpers.kernel_config import KernelConfig
from flash_helpers.kernel_names import parse_kernel_name_into_config

RUN_KERNELS = pathlib.Path(__file__).resolve().with_name("run_kernels.py")

# The metrics requested from ncu, by their Nsight Compute names.
TIME = "gpu__time_duration.sum"
CYCLES = "sm__cycles_elapsed.max"
REGISTERS = "launch__registers_per_thread"
SMEM_DYNAMIC = "launch__shared_mem_per_block_dynamic"
SMEM_STATIC = "launch__shared_mem_per_block_static"
OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
L2_HIT_RATE = "lts__t_sector_hit_rate.pct"
DRAM_THROUGHPUT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
TENSOR_PIPE = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
# Where a kernel's time goes besides the tensor cores: the exponentials (MUFU, the XU pipe), the
# softmax's other arithmetic (FMA pipe), the issue slots, and the clock the power limit left.
SM_CLOCK = "sm__cycles_elapsed.avg.per_second"
FMA_PIPE = "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"
XU_PIPE = "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"
ISSUE_ACTIVE = "sm__inst_issued.avg.pct_of_peak_sustained_active"
INSTRUCTIONS = "smsp__inst_executed.sum"
# Shared memory's banks, read and written: what the wgmma's shared-memory operands, ldmatrix,
# stmatrix and TMA's writes share; whether they bound a kernel (e4m3's products read as many bytes
# per cycle as 16-bit ones at twice the rate, and its V is transposed in shared memory).
SMEM_READS = "l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed"
SMEM_WRITES = "l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed"
NCU_METRICS = (
    TIME,
    CYCLES,
    SM_CLOCK,
    REGISTERS,
    SMEM_DYNAMIC,
    SMEM_STATIC,
    OCCUPANCY,
    L2_HIT_RATE,
    DRAM_THROUGHPUT,
    TENSOR_PIPE,
    FMA_PIPE,
    XU_PIPE,
    ISSUE_ACTIVE,
    INSTRUCTIONS,
    SMEM_READS,
    SMEM_WRITES,
)
# --stall-reasons: why warps did not issue, per reason the warps stalled on it per issued instruction.
STALL_REASONS = (
    "wait",
    "barrier",
    "long_scoreboard",
    "short_scoreboard",
    "dispatch_stall",
    "not_selected",
    "selected",
    "no_instruction",
    "gmma",
    "sleeping",
    "mio_throttle",
    "math_pipe_throttle",
    "branch_resolving",
    "lg_throttle",
    "membar",
    "drain",
    "imc_miss",
    "tex_throttle",
    "misc",
)
STALL_METRICS = {reason: f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio" for reason in STALL_REASONS}
# A reason is listed where some kernel of the table stalls on it at least this much.
STALL_LISTED_FROM = 0.005

# SDPA kernels, recognised by a part of their name (compared in lower case), in the order tried.
REFERENCE_KERNEL_PATTERNS = (
    (("flash_fwd",), "SDPA FLASH (FA2)"),
    (("fmha_cutlass", "mem_efficient"), "SDPA EFFICIENT"),
    (("cudnn", "sm90_", "xmma"), "SDPA CUDNN"),
)
SHORTENED_NAME_LENGTH = 60
# PyTorch's own kernels (the inputs' random fills, copies), recognised by their namespace: in a
# peer's run, every other kernel is the peer's.
TORCH_KERNEL_NAMESPACE = "at::"

# ncu's time units, in nanoseconds (the unit durations are kept in here).
_TIME_UNITS_NS = {"nsecond": 1, "ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}
# Decimal and binary prefixes ncu may put before a countable unit when it scales a value.
_UNIT_PREFIXES = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
_PREFIXED_UNIT_RE = re.compile(r"(Ki|Mi|Gi|K|M|G|T)(byte|cycle|sector|register|warp|thread|inst|block)")
_NOT_A_VALUE = {"", "n/a", "N/A", "nan"}


class NcuOutputError(ValueError):
    """ncu's output holds no CSV table that can be read."""


@dataclasses.dataclass
class KernelLaunch:
    """One profiled kernel launch: its name as ncu prints it and its metrics in base units
    (durations in nanoseconds, sizes in bytes)."""

    name: str
    metrics: dict[str, float]


@dataclasses.dataclass
class KernelName:
    """What a profiled kernel is: one of our configurations, an SDPA reference, or something else."""

    label: str  # the short form, the reference's or the peer's name, or the shortened kernel name
    kind: str  # "ours", "reference", "peer" or "other"
    config: KernelConfig | None = None


@dataclasses.dataclass
class KernelSummary:
    """The launches of one kernel, metrics averaged over them."""

    kernel: KernelName
    launches: int
    metrics: dict[str, float]


def parse_number(text: str) -> float | None:
    """A metric value as ncu prints it (``1,234,567.5``: thousands separated by commas), or None."""
    text = text.strip().replace(",", "")
    if text in _NOT_A_VALUE:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def to_base_units(value: float, unit: str) -> float:
    """``value`` in base units: times in nanoseconds, scaled counts (Kbyte, Mcycle, ...) unscaled.

    ``--print-units base`` should already give base units; this keeps the parser right for output
    made without it. The part of a unit after '/' (byte/block, register/thread) does not scale.
    """
    unit = unit.strip().split("/")[0]
    if unit in _TIME_UNITS_NS:
        return value * _TIME_UNITS_NS[unit]
    prefixed = _PREFIXED_UNIT_RE.fullmatch(unit)
    return value * _UNIT_PREFIXES[prefixed[1]] if prefixed else value


def _csv_table(text: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the CSV table in ncu's output.

    ncu's own messages (==PROF==, ==WARNING==) and whatever the profiled program printed surround the
    table; the header is the first line with a "Kernel Name" field. Lines are parsed one at a time so
    a stray quote in the program's output cannot swallow the table, and rows of the wrong width are
    dropped.
    """
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("==")]
    parsed = [next(csv.reader([line])) for line in lines]
    start = next((i for i, fields in enumerate(parsed) if "Kernel Name" in fields), None)
    if start is None:
        raise NcuOutputError("no CSV table with a 'Kernel Name' column in ncu's output")
    header = parsed[start]
    return header, [fields for fields in parsed[start + 1 :] if len(fields) == len(header)]


def parse_ncu_csv(text: str) -> list[KernelLaunch]:
    """The kernel launches in ncu's CSV output, in launch order.

    Reads both layouts ncu writes: ``--page raw`` (one row per launch, one column per metric, possibly
    a row of units under the header) and the default details page (one row per launch and metric,
    with "Metric Name", "Metric Unit" and "Metric Value" columns).
    """
    header, rows = _csv_table(text)
    if {"Metric Name", "Metric Value"} <= set(header):
        return _parse_details_page(header, rows)
    return _parse_raw_page(header, rows)


def _parse_raw_page(header: list[str], rows: list[list[str]]) -> list[KernelLaunch]:
    name_column = header.index("Kernel Name")
    id_column = header.index("ID") if "ID" in header else None
    # Metric names always contain a double underscore (gpu__time_duration.sum); the launch's
    # description columns (ID, Kernel Name, Block Size, ...) never do.
    metric_columns = [i for i, name in enumerate(header) if "__" in name]
    units: dict[int, str] = {}
    launches = []
    for row in rows:
        if not row[name_column].strip() and (id_column is None or not row[id_column].strip()):
            units = {i: row[i] for i in metric_columns}  # the units row: no launch, only units
            continue
        metrics = {}
        for i in metric_columns:
            value = parse_number(row[i])
            if value is not None:
                metrics[header[i]] = to_base_units(value, units.get(i, ""))
        launches.append(KernelLaunch(row[name_column], metrics))
    return launches


def _parse_details_page(header: list[str], rows: list[list[str]]) -> list[KernelLaunch]:
    column = {name: i for i, name in enumerate(header)}
    launches: dict[tuple, KernelLaunch] = {}
    occurrences: collections.Counter = collections.Counter()
    for row in rows:
        name, metric = row[column["Kernel Name"]], row[column["Metric Name"]]
        if "ID" in column:
            # A launch is identified by its process and its ID within the process.
            key = (row[column["Process ID"]] if "Process ID" in column else "", row[column["ID"]])
        else:
            # Without IDs, the n-th value of a kernel's metric belongs to that kernel's n-th launch.
            key = (name, occurrences[name, metric])
            occurrences[name, metric] += 1
        launch = launches.setdefault(key, KernelLaunch(name, {}))
        value = parse_number(row[column["Metric Value"]])
        if value is not None:
            unit = row[column["Metric Unit"]] if "Metric Unit" in column else ""
            launch.metrics[metric] = to_base_units(value, unit)
    return list(launches.values())


def shorten_kernel_name(name: str) -> str:
    """The function's name without 'void', template arguments and parameters, at most 60 characters."""
    name = name.strip().removeprefix("void ")
    name = re.split(r"[<(]", name, maxsplit=1)[0].strip() or name
    return name if len(name) <= SHORTENED_NAME_LENGTH else name[: SHORTENED_NAME_LENGTH - 3] + "..."


# Our kernels' demangled names hold their family's configuration type, e.g.
# flash::sm90::HopperForwardKernelConfig{...}.
_CONFIG_TYPE_NAMES = tuple(cls.__name__ for cls in FAMILIES.values())


def classify_kernel(name: str) -> KernelName:
    """Our configuration (as its short form), of any family, an SDPA backend's kernel, or another kernel."""
    if any(type_name in name for type_name in _CONFIG_TYPE_NAMES):
        try:
            cfg = parse_kernel_name_into_config(name)
        except ValueError:
            pass
        else:
            return KernelName(cfg.short_form(), "ours", cfg)
    lowered = name.lower()
    for patterns, label in REFERENCE_KERNEL_PATTERNS:
        if any(pattern in lowered for pattern in patterns):
            return KernelName(label, "reference")
    return KernelName(shorten_kernel_name(name), "other")


def is_torch_kernel(name: str) -> bool:
    """Whether a kernel is PyTorch's own (its demangled name in at::, e.g. at::native::...)."""
    name = name.strip().removeprefix("void ").lstrip()
    return name.startswith(TORCH_KERNEL_NAMESPACE)


def peer_kernels(launches: list[KernelLaunch], peer: str) -> dict[str, KernelName]:
    """The kernels of a peer's run (run_kernels.py --peer) by name: every one but PyTorch's, named
    after the peer, with the kernel's shortened name where the peer launched several."""
    names = list(dict.fromkeys(launch.name for launch in launches if not is_torch_kernel(launch.name)))
    label = peer.upper()
    if len(names) == 1:
        return {names[0]: KernelName(label, "peer")}
    return {name: KernelName(f"{label}: {shorten_kernel_name(name)}", "peer") for name in names}


def summarize(
    launches: list[KernelLaunch], include_other: bool = False, peer: str | None = None
) -> list[KernelSummary]:
    """Launches grouped by kernel (in order of first launch), each metric averaged over the launches
    that report it. Kernels that are neither ours nor a reference are left out unless asked for;
    with ``peer`` (a peer's run), the kernels that are not PyTorch's are the peer's."""
    peers = peer_kernels(launches, peer) if peer else {}
    groups: dict[str, tuple[KernelName, list[KernelLaunch]]] = {}
    for launch in launches:
        kernel = peers.get(launch.name) or classify_kernel(launch.name)
        if kernel.kind == "other" and not include_other:
            continue
        groups.setdefault(kernel.label, (kernel, []))[1].append(launch)
    summaries = []
    for kernel, group in groups.values():
        values: dict[str, list[float]] = collections.defaultdict(list)
        for launch in group:
            for name, value in launch.metrics.items():
                values[name].append(value)
        means = {name: sum(samples) / len(samples) for name, samples in values.items()}
        summaries.append(KernelSummary(kernel, len(group), means))
    return summaries


@dataclasses.dataclass
class ProfileRow:
    """One kernel at one shape: a row of the tables and of the CSV file."""

    dtype: str
    d_head: int
    causal: bool
    seq_len: int  # seqlen_q
    seqlen_k: int
    batch: int
    heads: int
    kernel: str
    launches: int
    duration_us: float
    cycles: float
    clock_mhz: float  # the SM clock over the kernel
    registers: float
    smem_bytes: float  # static + dynamic shared memory per block
    occupancy_pct: float
    l2_hit_pct: float
    dram_pct: float
    tensor_pct: float
    fma_pct: float
    mufu_pct: float  # the XU pipe: exponentials, conversions
    issue_pct: float  # issue slots used
    instructions_m: float  # warp instructions executed, millions
    smem_read_pct: float  # shared memory's banks: reads, of their peak
    smem_write_pct: float  # and writes
    tflops: float  # total_flop / duration
    attn_tflops: float  # attn_flop / duration


def profile_row(summary: KernelSummary, dtype: str, problem: common.Problem) -> ProfileRow:
    metric = summary.metrics.get
    duration_ms = metric(TIME, math.nan) / 1e6
    attn_flop, total_flop = problem.flop_counts()
    return ProfileRow(
        dtype=dtype,
        d_head=problem.d_head,
        causal=problem.causal,
        seq_len=problem.seqlen_q,
        seqlen_k=problem.seqlen_k,
        batch=problem.batch,
        heads=problem.heads_q,
        kernel=summary.kernel.label,
        launches=summary.launches,
        duration_us=duration_ms * 1e3,
        cycles=metric(CYCLES, math.nan),
        clock_mhz=metric(SM_CLOCK, math.nan) / 1e6,
        registers=metric(REGISTERS, math.nan),
        smem_bytes=metric(SMEM_STATIC, math.nan) + metric(SMEM_DYNAMIC, math.nan),
        occupancy_pct=metric(OCCUPANCY, math.nan),
        l2_hit_pct=metric(L2_HIT_RATE, math.nan),
        dram_pct=metric(DRAM_THROUGHPUT, math.nan),
        tensor_pct=metric(TENSOR_PIPE, math.nan),
        fma_pct=metric(FMA_PIPE, math.nan),
        mufu_pct=metric(XU_PIPE, math.nan),
        issue_pct=metric(ISSUE_ACTIVE, math.nan),
        instructions_m=metric(INSTRUCTIONS, math.nan) / 1e6,
        smem_read_pct=metric(SMEM_READS, math.nan),
        smem_write_pct=metric(SMEM_WRITES, math.nan),
        tflops=common.tflops(total_flop, duration_ms),
        attn_tflops=common.tflops(attn_flop, duration_ms),
    )


# Table columns: (header, ProfileRow field, float format).
TABLE_COLUMNS = (
    ("kernel", "kernel", None),
    ("runs", "launches", None),
    ("time (us)", "duration_us", ".1f"),
    ("cycles", "cycles", ".0f"),
    ("MHz", "clock_mhz", ".0f"),
    ("regs", "registers", ".0f"),
    ("smem (B)", "smem_bytes", ".0f"),
    ("occupancy %", "occupancy_pct", ".1f"),
    ("L2 hit %", "l2_hit_pct", ".1f"),
    ("DRAM %", "dram_pct", ".1f"),
    ("tensor %", "tensor_pct", ".1f"),
    ("FMA %", "fma_pct", ".1f"),
    ("MUFU %", "mufu_pct", ".1f"),
    ("issue %", "issue_pct", ".1f"),
    ("inst (M)", "instructions_m", ".1f"),
    ("smem rd %", "smem_read_pct", ".1f"),
    ("smem wr %", "smem_write_pct", ".1f"),
    ("TFLOP/s", "tflops", ".1f"),
    ("attn TFLOP/s", "attn_tflops", ".1f"),
)


def ragged_length_lines(rows: list[ProfileRow], seqlen_k: int | None = None) -> list[str]:
    """For each kernel at a query length that is not a multiple of common.ALIGNED_LENGTH, profiled
    at the next multiple too (same d_head and mask; keys of the same length as the queries, or
    seqlen_k keys for both): how many more cycles per attention FLOP it takes there."""

    def cycles_per_flop(row: ProfileRow) -> float:
        attention, _ = common.flop_counts(row.d_head, row.batch, row.heads, row.seq_len, row.seqlen_k, row.causal)
        return row.cycles / attention

    profiled = {(row.kernel, row.d_head, row.causal, row.seq_len, row.seqlen_k): row for row in rows}
    lines = []
    for row in rows:
        aligned = common.next_aligned_length(row.seq_len)
        partner = profiled.get((row.kernel, row.d_head, row.causal, aligned, seqlen_k or aligned))
        if aligned == row.seq_len or partner is None or not (row.cycles > 0 and partner.cycles > 0):
            continue
        extra = 100 * (cycles_per_flop(row) / cycles_per_flop(partner) - 1)
        keys = f", {row.seqlen_k} keys" if seqlen_k else ""
        lines.append(
            f"seq {row.seq_len} against {aligned}{keys}, d_head {row.d_head}, {common.mask_name(row.causal)}: "
            f"{extra:+.1f}% cycles per FLOP, {row.kernel}"
        )
    return lines


def stall_reasons(summary: KernelSummary) -> dict[str, float]:
    """The warps stalled per issued instruction on each reason ncu reported for the kernel."""
    return {reason: summary.metrics[metric] for reason, metric in STALL_METRICS.items() if metric in summary.metrics}


def format_stall_table(rows: list[ProfileRow], stalls: list[dict[str, float]]) -> str:
    """One row per kernel: its warps stalled per issued instruction on each reason some kernel of the
    table stalls on (largest first, by the table's sum), and their total."""
    totals = collections.Counter()
    for kernel_stalls in stalls:
        totals.update(kernel_stalls)
    listed = [reason for reason, _ in totals.most_common() if any(s.get(reason, 0) >= STALL_LISTED_FROM for s in stalls)]
    headers = ["kernel", *listed, "total"]
    table = [
        [row.kernel, *(kernel_stalls.get(reason, math.nan) for reason in listed), sum(kernel_stalls.values())]
        for row, kernel_stalls in zip(rows, stalls)
    ]
    return common.format_table(headers, table, float_formats={i: ".2f" for i in range(1, len(headers))})


def format_profile_table(rows: list[ProfileRow]) -> str:
    headers = [header for header, _, _ in TABLE_COLUMNS]
    formats = {i: fmt for i, (_, _, fmt) in enumerate(TABLE_COLUMNS) if fmt}
    table = [[getattr(row, field) for _, field, _ in TABLE_COLUMNS] for row in rows]
    return common.format_table(headers, table, float_formats=formats)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--seq_lens",
        nargs="+",
        type=common.positive_int,
        default=[4096],
        metavar="SEQ",
        help="sequence lengths, any positive values (default: 4096)",
    )
    parser.add_argument(
        "--seqlen_k",
        type=common.positive_int,
        metavar="K",
        help="keys and values per sequence at every SEQ (default: SEQ itself), e.g. --seq_lens 1000 1024 "
        "--seqlen_k 1024 to profile a query tail without a key tail",
    )
    parser.add_argument(
        "--d_heads", nargs="+", type=int, choices=common.D_HEADS, default=[128], help="head dimensions (default: 128)"
    )
    common.add_causal_argument(parser, default="off")
    parser.add_argument("--runs", type=int, default=3, metavar="N", help="profiled runs of each kernel (default: 3)")
    parser.add_argument(
        "--kernels",
        help="configurations to profile: short forms separated by ';', or a set name (prog, progall, tune, all, "
        "'B_r,B_c'); default: the KERNELS environment variable, else every compiled configuration",
    )
    common.add_dtype_argument(parser, default="fp16")
    parser.add_argument(
        "--reference",
        choices=("none", *common.SDPA_REFERENCES, "all"),
        default="flash",
        help="SDPA backend(s) to profile as well (default: flash)",
    )
    common.add_shape_argument(parser, "the benchmark shape of each length and d_head")
    common.add_peers_argument(parser, "profile, each in an ncu run of its own,")
    parser.add_argument("--csv", metavar="PATH", help="also write the averaged table to PATH")
    parser.add_argument("--ncu", default="ncu", help="the Nsight Compute command line (default: ncu on PATH)")
    parser.add_argument(
        "--stall-reasons",
        action="store_true",
        help="also print (and write to --csv) why each kernel's warps did not issue: per reason, the warps "
        "stalled on it per issued instruction",
    )
    parser.add_argument(
        "--all-kernels",
        action="store_true",
        help="also report kernels that are neither ours nor SDPA's (input fills, ...)",
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be positive, got {args.runs}")
    shape_error = common.shape_error(args.shape, args.d_heads)
    if shape_error:
        parser.error(shape_error)
    if True in common.causal_values(args.causal) and args.seqlen_k:
        for seq_len in args.seq_lens:
            error = common.causal_lengths_error(seq_len, args.seqlen_k, args.reference)
            if error:
                parser.error(error)
    return args


def ncu_command(ncu: str, args: argparse.Namespace, problem: common.Problem, peer: str | None = None) -> list[str]:
    """The ncu command line that profiles our configurations and the SDPA references on the problem,
    or with ``peer`` that peer alone."""
    command = [
        ncu,
        "--clock-control", "none",
        "--csv",
        "--page", "raw",
        "--print-units", "base",
        # Demangled names carry the configuration's template arguments; the default may be the
        # bare function name, which all our configurations share.
        "--print-kernel-base", "demangled",
        "--metrics", ",".join(NCU_METRICS + (tuple(STALL_METRICS.values()) if args.stall_reasons else ())),
        sys.executable, str(RUN_KERNELS), str(problem.seqlen_q), str(problem.d_head),
        "--n_runs", str(args.runs),
        "--batch", str(problem.batch),
        "--heads", str(problem.heads_q),
        "--heads_kv", str(problem.heads_kv),
        "--seqlen_k", str(problem.seqlen_k),
        "--dtype", args.dtype,
    ]  # fmt: skip
    if problem.causal:
        command.append("--causal")
    if peer:
        return command + ["--peer", peer]
    command += ["--reference", args.reference]
    if args.kernels:
        command += ["--kernels", args.kernels]
    return command


def shape_problems(args: argparse.Namespace) -> list[common.Problem]:
    """The problems to profile, per length, d_head and mask."""

    def problem(seq_len: int, d_head: int, causal: bool) -> common.Problem:
        made = common.shape_problem(args.shape, seq_len, d_head, causal)
        return dataclasses.replace(made, seqlen_k=args.seqlen_k or seq_len)

    return [
        problem(seq_len, d_head, causal)
        for seq_len, d_head, causal in itertools.product(args.seq_lens, args.d_heads, common.causal_values(args.causal))
    ]


def output_tail(result: subprocess.CompletedProcess, lines: int = 25) -> str:
    text = "\n".join(part for part in (result.stdout, result.stderr) if part)
    return "\n".join(text.splitlines()[-lines:])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ncu = shutil.which(args.ncu)
    if ncu is None:
        print(
            f"error: Nsight Compute's command line {args.ncu!r} was not found: install Nsight Compute, put ncu "
            "on PATH or pass --ncu PATH",
            file=sys.stderr,
        )
        return 1

    all_rows, all_stalls, tables, failures = [], [], [], []
    for problem in common.track(shape_problems(args), description="profiling"):
        where = f"{args.dtype}, {problem.describe()}"
        summaries = []
        for peer in (None, *args.peers):
            result = subprocess.run(ncu_command(ncu, args, problem, peer), capture_output=True, text=True)
            whose = peer.upper() if peer else "ours and SDPA's"
            try:
                found = summarize(parse_ncu_csv(result.stdout), include_other=args.all_kernels, peer=peer)
            except NcuOutputError as error:
                found, trouble = [], str(error)
            else:
                trouble = "" if found else f"ncu reported none of {whose} kernels"
            if result.returncode != 0:
                trouble = f"ncu exited with status {result.returncode}" + (f"; {trouble}" if trouble else "")
            if trouble:
                failures.append(f"{where}, {whose} run: {trouble}\n{output_tail(result)}")
            summaries += found
        rows = [profile_row(summary, args.dtype, problem) for summary in summaries]
        stalls = [stall_reasons(summary) for summary in summaries]
        if rows:
            title = f"{where} (averages over {args.runs} run(s)); attention FLOPs: {common.flop_rule(problem)}"
            tables.append(f"{title}\n{format_profile_table(rows)}")
            if args.stall_reasons:
                tables.append(f"{where}: warps stalled per issued instruction, by reason\n{format_stall_table(rows, stalls)}")
        all_rows += rows
        all_stalls += stalls

    print("\n\n".join(tables))
    ragged = ragged_length_lines(all_rows, args.seqlen_k)
    if ragged:
        print(f"\nLengths that are not multiples of {common.ALIGNED_LENGTH}, against the next multiple:")
        print("\n".join(ragged))
    if args.csv:
        fields = [field.name for field in dataclasses.fields(ProfileRow)]
        if args.stall_reasons:
            stall_fields = [f"stalled_{reason}" for reason in STALL_REASONS]
            records = [
                dataclasses.asdict(row) | {f"stalled_{reason}": value for reason, value in kernel_stalls.items()}
                for row, kernel_stalls in zip(all_rows, all_stalls)
            ]
            common.write_csv(args.csv, records, fields + stall_fields)
        else:
            common.write_csv(args.csv, all_rows, fields)
    for failure in failures:
        print(f"\n{failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
