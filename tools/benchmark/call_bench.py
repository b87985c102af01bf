#!/usr/bin/env python3
"""Where a small call's time goes: the host cost per call of our entry points against PyTorch's SDPA.

On a problem small enough that its kernel takes a few microseconds (default: batch 1, 128 tokens,
8 heads of 64, bfloat16; --shape B,S,H,D), it times each entry point in three ways, in one run:

  do_bench     the median of triton.testing.do_bench (an L2 flush, then the call between two CUDA
               events): what a benchmark of the call reports;
  host         the host time of one call, enqueued back to back (time.perf_counter over --calls calls,
               one synchronization at the end): what a model's Python thread pays per call;
  graph        the GPU time of one call, replayed from a CUDA graph of --calls calls: the kernel(s)
               alone, with no host in the way.

The entry points: flash_attn_func and our scaled_dot_product_attention (the configuration chosen
per call), forward with an explicit configuration (the automatic choice's, given by hand), the
torch operator torch.ops.flash_attention.forward, and PyTorch's own scaled_dot_product_attention
(its default backend choice). With --profile, each of ours is also run under cProfile and the
functions taking the most time per call are listed, so each step of the call (argument checks,
configuration choice, the binding) shows its share.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

import bench_common as common

DEFAULT_SHAPE = (1, 128, 8, 64)


def parse_shape(text: str) -> tuple[int, int, int, int]:
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"expected batch,seq,heads,d_head (positive ints), got {text!r}")
    return shape


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--shape",
        type=parse_shape,
        default=DEFAULT_SHAPE,
        metavar="B,S,H,D",
        help="batch, seq, heads, d_head (default: %s)" % ",".join(map(str, DEFAULT_SHAPE)),
    )
    common.add_dtype_argument(
        parser,
        default="bf16",
        fp8_refusal="the SDPA-shaped entry point and PyTorch's SDPA, which it times beside flash_attn_func, take no "
        "e4m3 inputs",
    )
    parser.add_argument("--causal", action="store_true", help="with the causal mask")
    parser.add_argument(
        "--calls", type=common.positive_int, default=2000, help="calls per host or graph timing (default: %(default)s)"
    )
    parser.add_argument("--rounds", type=common.positive_int, default=3, help="timings per method; the median is kept")
    parser.add_argument("--profile", action="store_true", help="also list where each call's host time goes (cProfile)")
    return parser.parse_args(argv)


def host_us(torch, fn, calls: int) -> float:
    """Host microseconds per call, enqueued back to back."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def graph_us(torch, fn, calls: int) -> float | None:
    """GPU microseconds per call replayed from a CUDA graph, or None where the call cannot be captured."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except RuntimeError:
        return None
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def entry_points(torch, fa, q, k, v, causal: bool) -> dict:
    """name -> a call with no argument, each computing the same attention."""
    sdpa_args = [t.transpose(1, 2) for t in (q, k, v)]
    chosen = fa.choose_config(q, k, causal=causal).config
    return {
        "flash_attn_func": lambda: fa.flash_attn_func(q, k, v, causal=causal),
        "ours scaled_dot_product_attention": lambda: fa.scaled_dot_product_attention(*sdpa_args, is_causal=causal),
        "forward (explicit configuration)": lambda: fa.forward(chosen, q, k, v, causal=causal),
        "torch.ops.flash_attention.forward": lambda: torch.ops.flash_attention.forward(
            q, k, v, "", causal, None, [-1, -1], 0.0, None, False
        ),
        "PyTorch scaled_dot_product_attention": lambda: torch.nn.functional.scaled_dot_product_attention(
            *sdpa_args, is_causal=causal
        ),
    }


def profile_report(fn, calls: int, top: int = 12) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:top]  # by own time
    lines = [f"    {'own µs/call':>11} {'total µs/call':>13}  function"]
    for (path, line, name), (_, _, own, total, _) in rows:
        where = f"{path.rsplit('/', 2)[-2:] if '/' in path else path}"
        lines.append(f"    {own / calls * 1e6:11.2f} {total / calls * 1e6:13.2f}  {name} ({where}:{line})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not common.gpu_available():
        print(common.no_gpu_message("call_bench"), file=sys.stderr)
        return 1
    import statistics

    import torch

    import flash_attention as fa

    batch, seq, heads, d_head = args.shape
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    q, k, v = (torch.randn(batch, seq, heads, d_head, device="cuda", dtype=dtype) for _ in range(3))
    timer, timing = common.make_timer(rep_ms=200)
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; problem batch {batch}, seq {seq}, heads {heads}, "
        f"d_head {d_head}, {args.dtype}{', causal' if args.causal else ''}; configuration "
        f"{fa.choose_config(q, k, causal=args.causal).config.short_form()}"
    )
    print(f"do_bench: {timing}; host: {args.calls} calls enqueued back to back; graph: {args.calls} calls replayed")
    print()
    calls = entry_points(torch, fa, q, k, v, args.causal)
    with torch.inference_mode():
        for fn in calls.values():
            fn()
        rows = []
        for name, fn in calls.items():
            bench = statistics.median(timer(fn) * 1e3 for _ in range(args.rounds))
            host = statistics.median(host_us(torch, fn, args.calls) for _ in range(args.rounds))
            graph = graph_us(torch, fn, args.calls)
            rows.append((name, bench, host, graph))
    _, sdpa_bench, sdpa_host, _ = rows[-1]
    print("| call | do_bench µs | × SDPA | host µs per call | × SDPA | GPU µs per call (graph) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, bench, host, graph in rows:
        graph_text = "-" if graph is None else f"{graph:.1f}"
        print(f"| {name} | {bench:.1f} | {bench / sdpa_bench:.2f} | {host:.1f} | {host / sdpa_host:.2f} | {graph_text} |")
    if args.profile:
        with torch.inference_mode():
            for name, fn in list(calls.items())[:-1]:
                print(f"\n{name}: where the host time goes (cProfile, {args.calls} calls; its overhead inflates it)")
                print(profile_report(fn, args.calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
