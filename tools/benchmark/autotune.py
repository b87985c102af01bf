#!/usr/bin/env python3
"""Autotuning: times every compiled configuration of the tuning set at each benchmark shape and
ranks them.

Configurations: the compiled ones among --kernels, else the KERNELS environment variable, else the
tuning set ('tune'); build them first, e.g. FLASH_BUILD_KERNELS=tune pip install --no-build-isolation -e .
Shapes: each dtype, d_head, mask (without and with the causal mask unless --causal says otherwise)
and seq_len of the benchmark shapes (batch 16/16/16/16/8/4 for seq 512..16384; heads * d_head =
2048: 16 heads for d_head 128, 32 for d_head 64). Every timing goes to the CSV file as it is
measured (default profiles/autotune.csv). With --rounds R the whole sweep runs R times, round robin,
and a configuration's time at a shape is the median of its R timings: the GPU's clock drifts with
its power and temperature, and neighbouring configurations of one round can differ by less than
that drift. Each round times a shape's configurations in a new seeded random order
(bench_common.timing_order): one timed right after a slower one starts at a higher clock. The
summary then ranks, per (dtype, d_head, mask, seq_len), the winner, its TFLOP/s, the runner-up and
the winner's margin over it, and the top N; and per (dtype, d_head, mask), the configurations with
the best harmonic mean of TFLOP/s over the sequence lengths: the first is the candidate default for
that dtype, d_head and mask. Causal TFLOP/s count half of the unmasked
problem's FLOPs, as FlashAttention does. With --sustain-s S each timing is instead the mean of
back-to-back calls over S seconds after a warm-up as long (as pt_bench.py's): the configurations
ranked at the clock their own power draw leaves, as a training or serving loop runs them, rather
than in short bursts.

--summary-only CSV ranks an existing CSV file (of this tool or of pt_bench.py --csv) without a GPU;
files without a causal column are of unmasked attention. Repeated timings of a configuration at a
shape (rounds, or runs appended to one file) count by their median.

--dispatch-table PATH also writes the rankings as the dispatch table that automatic configuration
reads (flash_helpers.dispatch_table): every configuration's place and time at every shape. The package's
tables are py/flash_attention/dispatch_tables/<arch>.json, e.g. for the H200:

    python tools/benchmark/autotune.py --kernels default --dispatch-table py/flash_attention/dispatch_tables/sm_90.json

With --merge the table already at PATH keeps its rankings at the shapes this run does not measure
(e.g. a run with --d-heads 128 replaces the d_head 128 entries alone); its command then records both
runs.

--dtypes e4m3 times E4M3 configurations (the tuning set has none: select them with --kernels, e.g.
default) on FP8 inputs with descales of 1, as pt_bench.py does. Their rankings become E4M3 entries
of --dispatch-table, which automatic configuration reads as it reads the 16-bit ones (the H200's
table has them for d_head 128; at other head sizes the rule takes the set's E4M3 configuration).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import itertools
import math
import os
import shlex
import sys

import bench_common as common
from flash_helpers.dispatch_table import DispatchTable, TableEntry, arch_name

DEFAULT_CSV = common.REPO_ROOT / "profiles" / "autotune.csv"
DEFAULT_TOP = 5


# ----------------------------------------------------------------------------------------------
# Ranking (no GPU needed)


@dataclasses.dataclass
class ShapeRanking:
    """The configurations at one (dtype, d_head, mask, seq_len), fastest first."""

    dtype: str
    d_head: int
    causal: bool
    seq_len: int
    ranked: list[common.TimingRow]

    @property
    def winner(self) -> common.TimingRow:
        return self.ranked[0]

    @property
    def runner_up(self) -> common.TimingRow | None:
        return self.ranked[1] if len(self.ranked) > 1 else None

    @property
    def margin_pct(self) -> float:
        """How much faster the winner is than the runner-up, in percent (NaN without a runner-up)."""
        if self.runner_up is None:
            return math.nan
        return (self.winner.tflops / self.runner_up.tflops - 1) * 100


@dataclasses.dataclass
class GroupCandidate:
    """One configuration's harmonic mean of TFLOP/s over the sequence lengths of a (dtype, d_head, mask)."""

    config: str
    harmonic_mean_tflops: float


