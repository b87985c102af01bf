#!/usr/bin/env python3
"""Times decoding: few queries against a long KV cache, ours against FlashAttention-3 and PyTorch SDPA.

For each batch x keys shape (default: the issue's 1x8192, 1x131072, 8x8192, 8x32768, 32x4096 and
128x2048), --seqlen-q queries per sequence (default 1), 32 query heads over 8 key/value heads of
128 (--heads, --d-head), every sequence's cache full (cache_seqlens = keys, a tensor, as a decode
step passes it), times in one run, in a seeded random order per shape:

  ours       flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=..., causal=True),
             num_splits=0 (the heuristic)
  ours/N     the same with num_splits=N for each N of --splits (the heuristic against fixed choices)
  ours[CFG]  flash_attention.forward(CFG, q, k_cache, v_cache, seqused_k=..., causal=True,
             num_splits=0) for each configuration of --configs (short forms): the automatic choice
             against named kernels of either family, split as the heuristic splits them where their
             family splits keys (a prefill against a paged cache, for example: --seqlen-q 1024)
  FA3        FlashAttention-3's flash_attn_with_kvcache (the fa3-fwd package, module
             fa3_fwd_interface; the 0.0.3 wheel runs no float16), num_splits=0
  SDPA       torch.nn.functional.scaled_dot_product_attention with enable_gqa (its default backend
             choice), on (batch, heads, seq, d) views of the same tensors; one query needs no mask,
             several get the bottom-right causal mask as a boolean attn_mask

With --kv-dtype e4m3 the cache is FP8 and the queries stay 16-bit: the same random values as the
16-bit cache's, quantised per sequence and key/value head (descale = amax / 448, the largest e4m3
value; stored = (x / descale) rounded to float8_e4m3fn), and each shape times

  ours       (ours/N, ours[CFG] too) on the e4m3 cache, given k_descale and v_descale
  ours bf16  flash_attn_with_kvcache on the 16-bit cache of the same values (ours fp16 for fp16
             queries): the column "FP8/16-bit tok/s" is its time over ours', the speed-up in tokens
             per second (batch x seqlen_q / time) that the FP8 cache brings
  FA3        FlashAttention-3's flash_attn_with_kvcache on the e4m3 cache, which it reads only with
             e4m3 queries: q quantised as the cache is, its q_descale per sequence and key/value
             head taken over the head group's queries

SDPA takes no FP8: it is not timed (its column reads '-', and a line under the table says why), and
ours is checked against SDPA on the dequantised cache instead.

With --page-size N the cache is paged: pages of N rows in one pool, in random order (--page-order
sequential: each sequence's pages one after another, as in the dense cache), ours reading it
through block_table and FA3 through page_table (SDPA, which has no paged form, reads the same keys
laid out densely; with an e4m3 cache, ours on the 16-bit cache reads the same pages). A paged run
also times "ours dense", ours on the cache under test as it was before paging, and its last column
"paged/dense" is that call's time over ours': what paging costs, measured in the same run (a
shape's time moves from run to run by more than paging costs).

With --graphs each call is captured once in a CUDA graph and its replays are timed: the GPU's time
alone, as a serving loop that replays a captured decode step sees it (the eager timings of small
shapes include the host's time per call). With --host-calls N each call's host time is also
measured: N eager calls enqueued back to back (one synchronization at the end), microseconds per
call, what a model's Python thread pays per decode step and layer; a second table lists it.

With --trace-steps N each call's kernels are also traced, to say where a step's time goes: N calls
captured in one CUDA graph, each after a 256 MiB memset that leaves L2 cold (as do_bench's timing
does), replayed under torch.profiler. A last table lists, per shape and implementation, the mean
over the steps of: the kernels per step; the step (its first kernel's start to its last kernel's
end, launches inside the graph included); its main kernel's time (the attention's: the kernel with
the most time of its own, from its start or the end of the kernels running when it started,
whichever is later, to its end; ours' combine, launched as a dependent of the forward kernel,
starts while that one runs and waits for it); and what follows the main kernel's end (a split's
combine, a reduction).

GB/s = bytes of K and V read (batch x keys x heads_kv x d_head x the cache's element size x 2) /
time: an e4m3 cache is half the bytes of a 16-bit one. The H200's copy ceiling is about 4.3 TB/s.
Time is the median of triton.testing.do_bench. A peer that does not run at a shape (FA3 raising
for it, SDPA on an e4m3 cache) reads '-', and a line under the table says where and why. Outputs
are compared with SDPA's once per shape; a mismatch is reported and makes the exit status 1. FA3's
wheel is installed apart:

    python3 -m pip install --no-deps --target /tmp/fa3 fa3_fwd-0.0.3-cp39-abi3-manylinux_2_24_x86_64.whl
    PYTHONPATH=/tmp/fa3 python3 tools/benchmark/decode_bench.py --csv decode.csv
    PYTHONPATH=/tmp/fa3 python3 tools/benchmark/decode_bench.py --graphs --kv-dtype e4m3 --shapes 8x32768 1x131072
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
from pt_bench import first_line

from flash_helpers.kernel_names import parse_kernel_name_into_config

SHAPES = ((1, 8192), (1, 131072), (8, 8192), (8, 32768), (32, 4096), (128, 2048))
OURS, FA3, SDPA = "ours", "FA3", "SDPA"
# --kv-dtype: the cache in q's own dtype, or an FP8 one.
SAME = "same"
KV_DTYPES = (SAME, *common.FP8_DTYPE_NAMES)
SPEED_UP = "FP8/16-bit tok/s"
# A paged run's: ours on the unpaged cache, and the column of its time over ours'.
UNPAGED = f"{OURS} dense"
PAGED_OVER_DENSE = "paged/dense"


@dataclasses.dataclass(frozen=True)
class DecodeTiming:
    dtype: str  # q's
    batch: int
    keys: int
    seqlen_q: int
    implementation: str
    time_ms: float
    gbps: float
    host_us: float = math.nan  # host microseconds per eager call (--host-calls), NaN if not measured
    kv_dtype: str = SAME  # the run's --kv-dtype (an FP8 run's "ours <dtype>" reads the 16-bit cache)
    # --trace-steps (NaN if not traced): StepTrace's means.
    kernels_per_step: float = math.nan
    step_us: float = math.nan
    main_kernel_us: float = math.nan
    after_main_us: float = math.nan


# --trace-steps: the memset before each traced step, larger than the H200's 50 MB L2.
FLUSH_BYTES = 256 << 20


@dataclasses.dataclass(frozen=True)
class StepTrace:
    """Means over the traced steps, microseconds (see the module's docstring)."""

    kernels_per_step: float
    step_us: float
    main_kernel_us: float
    after_main_us: float


def step_trace(activities: list[tuple[float, float, str]], flush_names: set[str]) -> StepTrace:
    """The steps of a trace: ``activities`` (start, end, name) of the GPU in microseconds, each step's
    after one whose name is in ``flush_names`` (the memset before it; what comes before the first is
    not a step)."""
    steps: list[list[tuple[float, float, str]]] = []
    for activity in sorted(activities):
        if activity[2] in flush_names:
            steps.append([])
        elif steps:
            steps[-1].append(activity)
    steps = [step for step in steps if step]
    if not steps:
        raise ValueError("no step's kernels in the trace")

    def own_time(step, i):
        """Kernel i's time after the kernels that started before it have ended (step sorted by start)."""
        start, end, _ = step[i]
        return end - max([start, *(earlier[1] for earlier in step[:i])])

    totals = [0.0] * 4
    for step in steps:
        start, end = step[0][0], max(a[1] for a in step)
        main = step[max(range(len(step)), key=lambda i: own_time(step, i))]
        for i, value in enumerate((len(step), end - start, main[1] - main[0], end - main[1])):
            totals[i] += value
    return StepTrace(*(total / len(steps) for total in totals))


def trace_steps(torch, fn, steps: int) -> StepTrace:
    """fn's kernels over ``steps`` calls in one CUDA graph, each after a memset of FLUSH_BYTES,
    replayed under torch.profiler."""
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def flushed_steps():
        for _ in range(steps):
            flush.zero_()
            fn()

    flush_names = {name for _, _, name in common.gpu_activities(flush.zero_)}
    replay = graphed(flushed_steps)
    replay()  # the first replay uploads the graph
    return step_trace(common.gpu_activities(replay), flush_names)


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
        fp8_refusal="the queries are 16-bit (flash_attn_with_kvcache takes no FP8 q); an e4m3 cache is --kv-dtype e4m3",
    )
    parser.add_argument(
        "--kv-dtype",
        choices=KV_DTYPES,
        default=SAME,
        help="the cache's dtype: q's own, or e4m3, quantised per sequence and key/value head and timed beside "
        "ours on the 16-bit cache (default: %(default)s)",
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
    parser.add_argument(
        "--trace-steps", type=common.positive_int, metavar="N", help="also trace each call's kernels over N steps"
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


def sixteen_bit(dtype_name: str) -> str:
    """The implementation of an FP8 run that is ours on the 16-bit cache: "ours bf16"."""
    return f"{OURS} {dtype_name}"


def quantized(x, heads_kv: int, fp8_dtype):
    """x (batch, seq, heads, d) in ``fp8_dtype`` and its descales (float32, (batch, heads_kv)), x =
    stored x descale: each sequence's key/value head (for queries, the group of heads that reads it)
    scaled so that its largest magnitude is the FP8 type's largest, as a serving stack quantises a
    cache. Random values are never all zero, so no descale is 0."""
    import torch

    batch, seq, heads, d_head = x.shape
    grouped = x.float().view(batch, seq, heads_kv, heads // heads_kv, d_head)
    descale = grouped.abs().amax(dim=(1, 3, 4)) / torch.finfo(fp8_dtype).max
    stored = (grouped / descale[:, None, :, None, None]).to(fp8_dtype)
    return stored.view(x.shape), descale


def dequantized(stored, descale, dtype):
    """A cache that ``quantized`` made, back in ``dtype``: the values an FP8 call attends."""
    return (stored.float() * descale[:, None, :, None]).to(dtype)


def time_shape(args, dtype_name: str, batch: int, keys: int, seqlen_q: int, fa3, timer):
    """Times every implementation at one shape: (rows, a correctness failure or None, {implementation:
    why it did not run})."""
    import flash_attention
    import torch
    import torch.nn.functional as F

    dtype = common.dtype_from_name(dtype_name).to_torch_dtype()
    heads_q, heads_kv = args.heads
    generator = torch.Generator(device="cuda").manual_seed(batch * 1_000_003 + keys)
    q = torch.randn((batch, seqlen_q, heads_q, args.d_head), generator=generator, device="cuda", dtype=dtype)
    dense = tuple(
        torch.randn((batch, keys, heads_kv, args.d_head), generator=generator, device="cuda", dtype=dtype)
        for _ in range(2)
    )
    cache_seqlens = torch.full((batch,), keys, dtype=torch.int32, device="cuda")
    # What ours and FA3 read (the cache under test), and with an FP8 cache also the 16-bit cache of
    # the same values that ours is compared on.
    tested, compared, descales, missing = dense, (), {}, {}
    if args.kv_dtype != SAME:
        kv_dtype = common.dtype_from_name(args.kv_dtype)
        fp8 = [quantized(cache, heads_kv, kv_dtype.to_torch_dtype()) for cache in dense]  # (stored, descale) of k, v
        tested, compared = tuple(stored for stored, _ in fp8), dense
        descales = {"k_descale": fp8[0][1], "v_descale": fp8[1][1]}
        # The reason is every SDPA backend's: PyTorch's SDPA takes no FP8.
        missing[SDPA] = common.dtype_refusal("flash", kv_dtype)
    ours_keywords, fa3_keywords = {}, {}
    unpaged = tested
    if args.page_size:
        # One page table for every cache: ours on the 16-bit cache reads the same pages.
        pools, table = paged([*tested, *compared], args.page_size, args.page_order == "random", generator)
        tested, compared = pools[:2], pools[2:]
        ours_keywords, fa3_keywords = {"block_table": table}, {"page_table": table}

    def ours_on(cache, paging=ours_keywords, **keywords):
        return functools.partial(
            flash_attention.flash_attn_with_kvcache, q, *cache, cache_seqlens=cache_seqlens, causal=True,
            **paging, **keywords,
        )  # fmt: skip

    calls = {OURS: ours_on(tested, **descales)}
    if args.page_size:
        calls[UNPAGED] = ours_on(unpaged, {}, **descales)
    if compared:
        calls[sixteen_bit(dtype_name)] = ours_on(compared)
    for splits in args.splits:
        calls[f"{OURS}/{splits}"] = functools.partial(calls[OURS], num_splits=splits)
    for cfg in args.configs:
        calls[named(cfg)] = functools.partial(
            flash_attention.forward, cfg, q, *tested, seqused_k=cache_seqlens, causal=True, num_splits=0,
            **ours_keywords, **descales,
        )  # fmt: skip
    if fa3 is not None:
        fa3_q, fa3_descales = q, descales
        if descales:  # FA3 reads an FP8 cache only with FP8 queries
            fa3_q, q_descale = quantized(q, heads_kv, tested[0].dtype)
            fa3_descales = {"q_descale": q_descale, **descales}
        call = functools.partial(
            fa3, fa3_q, *tested, cache_seqlens=cache_seqlens, causal=True, num_splits=0, **fa3_keywords, **fa3_descales
        )
        try:
            call()
        except Exception as error:  # FA3 raises its own types for what its build does not run
            missing[FA3] = first_line(error)
        else:
            calls[FA3] = call

    # SDPA's is_causal aligns to the first key: the bottom-right mask of several queries is given.
    mask = None
    if seqlen_q > 1:
        rows = torch.arange(seqlen_q, device="cuda")[:, None] + keys - seqlen_q
        mask = torch.arange(keys, device="cuda")[None, :] <= rows

    def sdpa_on(k_cache, v_cache):
        query, key, value = (t.transpose(1, 2) for t in (q, k_cache, v_cache))
        return functools.partial(F.scaled_dot_product_attention, query, key, value, attn_mask=mask, enable_gqa=True)

    if not descales:
        calls[SDPA] = sdpa_on(*dense)

    def kv_bytes(cache) -> int:
        return 2 * batch * keys * heads_kv * args.d_head * cache[0].element_size()

    timings = []
    for name in common.timing_order(list(calls), 0, (dtype_name, batch, keys, seqlen_q)):
        read = kv_bytes(dense if name in (SDPA, sixteen_bit(dtype_name)) else tested)
        time_ms = timer(graphed(calls[name]) if args.graphs else calls[name])
        host = host_us(torch, calls[name], args.host_calls) if args.host_calls else math.nan
        trace = dataclasses.asdict(trace_steps(torch, calls[name], args.trace_steps)) if args.trace_steps else {}
        timings.append(
            DecodeTiming(
                dtype_name, batch, keys, seqlen_q, name, time_ms, read / time_ms / 1e6, host, args.kv_dtype, **trace
            )
        )
    if descales:
        reference = sdpa_on(*(dequantized(stored, descale, dtype) for stored, descale in fp8))
        against = "SDPA on the dequantised cache"
    else:
        reference, against = calls[SDPA], "SDPA"
    error = (calls[OURS]().float() - reference().transpose(1, 2).float()).abs().max().item()
    where = shape_label(dtype_name, args.kv_dtype, seqlen_q, batch, keys)
    failure = None if error < 2e-2 else f"{where}: ours differs from {against} by {error:.3g}"
    return timings, failure, missing


def named(cfg) -> str:
    """The column of a configuration timed by name."""
    return f"{OURS}[{cfg.short_form()}]"


def paged(caches, page_size: int, shuffled: bool, generator):
    """([a pool per cache], block_table): each cache's rows on pages of page_size rows in a pool of its
    own, the pages in random order if shuffled, else in the caches' order; one table for them all
    (the caches are of one shape)."""
    import torch

    batch, keys, heads, d_head = caches[0].shape
    per_sequence = -(-keys // page_size)
    pages = batch * per_sequence
    order = torch.randperm(pages, generator=generator, device="cuda") if shuffled else torch.arange(pages, device="cuda")
    table = order.view(batch, per_sequence).to(torch.int32)
    pools = []
    for cache in caches:
        padded = torch.zeros((batch, per_sequence * page_size, heads, d_head), dtype=cache.dtype, device="cuda")
        padded[:, :keys] = cache
        pool = torch.empty((batch * per_sequence, page_size, heads, d_head), dtype=cache.dtype, device="cuda")
        pool[order] = padded.view(-1, page_size, heads, d_head)
        pools.append(pool)
    return pools, table


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


def dtype_cell(dtype: str, kv_dtype: str) -> str:
    """The tables' dtype: q's, and the cache's where it is FP8."""
    return dtype if kv_dtype == SAME else f"{dtype}, {kv_dtype} cache"


def shape_label(dtype: str, kv_dtype: str, seqlen_q: int, batch: int, keys: int) -> str:
    return f"{dtype_cell(dtype, kv_dtype)}, q {seqlen_q}, {batch} x {keys:,}"


def format_table(rows: list[DecodeTiming], implementations: list[str], field: str = "gbps") -> str:
    """One row per shape and a column per implementation: GB/s (field "gbps"), or host microseconds
    per call ("host_us"), and ours over each peer's (of host time: below 1 where ours costs less).
    With an FP8 cache the GB/s table ends with SPEED_UP, the time of ours on the 16-bit cache over
    ours': the GB/s of the two count the bytes of caches of their own sizes. A paged run's ends with
    PAGED_OVER_DENSE, the time of ours on the unpaged cache over ours'."""

    def shape_of(r: DecodeTiming) -> tuple:
        return r.dtype, r.kv_dtype, r.seqlen_q, r.batch, r.keys

    shapes = sorted({shape_of(r) for r in rows}, key=lambda s: (s[0], s[1], s[2], s[3] * s[4], s[3]))
    unit = {"gbps": "GB/s", "host_us": "host µs"}[field]
    speed_up = field == "gbps" and any(r.kv_dtype != SAME for r in rows)
    paged = field == "gbps" and any(r.implementation == UNPAGED for r in rows)
    ratios = ["ours/FA3", "ours/SDPA", *([SPEED_UP] if speed_up else []), *([PAGED_OVER_DENSE] if paged else [])]
    headers = ["dtype", "q", "batch x keys", *(f"{name} {unit}" for name in implementations), *ratios]
    table = []
    for shape in shapes:
        dtype, kv_dtype, seqlen_q, batch, keys = shape
        at_shape = [r for r in rows if shape_of(r) == shape]
        at = {r.implementation: getattr(r, field) for r in at_shape}
        ours = at.get(OURS, math.nan)
        row = [
            dtype_cell(dtype, kv_dtype), seqlen_q, f"{batch} x {keys:,}",
            *(at.get(name, math.nan) for name in implementations),
            ours / at.get(FA3, math.nan), ours / at.get(SDPA, math.nan),
        ]  # fmt: skip
        times = {r.implementation: r.time_ms for r in at_shape}
        if speed_up:
            row.append(times.get(sixteen_bit(dtype), math.nan) / times.get(OURS, math.nan))
        if paged:
            row.append(times.get(UNPAGED, math.nan) / times.get(OURS, math.nan))
        table.append(row)
    values = len(headers) - len(ratios)
    value_format = ".0f" if field == "gbps" else ".1f"
    formats = {i: value_format if i < values else ".3f" for i in range(3, len(headers))}
    return markdown_table(headers, table, formats)


def format_traces(rows: list[DecodeTiming], implementations: list[str]) -> str:
    """--trace-steps' table: a row per shape and traced implementation, in the GB/s table's orders."""
    order = {name: i for i, name in enumerate(implementations)}
    traced = sorted(
        (r for r in rows if not math.isnan(r.step_us)),
        key=lambda r: (
            r.dtype, r.kv_dtype, r.seqlen_q, r.batch * r.keys, r.batch, order.get(r.implementation, len(order))
        ),  # fmt: skip
    )
    headers = ["dtype", "q", "batch x keys", "implementation", "kernels", "step µs", "main kernel µs", "after it µs"]
    table = [
        [dtype_cell(r.dtype, r.kv_dtype), r.seqlen_q, f"{r.batch} x {r.keys:,}", r.implementation,
         r.kernels_per_step, r.step_us, r.main_kernel_us, r.after_main_us]
        for r in traced
    ]  # fmt: skip
    return markdown_table(headers, table, {4: ".1f", 5: ".2f", 6: ".2f", 7: ".2f"})


def missing_lines(missing: dict[tuple[str, str], list[str]], shapes: int) -> list[str]:
    """Per implementation and reason (``missing``: the shapes where it did not run, for that
    reason, out of ``shapes``), where and why."""
    return [
        f"{name} missing at {'every shape' if len(where) == shapes else '; '.join(where)}: {reason}"
        for (name, reason), where in missing.items()
    ]


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
    layout = f"paged, pages of {args.page_size} rows in {args.page_order} order" if args.page_size else "dense"
    kv = "q's dtype" if args.kv_dtype == SAME else f"{args.kv_dtype} (descales: amax / 448 per sequence and kv head)"
    print(f"cache: {layout}, {kv}")
    rows, failures, missing = [], [], {}
    for dtype_name in args.dtypes:
        for seqlen_q in args.seqlen_q:
            for batch, keys in args.shapes:
                shape_rows, failure, not_run = time_shape(args, dtype_name, batch, keys, seqlen_q, fa3, timer)
                rows += shape_rows
                if failure:
                    failures.append(failure)
                for name, reason in not_run.items():
                    where = shape_label(dtype_name, args.kv_dtype, seqlen_q, batch, keys)
                    missing.setdefault((name, reason), []).append(where)
    on_16_bit = [sixteen_bit(d) for d in args.dtypes] if args.kv_dtype != SAME else []
    unpaged = [UNPAGED] if args.page_size else []
    implementations = [
        OURS, *unpaged, *on_16_bit, *(f"{OURS}/{s}" for s in args.splits), *map(named, args.configs), FA3, SDPA
    ]  # fmt: skip
    print(format_table(rows, implementations))
    for line in missing_lines(missing, len(args.dtypes) * len(args.seqlen_q) * len(args.shapes)):
        print(line)
    if args.host_calls:
        print(format_table(rows, implementations, "host_us"))
    if args.trace_steps:
        print(format_traces(rows, implementations))
    if args.csv:
        common.write_csv(args.csv, rows)
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
