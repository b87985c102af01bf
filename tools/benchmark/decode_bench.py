#!/usr/bin/env python3
"""Times decoding: few queries against a long KV cache, ours against FlashAttention-3 and PyTorch SDPA.

For each batch x keys shape (default: the issue's 1x8192, 1x131072, 8x8192, 8x32768, 32x4096 and
128x2048), --seqlen-q queries per sequence (default 1), 32 query heads over 8 key/value heads of
128 (--heads, --d-head), every sequence's cache full (cache_seqlens = keys, a tensor, as a decode
step passes it), times in one run, in a seeded random order per shape:

  ours       flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=..., causal=True),
             num_splits=0 (the heuristic)
  ours/N     the same with num_splits=N for each N of --splits (the heuristic against fixed choices)
  ours[CFG]  flash_attention.forward(CFG, q, k_cache, v_cache, seqused_k=..., causal=True) for each
             configuration of --configs (short forms): the automatic choice against named kernels,
             of either family (a prefill against a paged cache, for example: --seqlen-q 1024)
  FA3        FlashAttention-3's flash_attn_with_kvcache (the fa3-fwd package, module
             fa3_fwd_interface, bfloat16 only), num_splits=0
  SDPA       torch.nn.functional.scaled_dot_product_attention with enable_gqa (its default backend
             choice), on (batch, heads, seq, d) views of the same tensors; one query needs no mask,
             several get the bottom-right causal mask as a boolean attn_mask

With --page-size N the cache is paged: pages of N rows in one pool, in random order (--page-order
sequential: each sequence's pages one after another, as in the dense cache), ours reading it
through block_table and FA3 through page_table (SDPA, which has no paged form, reads the same keys
laid out densely).

With --graphs each call is captured once in a CUDA graph and its replays are timed: the GPU's time
alone, as a serving loop that replays a captured decode step sees it (the eager timings of small
shapes include the host's time per call). With --host-calls N each call's host time is also
measured: N eager calls enqueued back to back (one synchronization at the end), microseconds per
call, what a model's Python thread pays per decode step and layer; a second table lists it.

GB/s = bytes of K and V read (batch x keys x heads_kv x d_head x 2 bytes x 2) / time; the H200's
copy ceiling is about 4.3 TB/s. Time is the median of triton.testing.do_bench. Outputs are compared
with SDPA's once per shape; a mismatch is reported and makes the exit status 1. FA3's wheel is
installed apart:

    python3 -m pip install --no-deps --target /tmp/fa3 fa3_fwd-0.0.3-cp39-abi3-manylinux_2_24_x86_64.whl
    PYTHONPATH=/tmp/fa3 python3 tools/benchmark/decode_bench.py --csv decode.csv
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import sys

import bench_common as common
from call_bench import host_us
from model_bench import markdown_table

from flash_helpers.kernel_names import parse_kernel_name_into_config

SHAPES = ((1, 8192), (1, 131072), (8, 8192), (8, 32768), (32, 4096), (128, 2048))
OURS, FA3, SDPA = "ours", "FA3", "SDPA"


@dataclasses.dataclass(frozen=True)
class DecodeTiming:
    dtype: str
    batch: int
    keys: int
    seqlen_q: int
    implementation: str
    time_ms: float
    gbps: float
    host_us: float = math.nan  # host microseconds per eager call (--host-calls), NaN if not measured


def parse_shape(text: str) -> tuple[int, int]:
    try:
        batch, keys = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is BATCHxKEYS, e.g. 8x32768; got {text!r}") from None
    if batch < 1 or keys < 1:
        raise argparse.ArgumentTypeError(f"batch and keys must be positive; got {text!r}")
    return batch, keys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", type=parse_shape, default=list(SHAPES), metavar="BxK")
    parser.add_argument("--seqlen-q", nargs="+", type=common.positive_int, default=[1], help="(default: 1)")
    common.add_dtype_argument(
        parser,
        default=["bf16"],
        fp8_refusal="FP8 inputs run dense calls only: flash_attn_with_kvcache raises NotImplementedError for them",
    )
    parser.add_argument("--heads", type=common.positive_int, nargs=2, default=[32, 8], metavar=("Q", "KV"))
    parser.add_argument("--d-head", type=common.served_d_head, default=128)
    parser.add_argument("--splits", type=common.positive_int, nargs="*", default=[], help="fixed num_splits to time too")
    parser.add_argument(
        "--configs",
        nargs="*",
        type=parse_kernel_name_into_config,
        default=[],
        metavar="CFG",
        help="configurations to time by name too (short forms, each one argument)",
    )
    parser.add_argument("--graphs", action="store_true", help="time CUDA-graph replays of each call")
    parser.add_argument("--page-size", type=common.positive_int, help="page the cache in pages of this many rows")
    parser.add_argument(
        "--page-order", choices=("random", "sequential"), default="random", help="where the pages lie (default: random)"
    )
    parser.add_argument(
        "--host-calls", type=common.positive_int, help="also time each call's host cost over this many eager calls"
    )
    parser.add_argument("--rep-ms", type=float, default=common.DEFAULT_REP_MS)
    parser.add_argument("--csv", metavar="PATH", help="also write every timing to PATH")
    return parser.parse_args(argv)


def graphed(fn):
    """fn captured once in a CUDA graph (after a warm-up on a side stream): its replay."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def time_shape(args, dtype_name: str, batch: int, keys: int, seqlen_q: int, fa3, timer) -> tuple[list, str | None]:
    import flash_attention
    import torch
    import torch.nn.functional as F

    dtype = common.dtype_from_name(dtype_name).to_torch_dtype()
    heads_q, heads_kv = args.heads
    generator = torch.Generator(device="cuda").manual_seed(batch * 1_000_003 + keys)
    q = torch.randn((batch, seqlen_q, heads_q, args.d_head), generator=generator, device="cuda", dtype=dtype)
    k_cache, v_cache = (
        torch.randn((batch, keys, heads_kv, args.d_head), generator=generator, device="cuda", dtype=dtype)
        for _ in range(2)
    )
    cache_seqlens = torch.full((batch,), keys, dtype=torch.int32, device="cuda")
    ours_cache, fa3_cache = (k_cache, v_cache), (k_cache, v_cache)
    ours_keywords, fa3_keywords = {}, {}
    if args.page_size:
        k_pool, v_pool, table = paged(k_cache, v_cache, args.page_size, args.page_order == "random", generator)
        ours_cache = fa3_cache = (k_pool, v_pool)
        ours_keywords, fa3_keywords = {"block_table": table}, {"page_table": table}
    calls = {
        OURS: functools.partial(
            flash_attention.flash_attn_with_kvcache, q, *ours_cache, cache_seqlens=cache_seqlens, causal=True,
            **ours_keywords,
        )
    }
    for splits in args.splits:
        calls[f"{OURS}/{splits}"] = functools.partial(calls[OURS], num_splits=splits)
    for cfg in args.configs:
        calls[named(cfg)] = functools.partial(
            flash_attention.forward, cfg, q, *ours_cache, seqused_k=cache_seqlens, causal=True, **ours_keywords
        )
    if fa3 is not None and dtype == torch.bfloat16:
        calls[FA3] = functools.partial(
            fa3, q, *fa3_cache, cache_seqlens=cache_seqlens, causal=True, num_splits=0, **fa3_keywords
        )
    query, key, value = (t.transpose(1, 2) for t in (q, k_cache, v_cache))
    # SDPA's is_causal aligns to the first key: the bottom-right mask of several queries is given.
    mask = None
    if seqlen_q > 1:
        rows = torch.arange(seqlen_q, device="cuda")[:, None] + keys - seqlen_q
        mask = torch.arange(keys, device="cuda")[None, :] <= rows
    calls[SDPA] = functools.partial(F.scaled_dot_product_attention, query, key, value, attn_mask=mask, enable_gqa=True)

    kv_bytes = 2 * batch * keys * heads_kv * args.d_head * q.element_size()
    rows = []
    for name in common.timing_order(list(calls), 0, (dtype_name, batch, keys, seqlen_q)):
        time_ms = timer(graphed(calls[name]) if args.graphs else calls[name])
        host = host_us(torch, calls[name], args.host_calls) if args.host_calls else math.nan
        rows.append(DecodeTiming(dtype_name, batch, keys, seqlen_q, name, time_ms, kv_bytes / time_ms / 1e6, host))
    reference = calls[SDPA]().transpose(1, 2)
    ours = calls[OURS]()
    error = (ours.float() - reference.float()).abs().max().item()
    failure = None if error < 2e-2 else f"{dtype_name} {batch}x{keys} q{seqlen_q}: ours differs from SDPA by {error:.3g}"
    return rows, failure