@dataclasses.dataclass
class GroupRanking:
    """The configurations of one (dtype, d_head, mask) by harmonic-mean TFLOP/s over its sequence
    lengths, counting only configurations measured at every one of them."""

    dtype: str
    d_head: int
    causal: bool
    seq_lens: list[int]
    ranked: list[GroupCandidate]

    @property
    def candidate(self) -> GroupCandidate | None:
        return self.ranked[0] if self.ranked else None


def _group_order(dtype: str, d_head: int, causal: bool) -> tuple[int, int, bool]:
    """Groups in the order people read them: the dtypes' usual order (fp16 first, e4m3 last), then by
    d_head, unmasked before causal."""
    known = common.DTYPE_NAMES + common.FP8_DTYPE_NAMES
    return (known.index(dtype) if dtype in known else len(known), d_head, causal)


def usable(rows: list[common.TimingRow]) -> list[common.TimingRow]:
    """Our configurations' timings that ran, one per configuration and shape (the median of its
    repeats); SDPA rows of a pt_bench file and NaN times are dropped."""
    return [
        row
        for row in common.median_timings(rows)
        if row.implementation == "ours" and math.isfinite(row.tflops) and row.tflops > 0
    ]


def rank_shapes(rows: list[common.TimingRow]) -> list[ShapeRanking]:
    rows = usable(rows)
    rankings = []
    shapes = sorted(
        {(row.dtype, row.d_head, row.causal, row.seq_len) for row in rows},
        key=lambda shape: (_group_order(*shape[:3]), shape[3]),
    )
    for shape in shapes:
        at_shape = [row for row in rows if (row.dtype, row.d_head, row.causal, row.seq_len) == shape]
        # One problem, so the shortest time is the highest TFLOP/s; ties keep the configurations'
        # order, so rankings are reproducible.
        ranked = sorted(at_shape, key=lambda row: (row.time_ms, row.config))
        rankings.append(ShapeRanking(*shape, ranked))
    return rankings


def rank_groups(rows: list[common.TimingRow]) -> list[GroupRanking]:
    rows = usable(rows)
    rankings = []
    for key in sorted({(row.dtype, row.d_head, row.causal) for row in rows}, key=lambda key: _group_order(*key)):
        group = [row for row in rows if (row.dtype, row.d_head, row.causal) == key]
        seq_lens = sorted({row.seq_len for row in group})
        tflops_by_config: dict[str, dict[int, float]] = {}
        for row in group:
            tflops_by_config.setdefault(row.config, {})[row.seq_len] = row.tflops
        # A configuration missing a sequence length (it failed, or lacks the kernel variant for it)
        # cannot be the default for all of them.
        candidates = [
            GroupCandidate(config, common.harmonic_mean(by_seq.values()))
            for config, by_seq in tflops_by_config.items()
            if set(by_seq) == set(seq_lens)
        ]
        candidates.sort(key=lambda c: (-c.harmonic_mean_tflops, c.config))
        rankings.append(GroupRanking(*key, seq_lens, candidates))
    return rankings


def format_summary(rows: list[common.TimingRow], top: int = DEFAULT_TOP) -> str:
    shape_rankings, group_rankings = rank_shapes(rows), rank_groups(rows)
    if not shape_rankings:
        return "no timings of our configurations to rank"
    sections = []

    headers = ["dtype", "d_head", "mask", "seq", "winner", "TFLOP/s", "runner-up", "TFLOP/s", "margin %"]
    table = [
        [
            r.dtype,
            r.d_head,
            common.mask_name(r.causal),
            r.seq_len,
            r.winner.config,
            r.winner.tflops,
            r.runner_up.config if r.runner_up else None,
            r.runner_up.tflops if r.runner_up else None,
            r.margin_pct,
        ]
        for r in shape_rankings
    ]
    sections.append("Winner per shape\n" + common.format_table(headers, table, float_formats={8: ".2f"}))

    for r in shape_rankings:
        table = [[place, row.config, row.tflops, row.time_ms] for place, row in enumerate(r.ranked[:top], start=1)]
        where = f"{r.dtype}, d_head {r.d_head}, {common.mask_name(r.causal)}, seq {r.seq_len}"
        title = f"Top {min(top, len(r.ranked))} of {len(r.ranked)}: {where}"
        sections.append(
            title + "\n" + common.format_table(["#", "config", "TFLOP/s", "time (ms)"], table, float_formats={3: ".4f"})
        )

    for g in group_rankings:
        seq_lens = ", ".join(map(str, g.seq_lens))
        where = f"{g.dtype}, d_head {g.d_head}, {common.mask_name(g.causal)}"
        title = f"Candidate default for {where}: best harmonic mean of TFLOP/s over seq {seq_lens}"
        if not g.ranked:
            sections.append(f"{title}\n(no configuration was measured at every sequence length)")
            continue
        table = [[place, c.config, c.harmonic_mean_tflops] for place, c in enumerate(g.ranked[:top], start=1)]
        sections.append(f"{title}\n" + common.format_table(["#", "config", "harmonic mean TFLOP/s"], table))
        sections.append(f"candidate default: {g.candidate.config}")

    # One line per group, so the defaults with and without the mask read side by side.
    table = [
        [g.dtype, g.d_head, common.mask_name(g.causal), g.candidate.config, g.candidate.harmonic_mean_tflops]
        for g in group_rankings
        if g.candidate
    ]
    headers = ["dtype", "d_head", "mask", "candidate default", "harmonic mean TFLOP/s"]
    sections.append("Candidate defaults\n" + common.format_table(headers, table))
    return "\n\n".join(sections)


