#!/usr/bin/env python3
"""Compares the compiled forward kernels with PyTorch's SDPA (FLASH, CUDNN and EFFICIENT backends).

For each dtype, d_head and sequence length of the benchmark shapes (batch 16/16/16/16/8/4 for seq
512/1024/2048/4096/8192/16384; 16 heads for d_head 128, 32 for d_head 64), times every selected
compiled configuration whose block sizes divide seq, then SDPA with each backend, on the same
inputs in the same run. Time is the median of triton.testing.do_bench (of CUDA-event timings if
triton is missing); TFLOP/s = 4 * batch * heads * seq^2 * d_head / time.

Prints one table per (dtype, d_head) with the best configuration per seq and its ratio to the
FLASH backend, then the harmonic mean of those ratios. The best configuration's output is checked
against the FLASH backend's once per shape; a mismatch is reported and makes the exit status 1.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import sys

import bench_common as common

# The SDPA backends timed, in table order; the first is the one the ratio and the check use.
REFERENCES = ("flash", "cudnn", "efficient")
RATIO_REFERENCE = "flash"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-heads", nargs="+", type=int, choices=common.D_HEADS, default=[128], help="(default: 128)")
    parser.add_argument(
        "--dtypes", nargs="+", choices=common.DTYPE_NAMES, default=list(common.DTYPE_NAMES), help="(default: both)"
    )
    parser.add_argument(
        "--seq-lens", nargs="+", type=int, choices=common.SEQ_LENS, default=list(common.SEQ_LENS), help="(default: all)"
    )
    parser.add_argument(
        "--kernels",
        help="configurations to time: short forms separated by ';', or a set name (prog, progall, tune, all, "
        "'B_r,B_c'); default: the KERNELS environment variable, else every compiled configuration",
    )
    parser.add_argument(
        "--rep-ms",
        type=float,
        default=common.DEFAULT_REP_MS,
        help="how long each timing repeats the call, in ms (default: %(default)g)",
    )
    parser.add_argument("--csv", metavar="PATH", help="also write every timing (every configuration) to PATH")
    parser.add_argument(
        "--plot",
        metavar="PATH",
        help="also draw TFLOP/s against seq per (dtype, d_head) to the PNG file PATH: our best configuration "
        "and each SDPA backend (needs matplotlib)",
    )
    parser.add_argument(
        "--check-gpu", action="store_true", help="only check that a CUDA GPU is visible (exit status 0 if so)"
    )
    return parser.parse_args(argv)


def implementation_name(reference: str) -> str:
    return f"sdpa_{reference}"


def benchmark_shape(dtype_name, d_head, seq_len, configs, timer, progress) -> tuple[list[common.TimingRow], str | None]:
    """Times our configurations and SDPA at one shape; returns the rows and a correctness failure, if any."""
    import flash_attention

    batch, heads = common.batch_for_seq_len(seq_len), common.heads_for_d_head(d_head)
    q, k, v = common.make_inputs(batch, seq_len, heads, d_head, common.dtype_from_name(dtype_name))
    o = q.new_empty(q.shape)

    def row(implementation: str, config: str, time_ms: float) -> common.TimingRow:
        return common.timing_row(dtype_name, d_head, seq_len, batch, heads, implementation, config, time_ms)

    rows = []
    for cfg in configs:
        rows.append(row("ours", cfg.short_form(), timer(functools.partial(flash_attention.forward, cfg, q, k, v, o))))
        progress.update()

    run_sdpa = common.sdpa_runner(q, k, v)
    reference_output = None
    for reference in REFERENCES:
        try:
            with common.use_sdpa_reference(reference):
                time_ms = timer(run_sdpa)
                if reference == RATIO_REFERENCE:
                    reference_output = run_sdpa()
        except RuntimeError as error:
            label = common.SDPA_REFERENCES[reference]
            progress.write(f"{label} cannot run {dtype_name} d_head {d_head} seq {seq_len}: {error}")
            time_ms = math.nan
        rows.append(row(implementation_name(reference), "", time_ms))
        progress.update()

    failure = None
    best = best_ours(rows)
    if best is not None and reference_output is not None:
        out = flash_attention.forward(best.config, q, k, v)
        failure = common.flash_mismatch(
            out, reference_output, dtype_name, f"{best.config} at batch {batch}, seq {seq_len}, heads {heads}"
        )
    return rows, failure


def best_ours(rows: list[common.TimingRow]) -> common.TimingRow | None:
    """Our fastest configuration among ``rows`` (ignoring ones that could not run)."""
    ours = [r for r in rows if r.implementation == "ours" and math.isfinite(r.tflops)]
    return max(ours, key=lambda r: r.tflops, default=None)


def reference_tflops(rows: list[common.TimingRow], reference: str) -> float:
    return next((r.tflops for r in rows if r.implementation == implementation_name(reference)), math.nan)


def format_group_table(dtype_name: str, d_head: int, rows: list[common.TimingRow]) -> str:
    """The table of one (dtype, d_head): best configuration per seq, each backend, the ratio to
    FLASH, and the harmonic mean of the ratios."""
    headers = [
        "seq",
        "batch",
        "best config",
        "ours",
        *(r.upper() for r in REFERENCES),
        f"ours/{RATIO_REFERENCE.upper()}",
    ]
    table, ratios = [], []
    for seq_len in sorted({r.seq_len for r in rows}):
        at_seq = [r for r in rows if r.seq_len == seq_len]
        best = best_ours(at_seq)
        ours = best.tflops if best else math.nan
        ratio = ours / reference_tflops(at_seq, RATIO_REFERENCE)
        if math.isfinite(ratio):
            ratios.append(ratio)
        table.append(
            [
                seq_len,
                at_seq[0].batch,
                best.config if best else "(no configuration fits)",
                ours,
                *(reference_tflops(at_seq, reference) for reference in REFERENCES),
                ratio,
            ]
        )
    title = f"{dtype_name}, d_head {d_head}, {common.heads_for_d_head(d_head)} heads (TFLOP/s)"
    lines = [title, common.format_table(headers, table, float_formats={len(headers) - 1: ".3f"})]
    if ratios:
        mean = common.harmonic_mean(ratios)
        lines.append(f"harmonic mean of ours/{RATIO_REFERENCE.upper()} over {len(ratios)} sequence lengths: {mean:.3f}")
    return "\n".join(lines)


def plot(path: str, rows: list[common.TimingRow]) -> None:
    """TFLOP/s against seq, one panel per (dtype, d_head): our best configuration and each backend."""
    groups = sorted({(r.dtype, r.d_head) for r in rows})
    with common.png_figure(path, panels=len(groups)) as axes:
        for axis, (dtype_name, d_head) in zip(axes, groups, strict=True):
            group = [r for r in rows if (r.dtype, r.d_head) == (dtype_name, d_head)]
            seq_lens = sorted({r.seq_len for r in group})
            at_seq = {seq_len: [r for r in group if r.seq_len == seq_len] for seq_len in seq_lens}
            best = [best_ours(at_seq[s]) for s in seq_lens]
            lines = [("ours (best config)", [b.tflops if b else math.nan for b in best])]
            lines += [
                (f"SDPA {ref.upper()}", [reference_tflops(at_seq[s], ref) for s in seq_lens]) for ref in REFERENCES
            ]
            for label, values in lines:
                axis.plot(seq_lens, values, marker="o", label=label)
            axis.set_xscale("log", base=2)
            axis.set_xticks(seq_lens, [str(s) for s in seq_lens])
            axis.set_xlabel("sequence length")
            common.finish_tflops_axis(axis, f"{dtype_name}, d_head {d_head}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not common.gpu_available():
        print(common.no_gpu_message("the benchmark"), file=sys.stderr)
        return 1
    if args.check_gpu:
        return 0

    import torch

    try:
        configs = common.select_configs(args.kernels)
    except common.ConfigSelectionError as error:
        print(error, file=sys.stderr)
        return 1
    timer, timing = common.make_timer(args.rep_ms)
    versions = f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}"
    print(f"{torch.cuda.get_device_name()}, {versions}; {timing}")

    all_rows, failures = [], []
    for dtype_name, d_head in itertools.product(args.dtypes, args.d_heads):
        dtype = common.dtype_from_name(dtype_name)
        fitting = {s: [c for c in configs if common.fits(c, dtype, d_head, s)] for s in args.seq_lens}
        total = sum(len(at_seq) + len(REFERENCES) for at_seq in fitting.values())
        group_rows = []
        with common.Progress(total, f"{dtype_name} d_head {d_head}") as progress:
            for seq_len in args.seq_lens:
                rows, failure = benchmark_shape(dtype_name, d_head, seq_len, fitting[seq_len], timer, progress)
                group_rows += rows
                if failure:
                    failures.append(failure)
        print()
        print(format_group_table(dtype_name, d_head, group_rows))
        all_rows += group_rows

    if args.csv:
        common.write_csv(args.csv, all_rows, common.TIMING_FIELDS)
    if args.plot:
        with common.optional_import_note("matplotlib", f"no plot written to {args.plot}"):
            plot(args.plot, all_rows)
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
