#!/usr/bin/env python3
"""Times variable-length batches: ours against FlashAttention-3 and PyTorch SDPA on nested tensors.

The ragged batch (self-attention): --total-tokens tokens (default 64Ki) in sequences whose lengths
are drawn with a fixed seed (--seed) uniformly from --min-len to --max-len (default 64 to 8192),
the last one trimmed so that they add up to the total; or the lengths --lengths gives, in order.
Per head size (--d-heads: 16 heads of 128, 32 heads of 64, heads * d_head = 2048), dtype (--dtypes)
and mask (--causal), on the same packed inputs in one run, in a seeded random order per shape
(bench_common.timing_order):

  ours       flash_attention.flash_attn_varlen_func (the configuration chosen automatically), or
             with --config CFG flash_attention.forward(CFG, ...) on the same packed inputs: that
             configuration by name (a short form), in both tables;
  FA3        FlashAttention-3's flash_attn_varlen_func (the fa3-fwd package, module
             fa3_fwd_interface; its build runs bfloat16 only, so its float16 cells read "n/a");
  FA4        FlashAttention-4's flash_attn_varlen_func (the flash-attn-4 package, module
             flash_attn.cute, its SM90 path on Hopper; pt_bench's documentation says how its
             dependencies are carried);
  SDPA ...   torch.nn.functional.scaled_dot_product_attention on nested jagged tensors of the same
             values, restricted to each backend that may take them: FLASH, EFFICIENT and CUDNN
             (a backend that refuses them reads "n/a"). Its time includes what SDPA does to the
             nested tensors around the kernel (their offsets and longest sequence).

A peer whose import fails reads "not installed". Time is the median of triton.testing.do_bench
(of CUDA-event timings if triton is missing), or with --sustain-s S the mean of back-to-back calls
over S seconds after a warm-up as long: each implementation at the steady clock its own power draw
leaves, which short timings of different implementations one after another do not give alike.
TFLOP/s count only the attended (query, key) pairs, sequence by sequence: 4 * heads * d_head * sum over the sequences of L^2, or L (L + 1) / 2 with
the causal mask (the pairs on and below the diagonal, not half of L^2). Ratios are ours over each
peer's TFLOP/s (above 1: ours is faster).

The equal-lengths table (--equal-lengths, default 512 2048 8192): the same number of tokens as a
batch of equal lengths, ours packed (flash_attn_varlen_func) against ours dense (flash_attn_func on
(batch, seq, heads, d) views of the same tokens), or with --config both calls on that
configuration (what a packed call costs beside the dense one on the same kernel); "varlen/dense"
is the dense time over the varlen time, where the target is 0.97 or more (varlen within 3% of dense).

--kernel-times also lists, for ours on each batch (the ragged one, and packed and dense on equal
lengths), every kernel a call launches with its mean device time, from the PyTorch profiler over
KERNEL_TIME_CALLS calls: where a varlen call's time goes beside the dense call's (the Hopper
family's planning kernel, the attention kernel, a split's combine, memsets).

Our output is checked once per shape against the first peer that ran (SDPA FLASH, else another);
a difference above bench_common.MAX_ABS_DIFFERENCE is reported and makes the exit status 1.
Prints markdown tables; --csv PATH also writes every timing.

FA3 is installed from a wheel carried to the GPU machine (it reaches no network):

    python3 -m pip install --no-deps --target /tmp/fa3 fa3_fwd-0.0.3-cp39-abi3-manylinux_2_24_x86_64.whl
    PYTHONPATH=/tmp/fa3 python3 tools/benchmark/varlen_bench.py --csv varlen.csv
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import math
import random
import sys
from collections.abc import Callable

import bench_common as common
from model_bench import markdown_table
from ncu_bench import classify_kernel

from flash_helpers.kernel_names import parse_kernel_name_into_config

# The peers, in table order: FA3, FA4, then SDPA on nested tensors with each backend.
FA3 = "fa3"
FA4 = "fa4"
FLASH_PEERS = common.PEER_LOADERS
SDPA_BACKENDS = ("flash", "efficient", "cudnn")
PEERS = (*FLASH_PEERS, *(f"sdpa_{backend}" for backend in SDPA_BACKENDS))
LABELS = {
    "ours": "ours",
    FA3: "FA3",
    FA4: "FA4",
    **{f"sdpa_{backend}": f"SDPA {backend.upper()}" for backend in SDPA_BACKENDS},
}
# Cells of an implementation that did not run: its import failed, or it refused the shape.
NOT_INSTALLED = "not installed"
REFUSED = "n/a"
# The head sizes timed by default, each with 2048 / d_head heads (the other benchmarks' model width).
D_HEADS = (128, 64)
EQUAL_LENGTHS = (512, 2048, 8192)
# varlen/dense below this is reported as missing the target.
EQUAL_LENGTHS_TARGET = 0.97
# Calls profiled for --kernel-times (after one unprofiled call).
KERNEL_TIME_CALLS = 20


@dataclasses.dataclass(frozen=True)
class Batch:
    """A self-attention batch of sequences of ``lengths``, packed."""

    lengths: tuple[int, ...]
    heads: int
    d_head: int
    causal: bool

    def attended_pairs(self) -> int:
        """The (query, key) pairs the mask keeps, per head, summed over the sequences."""
        return sum(length * (length + 1) // 2 if self.causal else length * length for length in self.lengths)

    def flop(self) -> int:
        return 4 * self.heads * self.d_head * self.attended_pairs()


def ragged_lengths(total: int, shortest: int, longest: int, seed: int) -> tuple[int, ...]:
    """Lengths drawn uniformly from shortest to longest until they reach ``total``, the last one
    trimmed so that they add up to it."""
    draw = random.Random(seed)
    lengths = []
    while sum(lengths) < total:
        lengths.append(min(draw.randint(shortest, longest), total - sum(lengths)))
    return tuple(lengths)


@dataclasses.dataclass
class VarlenTiming:
    """One implementation timed on one batch: a row of the CSV file."""

    table: str  # "ragged" or "equal_lengths"
    dtype: str
    d_head: int
    heads: int
    causal: bool
    sequences: int
    tokens: int
    implementation: str  # ours, a PEERS name, or for the equal-lengths table ours_varlen / ours_dense
    time_ms: float  # NaN where it did not run
    tflops: float
    status: str  # "" where it ran, else NOT_INSTALLED or REFUSED


def packed_inputs(batch: Batch, dtype_name: str, seed: int):
    """q, k, v (total, heads, d_head) and the int32 cu_seqlens of ``batch``, on the GPU."""
    import torch

    problem = common.Problem(1, sum(batch.lengths), sum(batch.lengths), batch.heads, batch.heads, batch.d_head)
    q, k, v = (t[0] for t in common.make_inputs(problem, common.dtype_from_name(dtype_name), seed))
    cu_seqlens = torch.tensor([0, *itertools.accumulate(batch.lengths)], dtype=torch.int32, device=common.DEVICE)
    return q, k, v, cu_seqlens


def load_flash_peers() -> dict:
    """FA3's and FA4's flash_attn_varlen_func, each with why it is missing ("" where loaded)."""
    return {peer: load("flash_attn_varlen_func") for peer, load in FLASH_PEERS.items()}


def flash_peer_call(peer: str, function, batch: Batch, q, k, v, cu_seqlens) -> Callable:
    """A call of FA3's or FA4's flash_attn_varlen_func on the packed inputs, returning the output
    alone (FA4 returns the lse with it): FA3's in FlashAttention-2's positional order, FA4's by
    keyword (its positions differ)."""
    longest = max(batch.lengths)
    if peer == FA3:
        return functools.partial(function, q, k, v, cu_seqlens, cu_seqlens, longest, longest, causal=batch.causal)

    def run():
        result = function(
            q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=longest, max_seqlen_k=longest,
            causal=batch.causal,
        )  # fmt: skip
        return result[0] if isinstance(result, tuple) else result

    return run


def ours_packed_call(config, batch: Batch, q, k, v, cu_seqlens) -> Callable:
    """Our call on the packed inputs: flash_attn_varlen_func, or with ``config`` (a configuration,
    else None) forward on that configuration."""
    import flash_attention

    longest = max(batch.lengths)
    if config is None:
        return functools.partial(
            flash_attention.flash_attn_varlen_func, q, k, v, cu_seqlens, cu_seqlens, longest, longest, causal=batch.causal
        )
    return functools.partial(
        flash_attention.forward, config, q, k, v, causal=batch.causal, cu_seqlens_q=cu_seqlens,
        cu_seqlens_k=cu_seqlens, max_seqlen_q=longest, max_seqlen_k=longest,
    )


def ours_dense_call(config, batch: Batch, q, k, v) -> Callable:
    """Our call on (batch, seq, heads, d) views of packed inputs of equal lengths: flash_attn_func,
    or with ``config`` forward on that configuration."""
    import flash_attention

    dense = [t.view(len(batch.lengths), batch.lengths[0], batch.heads, batch.d_head) for t in (q, k, v)]
    if config is None:
        return functools.partial(flash_attention.flash_attn_func, *dense, causal=batch.causal)
    return functools.partial(flash_attention.forward, config, *dense, causal=batch.causal)


def calls(batch: Batch, q, k, v, cu_seqlens, flash_peers: dict, config=None) -> dict[str, Callable | str]:
    """Each implementation's call on the packed inputs, returning (total, heads, d_head); a string
    for a peer that is not installed (main prints why)."""
    import torch
    import torch.nn.functional as F

    jagged = [torch.nested.nested_tensor_from_jagged(t, cu_seqlens.long()).transpose(1, 2) for t in (q, k, v)]

    def sdpa(backend: str):
        def run():
            with common.use_sdpa_reference(backend):
                return F.scaled_dot_product_attention(*jagged, is_causal=batch.causal).transpose(1, 2).values()

        return run

    implementations = {"ours": ours_packed_call(config, batch, q, k, v, cu_seqlens)}
    for peer, (function, _) in flash_peers.items():
        implementations[peer] = (
            NOT_INSTALLED if function is None else flash_peer_call(peer, function, batch, q, k, v, cu_seqlens)
        )
    implementations.update({f"sdpa_{backend}": sdpa(backend) for backend in SDPA_BACKENDS})
    return implementations


def time_batch(
    table: str,
    batch: Batch,
    dtype_name: str,
    flash_peers: dict,
    timer,
    progress,
    seed: int,
    kernel_rows: list | None,
    config=None,
) -> tuple[list, str | None]:
    """Times ours (on ``config``, else the automatic choice) and every peer on ``batch``; returns
    the rows (in table order) and a correctness failure, if any. With ``kernel_rows`` (a list),
    also appends our call's kernels to it."""
    q, k, v, cu_seqlens = packed_inputs(batch, dtype_name, seed)
    implementations = calls(batch, q, k, v, cu_seqlens, flash_peers, config)
    outputs, rows = {}, {}
    for name in common.timing_order(list(implementations), 0, (table, dtype_name, batch)):
        call, status, time_ms = implementations[name], "", math.nan
        if isinstance(call, str):
            status = call
        else:
            try:
                outputs[name] = call()
            except Exception as error:  # the peers raise their own types for what they do not run
                if name == "ours":
                    raise
                shape = f"{dtype_name} d_head {batch.d_head} {common.mask_name(batch.causal)}"
                progress.write(f"{LABELS[name]} refuses {shape}: {error}")
                status = REFUSED
            else:
                time_ms = timer(call)
        rows[name] = timing(table, batch, dtype_name, name, time_ms, status)
        progress.update()
    if kernel_rows is not None:
        kernel_rows.append((dtype_name, batch, "varlen", profile_kernels(implementations["ours"])))
    return [rows[name] for name in implementations], mismatch(outputs, dtype_name, batch)