def make_dispatch_table(rows: list[common.TimingRow], arch: str, gpu: str, command: str) -> DispatchTable:
    """The rankings of every shape as a dispatch table (configurations fastest first, with their times)."""
    entries = [
        TableEntry(
            r.dtype.upper(),
            r.d_head,
            r.causal,
            r.seq_len,
            tuple(row.config for row in r.ranked),
            tuple(row.time_ms for row in r.ranked),
        )
        for r in rank_shapes(rows)
    ]
    return DispatchTable.from_rankings(arch, gpu, datetime.date.today().isoformat(), command, entries)


# ----------------------------------------------------------------------------------------------
# Timing (needs the GPU)


def sweep(args: argparse.Namespace, configs, csv_writer: common.TimingCsvWriter) -> list[common.TimingRow]:
    """Times every configuration that fits each shape, round robin over the shapes once per round;
    rows are written to the CSV as measured."""
    import flash_attention

    timer, timing = common.make_timer(args.rep_ms, args.sustain_s)
    rounds = f"; {args.rounds} rounds, the median of each" if args.rounds > 1 else ""
    print(f"{len(configs)} configurations; {timing}{rounds}")
    variants = common.compiled_variants()
    shapes = []
    masks = common.causal_values(args.causal)
    for dtype_name, d_head, causal, seq_len in itertools.product(args.dtypes, args.d_heads, masks, args.seq_lens):
        dtype = common.dtype_from_name(dtype_name)
        problem = common.benchmark_problem(seq_len, d_head, causal)
        fitting = [cfg for cfg in configs if common.fits(cfg, dtype, problem, variants)]
        if fitting:
            shapes.append((dtype_name, dtype, problem, fitting))
    for dtype_name in sorted(set(args.dtypes) - {shape[0] for shape in shapes}):
        print(f"note: no selected configuration runs {dtype_name} at these head sizes and lengths", file=sys.stderr)

    rows = []
    with common.Progress(args.rounds * sum(len(shape[-1]) for shape in shapes), "autotuning") as progress:
        for round_index, (dtype_name, dtype, problem, fitting) in itertools.product(range(args.rounds), shapes):
            where = f", round {round_index + 1} of {args.rounds}" if args.rounds > 1 else ""
            progress.set_description(f"{dtype_name} {problem.describe()}{where}")
            q, k, v = common.make_inputs(problem, dtype)
            descales = common.make_descales(problem, dtype)
            o = common.make_output(q)
            for cfg in common.timing_order(fitting, round_index, (dtype_name, problem)):
                call = functools.partial(flash_attention.forward, cfg, q, k, v, o, causal=problem.causal, **descales)
                time_ms = timer(call)
                row = common.timing_row(dtype_name, problem, "ours", cfg.short_form(), time_ms)
                csv_writer.write(row)
                rows.append(row)
                progress.update()
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_dtype_argument(parser, default=list(common.DTYPE_NAMES))
    parser.add_argument(
        "--d-heads", nargs="+", type=int, choices=common.D_HEADS, default=list(common.D_HEADS), help="(default: all)"
    )
    parser.add_argument(
        "--seq-lens",
        nargs="+",
        type=common.positive_int,
        default=list(common.SEQ_LENS),
        metavar="SEQ",
        help="(default: 512 ... 16384)",
    )
    common.add_causal_argument(parser, default="both")
    parser.add_argument(
        "--kernels",
        help="configurations to time: short forms separated by ';', or a set name (prog, progall, tune, all, "
        "'B_r,B_c'); default: the KERNELS environment variable, else 'tune'",
    )
    parser.add_argument(
        "--rep-ms",
        type=float,
        default=common.DEFAULT_REP_MS,
        help="how long each timing repeats the call, in ms (default: %(default)g)",
    )
    common.add_sustain_argument(parser)
    parser.add_argument(
        "--rounds",
        type=common.positive_int,
        default=1,
        metavar="R",
        help="sweeps, round robin; each configuration's time at a shape is its median (default: 1)",
    )
    parser.add_argument(
        "--csv", metavar="PATH", default=str(DEFAULT_CSV), help="where every timing is written (default: %(default)s)"
    )
    parser.add_argument(
        "--top", type=int, default=DEFAULT_TOP, metavar="N", help="places shown per ranking (default: 5)"
    )
    parser.add_argument("--summary", metavar="PATH", help="also write the ranked summary to PATH")
    parser.add_argument(
        "--summary-only",
        metavar="CSV",
        help="rank the timings in an existing CSV file instead of measuring (no GPU needed)",
    )
    parser.add_argument(
        "--dispatch-table",
        metavar="PATH",
        help="also write the rankings as a dispatch table (JSON) for automatic configuration",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="with --dispatch-table: keep the rankings of the table already at PATH at the shapes this run does "
        "not rank (replacing those it does), so that a few head sizes can be re-measured alone",
    )
    parser.add_argument(
        "--arch", help="the table's architecture, e.g. sm_90 (default: the GPU's; needed with --summary-only)"
    )
    parser.add_argument("--gpu", help="the table's GPU name (default: the GPU's; needed with --summary-only)")
    args = parser.parse_args(argv)
    if sustain_error := common.sustain_error(args.sustain_s):
        parser.error(sustain_error)
    if args.merge and not args.dispatch_table:
        parser.error("--merge needs --dispatch-table: the table to merge this run's rankings into")
    if args.dispatch_table and args.summary_only and not (args.arch and args.gpu):
        parser.error("--dispatch-table with --summary-only needs --arch and --gpu: the CSV does not say where it ran")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summary_only:
        try:
            rows = common.read_timing_csv(args.summary_only)
        except (OSError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    else:
        if not common.gpu_available():
            print(common.no_gpu_message("autotuning"), file=sys.stderr)
            return 1
        try:
            configs = common.select_configs(args.kernels, default_key="tune")
        except common.ConfigSelectionError as error:
            print(error, file=sys.stderr)
            return 1
        with common.TimingCsvWriter(args.csv) as csv_writer:
            rows = sweep(args, configs, csv_writer)
        print(f"timings written to {args.csv}")

    summary = format_summary(rows, args.top)
    print()
    print(summary)
    if args.summary:
        with open(args.summary, "w") as file:
            file.write(summary + "\n")
    if args.dispatch_table:
        try:
            write_dispatch_table(args, rows, argv)
        except ValueError as error:  # a table of another GPU at PATH, or not a table of this format
            print(f"error: {args.dispatch_table}: {error}", file=sys.stderr)
            return 1
    return 0


def write_dispatch_table(args: argparse.Namespace, rows: list[common.TimingRow], argv: list[str] | None) -> None:
    arch, gpu = args.arch, args.gpu
    if arch is None or gpu is None:
        import torch

        arch = arch or arch_name(torch.cuda.get_device_capability())
        gpu = gpu or torch.cuda.get_device_name()
    command = shlex.join(["python", "tools/benchmark/autotune.py", *(sys.argv[1:] if argv is None else argv)])
    table = make_dispatch_table(rows, arch, gpu, command)
    if args.merge and os.path.exists(args.dispatch_table):
        table = table.merged_into(DispatchTable.load(args.dispatch_table))
    table.save(args.dispatch_table)
    print(f"dispatch table for {arch} ({gpu}) written to {args.dispatch_table}")


if __name__ == "__main__":
    sys.exit(main())
