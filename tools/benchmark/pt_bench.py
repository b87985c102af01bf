#!/usr/bin/env python3
"""Compares the compiled forward kernels with PyTorch's SDPA (FLASH and CUDNN backends).

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
import csv
import dataclasses
import math
import os
import statistics
import sys
from collections.abc import Callable

NO_GPU_MESSAGE = "no CUDA GPU visible: the benchmark needs one"

# Batch per sequence length: the seeds' benchmark shapes.
BATCH_BY_SEQ_LEN = {512: 16, 1024: 16, 2048: 16, 4096: 16, 8192: 8, 16384: 4}
# Heads per d_head, so that heads * d_head = 2048 (the model width) for every shape.
HEADS_BY_D_HEAD = {64: 32, 128: 16}
DTYPE_NAMES = ("fp16", "bf16")
# Largest |ours - SDPA FLASH| accepted: a loose sanity bound for outputs of magnitude up to ~1, where
# one unit in the last place is about 1e-3 in fp16 and 8e-3 in bf16 (the tests check precisely).
MAX_ABS_DIFFERENCE = {"fp16": 1e-2, "bf16": 4e-2}


@dataclasses.dataclass
class Row:
    """One timed implementation at one shape (a row of the CSV)."""

    dtype: str
    d_head: int
    seq_len: int
    batch: int
    heads: int
    implementation: str  # "ours", "sdpa_flash" or "sdpa_cudnn"
    config: str  # our configuration's short form; empty for SDPA
    time_ms: float  # NaN where the implementation could not run
    tflops: float


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--d-heads", nargs="+", type=int, choices=sorted(HEADS_BY_D_HEAD), default=[128], help="(default: 128)"
    )
    parser.add_argument("--dtypes", nargs="+", choices=DTYPE_NAMES, default=list(DTYPE_NAMES), help="(default: both)")
    parser.add_argument(
        "--seq-lens",
        nargs="+",
        type=int,
        choices=list(BATCH_BY_SEQ_LEN),
        default=list(BATCH_BY_SEQ_LEN),
        help="(default: all)",
    )
    parser.add_argument(
        "--kernels",
        help="configurations to time: short forms separated by ';', or a set name (prog, progall, tune, all, "
        "'B_r,B_c'); default: the KERNELS environment variable, else every compiled configuration",
    )
    parser.add_argument("--csv", metavar="PATH", help="also write every timing (every configuration) to PATH")
    parser.add_argument(
        "--check-gpu", action="store_true", help="only check that a CUDA GPU is visible (exit status 0 if so)"
    )
    return parser.parse_args(argv)


def attention_flop(batch: int, heads: int, seq_len: int, d_head: int) -> int:
    """The two matmuls' FLOPs (as FlashForwardKernelConfig.attn_flop counts them)."""
    return 4 * batch * heads * seq_len**2 * d_head


def median_ms_with_cuda_events(fn: Callable[[], object], warmup: int = 10, repeats: int = 100) -> float:
    import torch

    for _ in range(warmup):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def make_timer() -> tuple[Callable[[Callable[[], object]], float], str]:
    """The timing function (fn -> median milliseconds) and its description."""
    try:
        from triton.testing import do_bench
    except ImportError:
        return median_ms_with_cuda_events, "median of CUDA-event timings (triton is not installed)"
    return lambda fn: do_bench(fn, return_mode="median"), "median of triton.testing.do_bench"


def select_configs(key: str | None):
    """The compiled configurations that ``key`` (or KERNELS) selects; all compiled ones by default."""
    import flash_attention
    from flash_helpers.kernel_configs import KERNELS_ENV, get_kernel_configs

    compiled = flash_attention.compiled_configs()
    if key is None and not os.environ.get(KERNELS_ENV):
        return compiled
    selected = set(get_kernel_configs(key))
    missing = selected - set(compiled)
    if missing:
        print(
            f"warning: {len(missing)} selected configurations are not compiled into this build (kernel set "
            f"{flash_attention.compiled_kernel_set()!r}) and are skipped; build them with FLASH_BUILD_KERNELS",
            file=sys.stderr,
        )
    return [cfg for cfg in compiled if cfg in selected]


def sdpa_runner(q, k, v) -> Callable[[], object]:
    """SDPA on the same tensors: it takes (batch, heads, seq, d_head), so it gets transposed views."""
    import torch.nn.functional as F

    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    return lambda: F.scaled_dot_product_attention(q, k, v).transpose(1, 2)