def mismatch(outputs: dict, dtype_name: str, batch: Batch) -> str | None:
    """The correctness failure of our output against the first peer that ran (SDPA FLASH first), or
    None: a difference above bench_common.MAX_ABS_DIFFERENCE, or NaN."""
    peer = next((name for name in ("sdpa_flash", *PEERS) if name in outputs), None)
    if peer is None:
        return None
    difference = (outputs["ours"].float() - outputs[peer].float()).abs().max().item()
    allowed = common.MAX_ABS_DIFFERENCE[dtype_name]
    if difference <= allowed:
        return None
    return (
        f"CORRECTNESS FAILURE: {dtype_name} d_head {batch.d_head} {common.mask_name(batch.causal)}: "
        f"max |ours - {LABELS[peer]}| = {difference:.3g} > {allowed}"
    )


def timing(table: str, batch: Batch, dtype_name: str, implementation: str, time_ms: float, status: str) -> VarlenTiming:
    return VarlenTiming(
        table,
        dtype_name,
        batch.d_head,
        batch.heads,
        batch.causal,
        len(batch.lengths),
        sum(batch.lengths),
        implementation,
        time_ms,
        common.tflops(batch.flop(), time_ms),
        status,
    )


def time_equal_lengths(
    batch: Batch, dtype_name: str, timer, progress, seed: int, kernel_rows: list | None, config=None
) -> list[VarlenTiming]:
    """Ours on a batch of equal lengths, packed (varlen) and dense (the same tokens as 4-D views),
    both on ``config`` if given. With ``kernel_rows`` (a list), also appends both calls' kernels to it."""
    q, k, v, cu_seqlens = packed_inputs(batch, dtype_name, seed)
    implementations = {
        "ours_varlen": ours_packed_call(config, batch, q, k, v, cu_seqlens),
        "ours_dense": ours_dense_call(config, batch, q, k, v),
    }
    rows = {}
    for name in common.timing_order(list(implementations), 0, ("equal_lengths", dtype_name, batch)):
        rows[name] = timing("equal_lengths", batch, dtype_name, name, timer(implementations[name]), "")
        progress.update()
    if kernel_rows is not None:
        for name, call in implementations.items():
            kernel_rows.append((dtype_name, batch, name.removeprefix("ours_"), profile_kernels(call)))
    return [rows[name] for name in implementations]