def named(cfg) -> str:
    """The column of a configuration timed by name."""
    return f"{OURS}[{cfg.short_form()}]"


def paged(k_cache, v_cache, page_size: int, shuffled: bool, generator):
    """(k pool, v pool, block_table): the caches' rows on pages of page_size rows in one pool, the
    pages in random order if shuffled, else in the caches' order."""
    import torch

    batch, keys, heads, d_head = k_cache.shape
    per_sequence = -(-keys // page_size)
    pages = batch * per_sequence
    order = torch.randperm(pages, generator=generator, device="cuda") if shuffled else torch.arange(pages, device="cuda")
    table = order.view(batch, per_sequence).to(torch.int32)
    pools = []
    for cache in (k_cache, v_cache):
        padded = torch.zeros((batch, per_sequence * page_size, heads, d_head), dtype=cache.dtype, device="cuda")
        padded[:, :keys] = cache
        pool = torch.empty((batch * per_sequence, page_size, heads, d_head), dtype=cache.dtype, device="cuda")
        pool[order] = padded.view(-1, page_size, heads, d_head)
        pools.append(pool)
    return pools[0], pools[1], table


def paged_call_error(fa3, page_size: int) -> str | None:
    """Why FA3 cannot read a paged cache (some builds of fa3-fwd leave paging out), or None."""
    import torch

    q = torch.zeros((1, 1, 1, 128), dtype=torch.bfloat16, device="cuda")
    pool = torch.zeros((1, page_size, 1, 128), dtype=torch.bfloat16, device="cuda")
    table = torch.zeros((1, 1), dtype=torch.int32, device="cuda")
    try:
        fa3(q, pool, pool, cache_seqlens=torch.ones(1, dtype=torch.int32, device="cuda"), page_table=table)
    except RuntimeError as error:
        return str(error).strip().splitlines()[-1]
    return None


def format_table(rows: list[DecodeTiming], implementations: list[str], field: str = "gbps") -> str:
    """One row per shape and a column per implementation: GB/s (field "gbps"), or host microseconds
    per call ("host_us"), and ours over each peer's (of host time: below 1 where ours costs less)."""
    shapes = sorted({(r.dtype, r.seqlen_q, r.batch, r.keys) for r in rows}, key=lambda s: (s[0], s[1], s[2] * s[3], s[2]))
    unit = {"gbps": "GB/s", "host_us": "host µs"}[field]
    headers = ["dtype", "q", "batch x keys", *(f"{name} {unit}" for name in implementations), "ours/FA3", "ours/SDPA"]
    table = []
    for dtype, seqlen_q, batch, keys in shapes:
        at = {r.implementation: getattr(r, field) for r in rows if (r.dtype, r.seqlen_q, r.batch, r.keys) == (dtype, seqlen_q, batch, keys)}
        ours = at.get(OURS, math.nan)
        table.append(
            [dtype, seqlen_q, f"{batch} x {keys:,}", *(at.get(name, math.nan) for name in implementations),
             ours / at.get(FA3, math.nan), ours / at.get(SDPA, math.nan)]
        )  # fmt: skip
    ratio_columns = {len(headers) - 2: ".3f", len(headers) - 1: ".3f"}
    value_format = ".0f" if field == "gbps" else ".1f"
    return markdown_table(headers, table, {**{i: value_format for i in range(3, len(headers) - 2)}, **ratio_columns})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not common.gpu_available():
        print(common.no_gpu_message("decode_bench"), file=sys.stderr)
        return 1
    import torch

    fa3, fa3_error = common.load_fa3("flash_attn_with_kvcache")
    if fa3 is not None and args.page_size:
        fa3_error = paged_call_error(fa3, args.page_size)
        fa3 = None if fa3_error else fa3
    timer, timing = common.make_timer(args.rep_ms)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {timing}")
    print(f"FA3: {'fa3_fwd_interface' if fa3 else f'missing: {fa3_error}'}")
    print(f"cache: {f'paged, pages of {args.page_size} rows in {args.page_order} order' if args.page_size else 'dense'}")
    rows, failures = [], []
    for dtype_name in args.dtypes:
        for seqlen_q in args.seqlen_q:
            for batch, keys in args.shapes:
                shape_rows, failure = time_shape(args, dtype_name, batch, keys, seqlen_q, fa3, timer)
                rows += shape_rows
                if failure:
                    failures.append(failure)
    implementations = [OURS, *(f"{OURS}/{s}" for s in args.splits), *map(named, args.configs), FA3, SDPA]
    print(format_table(rows, implementations))
    if args.host_calls:
        print(format_table(rows, implementations, "host_us"))
    if args.csv:
        common.write_csv(args.csv, rows)
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