def benchmark_shape(dtype_name, d_head, seq_len, configs, timer) -> tuple[list[Row], str | None]:
    """Times our configurations and SDPA at one shape; returns the rows and a correctness failure, if any."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import flash_attention

    batch, heads = BATCH_BY_SEQ_LEN[seq_len], HEADS_BY_D_HEAD[d_head]
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    shape = (batch, seq_len, heads, d_head)
    q, k, v = (torch.randn(shape, dtype=dtype, device="cuda") for _ in range(3))
    o = torch.empty_like(q)
    flop = attention_flop(batch, heads, seq_len, d_head)

    def row(implementation: str, config: str, time_ms: float) -> Row:
        return Row(dtype_name, d_head, seq_len, batch, heads, implementation, config, time_ms, flop / time_ms / 1e9)

    rows = [
        row("ours", cfg.short_form(), timer(lambda cfg=cfg: flash_attention.forward(cfg, q, k, v, o)))
        for cfg in configs
    ]
    run_sdpa = sdpa_runner(q, k, v)
    flash_output = None
    backends = (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION))
    for implementation, backend in backends:
        try:
            with sdpa_kernel(backend):
                time_ms = timer(run_sdpa)
                if backend == SDPBackend.FLASH_ATTENTION:
                    flash_output = run_sdpa()
        except RuntimeError as error:
            print(f"{implementation} cannot run {dtype_name} d_head {d_head} seq {seq_len}: {error}", file=sys.stderr)
            time_ms = math.nan
        rows.append(row(implementation, "", time_ms))

    failure = None
    ours = [r for r in rows if r.implementation == "ours"]
    if ours and flash_output is not None:
        best = min(ours, key=lambda r: r.time_ms)
        out = flash_attention.forward(best.config, q, k, v)
        difference = (out.float() - flash_output.float()).abs().max().item()
        if not difference <= MAX_ABS_DIFFERENCE[dtype_name]:  # also catches NaN
            failure = (
                f"CORRECTNESS FAILURE: {best.config} at batch {batch}, seq {seq_len}, heads {heads}: max |ours - "
                f"SDPA FLASH| = {difference:.3g} > {MAX_ABS_DIFFERENCE[dtype_name]}"
            )
    return rows, failure


def print_table(dtype_name: str, d_head: int, rows: list[Row]) -> None:
    print(f"\n{dtype_name}, d_head {d_head}, {HEADS_BY_D_HEAD[d_head]} heads (TFLOP/s)")
    header = f"{'seq':>6} {'batch':>5}  {'best config':<52} {'ours':>7} {'FLASH':>7} {'CUDNN':>7} {'ours/FLASH':>10}"
    print(header)
    print("-" * len(header))
    ratios = []
    for seq_len in sorted({r.seq_len for r in rows}):
        at_seq = [r for r in rows if r.seq_len == seq_len]
        tflops = {r.implementation: r.tflops for r in at_seq if r.implementation != "ours"}
        ours = [r for r in at_seq if r.implementation == "ours"]
        best = max(ours, key=lambda r: r.tflops, default=None)
        ratio = best.tflops / tflops["sdpa_flash"] if best else math.nan
        if math.isfinite(ratio):
            ratios.append(ratio)
        print(
            f"{seq_len:>6} {at_seq[0].batch:>5}  {best.config if best else '(no configuration fits)':<52} "
            f"{best.tflops if best else math.nan:>7.1f} {tflops['sdpa_flash']:>7.1f} {tflops['sdpa_cudnn']:>7.1f} "
            f"{ratio:>10.3f}"
        )
    if ratios:
        mean = statistics.harmonic_mean(ratios)
        print(f"harmonic mean of ours/FLASH over {len(ratios)} sequence lengths: {mean:.3f}")


def write_csv(path: str, rows: list[Row]) -> None:
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=[field.name for field in dataclasses.fields(Row)])
        writer.writeheader()
        writer.writerows(dataclasses.asdict(r) for r in rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(NO_GPU_MESSAGE, file=sys.stderr)
        return 1
    if args.check_gpu:
        return 0

    configs = select_configs(args.kernels)
    timer, timing = make_timer()
    versions = f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}"
    print(f"{torch.cuda.get_device_name()}, {versions}; {timing}")

    all_rows, failures = [], []
    for dtype_name in args.dtypes:
        for d_head in args.d_heads:
            table_rows = []
            for seq_len in args.seq_lens:
                fitting = [
                    cfg
                    for cfg in configs
                    if cfg.dtype.name.lower() == dtype_name
                    and cfg.d_head == d_head
                    and seq_len % cfg.B_r == 0
                    and seq_len % cfg.B_c == 0
                ]
                rows, failure = benchmark_shape(dtype_name, d_head, seq_len, fitting, timer)
                table_rows += rows
                if failure:
                    print(failure, file=sys.stderr)
                    failures.append(failure)
            print_table(dtype_name, d_head, table_rows)
            all_rows += table_rows

    if args.csv:
        write_csv(args.csv, all_rows)
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