@dataclasses.dataclass(frozen=True)
class KernelTime:
    """One kernel of a call: what it is (our configuration's short form, or the kernel's shortened
    name), how many times one call launches it, and its mean device time per launch."""

    label: str
    launches_per_call: float
    us_per_launch: float


def kernel_times(events: list[tuple[str, float]], calls: int) -> list[KernelTime]:
    """The (kernel name, device µs) events of ``calls`` calls, grouped by kernel in the order of
    their first launch."""
    durations: dict[str, list[float]] = {}
    for name, us in events:
        durations.setdefault(name, []).append(us)
    return [
        KernelTime(classify_kernel(name).label, len(times) / calls, sum(times) / len(times))
        for name, times in durations.items()
    ]


def profile_kernels(call: Callable) -> list[KernelTime]:
    """The kernels of ``call``, from the PyTorch profiler over KERNEL_TIME_CALLS calls."""
    import torch

    call()
    torch.cuda.synchronize()

    def calls():
        for _ in range(KERNEL_TIME_CALLS):
            call()

    events = [(name, end - start) for start, end, name in common.gpu_activities(calls)]
    return kernel_times(events, KERNEL_TIME_CALLS)


def format_kernel_times(rows: list[tuple[str, Batch, str, list[KernelTime]]]) -> str:
    """The table of (dtype, batch, call, its kernels) rows: one line per kernel."""
    headers = ["dtype", "d_head", "mask", "sequences", "call", "kernel"]
    headers += ["launches per call", "µs per launch", "µs per call"]
    table = [
        [
            dtype,
            batch.d_head,
            common.mask_name(batch.causal),
            len(batch.lengths),
            call,
            kernel.label,
            kernel.launches_per_call,
            kernel.us_per_launch,
            kernel.launches_per_call * kernel.us_per_launch,
        ]
        for dtype, batch, call, kernels in rows
        for kernel in kernels
    ]
    return markdown_table(headers, table, {6: ".2f"})


def cell(row: VarlenTiming) -> float | str:
    return row.status or row.tflops


def ratio(ours: VarlenTiming, peer: VarlenTiming) -> float | str:
    return peer.status or ours.tflops / peer.tflops


def format_ragged_table(rows: list[VarlenTiming]) -> str:
    peers, ratios = [LABELS[p] for p in PEERS], [f"ours/{LABELS[p]}" for p in PEERS]
    headers = ["dtype", "d_head", "heads", "mask", "ours", *peers, *ratios]
    table = []
    for key, group in itertools.groupby(rows, key=lambda r: (r.dtype, r.d_head, r.heads, r.causal)):
        by_name = {row.implementation: row for row in group}
        ours = by_name["ours"]
        table.append(
            [
                key[0],
                key[1],
                key[2],
                common.mask_name(key[3]),
                cell(ours),
                *(cell(by_name[p]) for p in PEERS),
                *(ratio(ours, by_name[p]) for p in PEERS),
            ]
        )
    ratio_columns = range(len(headers) - len(PEERS), len(headers))
    return markdown_table(headers, table, {i: ".3f" for i in ratio_columns})


def format_equal_lengths_table(rows: list[VarlenTiming]) -> str:
    headers = ["dtype", "d_head", "heads", "mask", "seq", "batch", "varlen", "dense", "varlen/dense"]
    table = []
    for (dtype, d_head, heads, causal, seq), group in itertools.groupby(
        rows, key=lambda r: (r.dtype, r.d_head, r.heads, r.causal, r.tokens // r.sequences)
    ):
        by_name = {row.implementation: row for row in group}
        varlen, dense = by_name["ours_varlen"], by_name["ours_dense"]
        speed = dense.time_ms / varlen.time_ms
        mask = common.mask_name(causal)
        table.append([dtype, d_head, heads, mask, seq, varlen.sequences, varlen.tflops, dense.tflops, speed])
    return markdown_table(headers, table, {len(headers) - 1: ".3f"})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--d-heads",
        nargs="+",
        type=int,
        choices=common.D_HEADS,
        default=list(D_HEADS),
        help="head sizes, each with 2048 / d_head heads (default: 128 64)",
    )
    common.add_dtype_argument(
        parser,
        default=["bf16", "fp16"],
        fp8_refusal=(
            "its e4m3 runs are not written yet (it makes 16-bit batches and checks them against SDPA, which "
            "takes no FP8)"
        ),
    )
    common.add_causal_argument(parser, default="both")
    parser.add_argument("--total-tokens", type=common.positive_int, default=65536, help="(default: %(default)s)")
    parser.add_argument("--min-len", type=common.positive_int, default=64, help="(default: %(default)s)")
    parser.add_argument("--max-len", type=common.positive_int, default=8192, help="(default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the lengths and the inputs (default: %(default)s)")
    parser.add_argument(
        "--lengths",
        nargs="+",
        type=common.positive_int,
        metavar="LEN",
        help="the ragged batch's sequence lengths, in batch order, instead of drawn ones (for example many "
        "short sequences and a long one last, the order a scheduler that takes sequences as they come "
        "ends on)",
    )
    parser.add_argument(
        "--equal-lengths",
        nargs="*",
        type=common.positive_int,
        default=list(EQUAL_LENGTHS),
        metavar="SEQ",
        help="lengths of the equal-lengths table, each dividing --total-tokens; none to skip it "
        "(default: 512 2048 8192)",
    )
    parser.add_argument(
        "--rep-ms",
        type=float,
        default=common.DEFAULT_REP_MS,
        help="how long each timing repeats the call, in ms (default: %(default)g)",
    )
    common.add_sustain_argument(parser)
    parser.add_argument(
        "--kernel-times", action="store_true", help="also list the kernels each of our calls launches, with their times"
    )
    parser.add_argument(
        "--config",
        type=parse_kernel_name_into_config,
        metavar="CFG",
        help="run ours on this configuration (a short form, one argument) instead of the automatic choice",
    )
    parser.add_argument("--csv", metavar="PATH", help="also write every timing to PATH")
    args = parser.parse_args(argv)
    if sustain_error := common.sustain_error(args.sustain_s):
        parser.error(sustain_error)
    if args.min_len > args.max_len:
        parser.error(f"--min-len {args.min_len} is more than --max-len {args.max_len}")
    for length in args.equal_lengths:
        if args.total_tokens % length:
            parser.error(f"--equal-lengths: {length} does not divide --total-tokens {args.total_tokens}")
    if args.config is not None:
        # A configuration runs one dtype and head size: the shapes are those of --dtypes and --d-heads it runs.
        dtype_name, d_head = args.config.dtype.name.lower(), args.config.d_head
        if dtype_name not in args.dtypes or d_head not in args.d_heads:
            parser.error(
                f"--config: it runs {dtype_name} at d_head {d_head}, not among --dtypes {' '.join(args.dtypes)} "
                f"and --d-heads {' '.join(map(str, args.d_heads))}"
            )
        args.dtypes, args.d_heads = [dtype_name], [d_head]
    return args


def ragged_batch(args: argparse.Namespace) -> tuple[tuple[int, ...], str]:
    """The ragged batch's lengths, and where they come from: --lengths, or drawn."""
    if args.lengths:
        return tuple(args.lengths), "as given, in this order"
    lengths = ragged_lengths(args.total_tokens, args.min_len, args.max_len, args.seed)
    return lengths, f"uniform from {args.min_len} to {args.max_len}, seed {args.seed}, the last trimmed to fit"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not common.gpu_available():
        print(common.no_gpu_message("varlen_bench"), file=sys.stderr)
        return 1

    import torch

    flash_peers = load_flash_peers()
    timer, timing_description = common.make_timer(args.rep_ms, args.sustain_s)
    lengths, origin = ragged_batch(args)
    versions = f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}"
    print(f"{torch.cuda.get_device_name()}, {versions}; {timing_description}")
    for peer, (function, missing) in flash_peers.items():
        print(f"{LABELS[peer]}: {function.__module__ if function else f'{NOT_INSTALLED} ({missing})'}")
    print(
        f"ragged batch: {len(lengths)} sequences, {sum(lengths)} tokens, lengths {min(lengths)} to {max(lengths)} "
        f"({origin})"
    )
    print(f"ours: {'the automatic choice' if args.config is None else args.config.short_form()}")
    shapes = list(itertools.product(args.dtypes, args.d_heads, common.causal_values(args.causal)))
    batches = [(dtype, Batch(lengths, common.heads_for_d_head(d), d, causal)) for dtype, d, causal in shapes]
    equal = [
        (dtype, Batch((length,) * (args.total_tokens // length), common.heads_for_d_head(d), d, causal))
        for dtype, d, causal in shapes
        for length in args.equal_lengths
    ]
    ragged_rows, equal_rows, failures = [], [], []
    kernel_rows = [] if args.kernel_times else None
    total = len(batches) * (1 + len(PEERS)) + 2 * len(equal)
    with torch.inference_mode(), common.Progress(total, "varlen") as progress:
        for dtype_name, batch in batches:
            rows, failure = time_batch(
                "ragged", batch, dtype_name, flash_peers, timer, progress, args.seed, kernel_rows, args.config
            )
            ragged_rows += rows
            if failure:
                failures.append(failure)
        for dtype_name, batch in equal:
            equal_rows += time_equal_lengths(batch, dtype_name, timer, progress, args.seed, kernel_rows, args.config)

    print()
    print("TFLOP/s over the attended pairs of each sequence (causal: L (L + 1) / 2 per sequence and head)")
    print()
    print(format_ragged_table(ragged_rows))
    if equal_rows:
        print()
        print(
            f"equal lengths, {args.total_tokens} tokens: ours packed (varlen) and dense on the same tokens, TFLOP/s; "
            f"varlen/dense = dense time / varlen time (target >= {EQUAL_LENGTHS_TARGET})"
        )
        print()
        print(format_equal_lengths_table(equal_rows))
    if kernel_rows:
        print()
        print(f"the kernels of our calls: device time per launch, mean of {KERNEL_TIME_CALLS} calls (PyTorch profiler)")
        print()
        print(format_kernel_times(kernel_rows))
    if args.csv:
        common.write_csv(args.csv, ragged_rows + equal_rows)
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
