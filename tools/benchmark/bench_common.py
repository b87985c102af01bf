"""What the benchmark and analysis tools share: the benchmark shapes and problems, FLOP counts,
inputs, timing, the PyTorch SDPA references, the FLASH output check, configuration selection,
tables, CSV files and progress bars.

Importing this module imports neither torch nor the compiled extension (they are imported inside
the functions that need them), so every tool's ``--help`` is instant and the parsers and
summaries that need no GPU work on any machine.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import csv
import dataclasses
import functools
import importlib
import math
import os
import pathlib
import random
import statistics
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _use_checkout_packages() -> None:
    """The tools use the packages of the checkout they belong to (where `pip install -e .` builds the
    extension in place), not another installed copy; this also lets the tools that need no build
    (SASS, summaries) run from a bare checkout. The checkout's py/ goes after PYTHONPATH's entries,
    not before them: a PYTHONPATH that names another tree's py/ (ab_builds.py runs the base build's
    benchmark so) is obeyed, and that tree's packages, its module and helpers, are the ones imported."""
    checkout = str(REPO_ROOT / "py")
    if checkout in sys.path:
        return
    explicit = {os.path.abspath(entry) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry}
    named = [i for i, entry in enumerate(sys.path) if entry and os.path.abspath(entry) in explicit]
    sys.path.insert(named[-1] + 1 if named else 0, checkout)


_use_checkout_packages()

from flash_helpers import sm80_config, sm90_config  # noqa: E402
from flash_helpers.dispatch_table import arch_name  # noqa: E402
from flash_helpers.dtypes import DTYPES, FP8_DTYPES, DType, output_dtype  # noqa: E402
from flash_helpers.kernel_config import KernelConfig  # noqa: E402
from flash_helpers.build_env import BUILD_KERNELS_ENV  # noqa: E402
from flash_helpers.kernel_sets import KERNELS_ENV, get_kernel_configs  # noqa: E402
from flash_helpers.problem import ProblemVariant  # noqa: E402
from flash_helpers.problem import needed_variant as problem_variant_for  # noqa: E402

# ----------------------------------------------------------------------------------------------
# Benchmark shapes

SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)


def dtype_name(dtype: DType) -> str:
    """A dtype as the command lines and CSV files spell it: fp16, bf16, e4m3."""
    return dtype.name.lower()


# The 16-bit dtypes, which the tools measure unless told otherwise, and the FP8 ones (the Hopper
# family's alone), which they measure on request.
DTYPE_NAMES = tuple(map(dtype_name, DTYPES))
FP8_DTYPE_NAMES = tuple(map(dtype_name, FP8_DTYPES))
# The head sizes of every kernel family.
D_HEADS = tuple(sorted(set(sm80_config.D_HEADS) | set(sm90_config.D_HEADS)))
# The model width heads * d_head of every benchmark shape.
MODEL_WIDTH = 2048
# Sequences per batch, and the most tokens (batch * seq) a batch may hold.
MAX_BATCH = 16
MAX_TOKENS = 65536


def batch_for_seq_len(seq_len: int) -> int:
    """16 sequences, capped at 64Ki tokens: the seeds' batches 16/16/16/16/8/4 for seq 512 to 16384,
    and a comparable batch for any other length."""
    return max(1, min(MAX_BATCH, MAX_TOKENS // seq_len))


def heads_for_d_head(d_head: int) -> int:
    """Heads such that heads * d_head is the model width: 16 for d_head 128, 32 for d_head 64."""
    return MODEL_WIDTH // d_head


BATCH_BY_SEQ_LEN = {seq_len: batch_for_seq_len(seq_len) for seq_len in SEQ_LENS}
HEADS_BY_D_HEAD = {d_head: heads_for_d_head(d_head) for d_head in D_HEADS}


def served_d_head(text: str) -> int:
    """An argparse type: a head size the package runs, any multiple of 8 from 8 to 256 (the compiled
    head sizes run as they are, the others on the smallest compiled one that holds them)."""
    value = int(text)
    if value % 8 or not 8 <= value <= 256:
        raise argparse.ArgumentTypeError(f"a head size is a multiple of 8 from 8 to 256; got {value}")
    return value

# A length that is not a multiple of this is compared per FLOP with the next multiple, where the
# tiles of every configuration fit exactly (pt_bench, ncu_bench).
ALIGNED_LENGTH = 128


def next_aligned_length(seq_len: int) -> int:
    """The smallest multiple of ALIGNED_LENGTH that is at least seq_len."""
    return -(-seq_len // ALIGNED_LENGTH) * ALIGNED_LENGTH


def dtype_from_name(name: str) -> DType:
    """The DType of a command-line or CSV dtype name (fp16, bf16, e4m3)."""
    return DType.from_string(name)


def add_dtype_argument(
    parser: argparse.ArgumentParser, default: str | list[str], fp8_refusal: str | None = None
) -> None:
    """--dtypes (a list ``default``: one or more) or --dtype (one): any name DType.from_string reads
    (fp16, half, bfloat16, e4m3, fp8, ...), kept as the tools spell it (``dtype_name``). A tool that
    cannot run FP8 inputs says why in ``fp8_refusal``: asking it for them is then a usage error that
    gives the reason."""
    names = DTYPE_NAMES if fp8_refusal else DTYPE_NAMES + FP8_DTYPE_NAMES

    def parse(text: str) -> str:
        try:
            dtype = DType.from_string(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
        if fp8_refusal and dtype in FP8_DTYPES:
            raise argparse.ArgumentTypeError(f"{text}: {fp8_refusal}")
        return dtype_name(dtype)

    many = isinstance(default, list)
    defaults = " ".join(default) if many else default
    refused = f"; not e4m3: {fp8_refusal}" if fp8_refusal else ""
    parser.add_argument(
        "--dtypes" if many else "--dtype",
        nargs="+" if many else None,
        type=parse,
        default=default,
        metavar="DTYPE",
        help=f"{', '.join(names)} or another of their names (half, bfloat16, ...) (default: {defaults}){refused}",
    )


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def mask_name(causal: bool) -> str:
    return "causal" if causal else "no mask"


# --causal's values and the masks each measures. A bare --causal means "on".
CAUSAL_CHOICES = {"off": (False,), "on": (True,), "both": (False, True)}


def add_causal_argument(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--causal",
        nargs="?",
        const="on",
        default=default,
        choices=tuple(CAUSAL_CHOICES),
        help="with the causal mask (a bare --causal, or 'on'), without it ('off'), or each in turn ('both') "
        f"(default: {default})",
    )


def add_sustain_argument(parser: argparse.ArgumentParser) -> None:
    """--sustain-s S: time as the mean of back-to-back calls (sustained_ms) instead of do_bench."""
    parser.add_argument(
        "--sustain-s",
        type=float,
        default=0.0,
        metavar="S",
        help="time each implementation as the mean of back-to-back calls over S seconds after a warm-up of S "
        "seconds, instead of do_bench over --rep-ms (default: off)",
    )


def sustain_error(seconds: float) -> str | None:
    """Why --sustain-s's value is refused, or None."""
    if math.isfinite(seconds) and seconds >= 0:
        return None
    return f"--sustain-s must be a finite number of seconds, 0 or more; got {seconds:g}"


def causal_values(choice: str) -> tuple[bool, ...]:
    """The masks a --causal value measures: False for none, True for causal."""
    return CAUSAL_CHOICES[choice]


@dataclasses.dataclass(frozen=True)
class Problem:
    """One attention problem: q is (batch, seqlen_q, heads_q, d_head), k and v are (batch, seqlen_k,
    heads_kv, d_head); causal masks the keys past the bottom-right-aligned diagonal."""

    batch: int
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    d_head: int
    causal: bool = False

    def flop_counts(self) -> tuple[float, float]:
        return flop_counts(self.d_head, self.batch, self.heads_q, self.seqlen_q, self.seqlen_k, self.causal)

    def describe(self) -> str:
        """E.g. ``batch 16, seq 4096, 16 heads (4 k/v heads), d_head 128, causal``."""
        seq = f"seq {self.seqlen_q}" if self.seqlen_q == self.seqlen_k else f"seq {self.seqlen_q} x {self.seqlen_k}"
        heads = f"{self.heads_q} heads" + (f" ({self.heads_kv} k/v heads)" if self.heads_kv != self.heads_q else "")
        return f"batch {self.batch}, {seq}, {heads}, d_head {self.d_head}, {mask_name(self.causal)}"


def benchmark_problem(seq_len: int, d_head: int, causal: bool = False, gqa_ratio: int = 1) -> Problem:
    """The benchmark shape at any sequence length (self-attention: seqlen_k = seqlen_q) and head size,
    with gqa_ratio query heads per key/value head. Raises ValueError if gqa_ratio does not divide
    the heads."""
    heads = heads_for_d_head(d_head)
    if heads % gqa_ratio:
        raise ValueError(f"a GQA ratio of {gqa_ratio} does not divide the {heads} heads of d_head {d_head}")
    return Problem(batch_for_seq_len(seq_len), seq_len, seq_len, heads, heads // gqa_ratio, d_head, causal)


# The grouped-query problem of a Llama-70B-shaped model, as the peers' published figures use it:
# batch 2, 64 query heads over 8 key/value heads of 128, at any length.
LLAMA70B = {"batch": 2, "heads_q": 64, "heads_kv": 8, "d_head": 128}


def llama70b_problem(seq_len: int, causal: bool = False) -> Problem:
    """LLAMA70B's problem at seq_len queries and keys."""
    shape = LLAMA70B
    return Problem(shape["batch"], seq_len, seq_len, shape["heads_q"], shape["heads_kv"], shape["d_head"], causal)


def shape_problem(shape: str, seq_len: int, d_head: int, causal: bool = False, gqa_ratio: int = 1) -> Problem:
    """The problem of --shape ``shape`` ("standard": benchmark_problem's; "llama70b": LLAMA70B's,
    whatever d_head and gqa_ratio, which shape_error checks)."""
    if shape == "llama70b":
        return llama70b_problem(seq_len, causal)
    return benchmark_problem(seq_len, d_head, causal, gqa_ratio)


def shape_error(shape: str, d_heads: Sequence[int], gqa_ratio: int = 1) -> str | None:
    """Why --shape ``shape`` cannot take these head sizes and GQA ratio, or None."""
    if shape == "llama70b" and (list(d_heads) != [LLAMA70B["d_head"]] or gqa_ratio != 1):
        return "--shape llama70b: its heads are 64 over 8 of 128; pass a d_head of 128 alone and no GQA ratio"
    return None


def add_shape_argument(parser: argparse.ArgumentParser, standard: str) -> None:
    """--shape: "standard" (what ``standard`` says: the tool's own shape) or "llama70b" (LLAMA70B)."""
    parser.add_argument(
        "--shape",
        choices=("standard", "llama70b"),
        default="standard",
        help=f"standard: {standard}; llama70b: batch 2, 64 query heads over 8 key/value heads of 128 "
        "(default: %(default)s)",
    )


# ----------------------------------------------------------------------------------------------
# FLOP counts


def score_pairs(seqlen_q: int, seqlen_k: int, causal: bool = False) -> float:
    """The (query, key) pairs per head that the FLOP counts count (DESIGN.md, Measuring).

    Without a mask: all seqlen_q * seqlen_k. Causal with seqlen_q = seqlen_k: half of them, as
    FlashAttention counts, so that our TFLOP/s compare with theirs (the mask keeps n (n + 1) / 2,
    the diagonal too). Causal with other lengths: exactly the pairs the bottom-right-aligned mask
    keeps. Query i attends keys 0 .. i + seqlen_k - seqlen_q, so the last row attends seqlen_k keys,
    the one before it seqlen_k - 1, and so on up to the first row (rows that would attend fewer than
    one attend none): 1 + ... + seqlen_k less 1 + ... + max(0, seqlen_k - seqlen_q).
    """
    if not causal:
        return seqlen_q * seqlen_k
    if seqlen_q == seqlen_k:
        return seqlen_q * seqlen_k / 2
    skipped = max(0, seqlen_k - seqlen_q)
    return (seqlen_k * (seqlen_k + 1) - skipped * (skipped + 1)) // 2


def flop_rule(problem: Problem) -> str:
    """How the attention FLOPs of ``problem`` are counted (``score_pairs``), for the tables."""
    unmasked = "4 * batch * heads_q * seqlen_q * seqlen_k * d_head"
    if not problem.causal:
        return unmasked
    if problem.seqlen_q == problem.seqlen_k:
        return f"half of {unmasked} (causal), as FlashAttention counts"
    return "4 * batch * heads_q * d_head per unmasked (query, key) pair (causal)"


def flop_counts(
    d_head: int, batch: int, heads: int, seqlen_q: int, seqlen_k: int | None = None, causal: bool = False
) -> tuple[float, float]:
    """(attention FLOPs, total FLOPs) of one forward pass over the ``score_pairs`` of every head.

    The terms are those of ``flash_helpers.problem``, which counts the unmasked problem with
    seqlen_q = seqlen_k (seqlen_k defaults to seqlen_q): the two matmuls, 4 * d_head per pair
    (attention_flop); in the total also the online softmax's five operations per pair and the
    normalisation of each output element (total_flop).
    """
    seqlen_k = seqlen_q if seqlen_k is None else seqlen_k
    pairs = batch * heads * score_pairs(seqlen_q, seqlen_k, causal)
    attention = 4 * d_head * pairs
    return attention, attention + 5 * pairs + batch * heads * seqlen_q * d_head


def tflops(flop: float, time_ms: float) -> float:
    """TFLOP/s of ``flop`` operations done in ``time_ms`` milliseconds (NaN for a missing time)."""
    if not time_ms > 0:
        return math.nan
    return flop / time_ms / 1e9


# ----------------------------------------------------------------------------------------------
# Which configuration runs which problem


def needed_variant(cfg: KernelConfig, problem: Problem) -> ProblemVariant:
    """The kernel variant the binding runs for ``cfg`` on ``problem`` (``flash_helpers.problem``), at
    the problem's head size (a smaller one than ``cfg``'s where ``cfg`` serves it)."""
    return problem_variant_for(cfg, problem.seqlen_q, problem.seqlen_k, problem.causal, d_head=problem.d_head)


def compiled_variants() -> dict[KernelConfig, frozenset[ProblemVariant]]:
    """Each compiled configuration's problem variants (``flash_attention.compiled_variants``), in one
    pass over the compiled kernels rather than one per configuration: tuning builds hold thousands."""
    import flash_attention

    variants = collections.defaultdict(set)
    for cfg, variant in flash_attention.compiled_kernels():
        variants[cfg].add(variant)
    return {cfg: frozenset(at_cfg) for cfg, at_cfg in variants.items()}


def fits(
    cfg: KernelConfig,
    dtype: DType,
    problem: Problem,
    variants: dict[KernelConfig, frozenset[ProblemVariant]],
    larger_heads: bool = False,
) -> bool:
    """Whether ``cfg`` can run ``problem``: same dtype and d_head (with ``larger_heads``, a larger
    d_head too, which serves the problem's in place with zero columns past it, as automatic
    configuration runs a head size without configurations of its own), and the variant the problem
    needs is compiled (``variants``: ``compiled_variants()``). Any lengths fit a configuration that
    has the masked-tails variant."""
    holds_head = cfg.d_head == problem.d_head or (larger_heads and cfg.d_head > problem.d_head)
    return cfg.dtype == dtype and holds_head and needed_variant(cfg, problem) in variants.get(cfg, ())


def fitting_configs(configs: Iterable[KernelConfig], dtype: DType, problem: Problem) -> list[KernelConfig]:
    """Those of ``configs`` that can run ``problem`` in ``dtype`` with the built extension (``fits``)."""
    variants = compiled_variants()
    return [cfg for cfg in configs if fits(cfg, dtype, problem, variants)]


# ----------------------------------------------------------------------------------------------
# GPU, inputs and timing


@functools.cache
def load_sm90a_kernels(source: pathlib.Path):
    """A tool's own CUDA kernels (``source``, a .cu file beside it that may include the repository's
    src/ headers), compiled at first use for sm_90a as a torch extension named after the file."""
    from torch.utils import cpp_extension

    flags = ["-O3", "-std=c++20", "-gencode=arch=compute_90a,code=sm_90a", "--expt-relaxed-constexpr", "-diag-suppress=3189"]
    return cpp_extension.load(
        name=source.stem,
        sources=[str(source)],
        extra_include_paths=[str(REPO_ROOT / "src")],
        extra_cflags=["-O3", "-std=c++20"],
        extra_cuda_cflags=flags,
    )


def load_peer_function(module: str, function: str):
    """``function`` of a peer's module and "", or None and why it cannot be had. Any exception of
    the import counts: FlashAttention-4's CuTe DSL runtime raises more than ImportError when a
    piece of it is missing."""
    try:
        loaded = importlib.import_module(module)
    except Exception as error:
        return None, f"{type(error).__name__}: {error}"
    if not hasattr(loaded, function):
        return None, f"{module} has no {function}"
    return getattr(loaded, function), ""


def load_fa3(function: str):
    """FlashAttention-3's ``function`` from the fa3-fwd package (module fa3_fwd_interface)."""
    return load_peer_function("fa3_fwd_interface", function)


def load_fa4(function: str):
    """FlashAttention-4's ``function`` from the flash-attn-4 package (module flash_attn.cute; on an
    H100 or H200 it runs its SM90 path)."""
    return load_peer_function("flash_attn.cute", function)


# The peers whose flash_attn_func the tools time or profile beside ours, by their option name, with
# that function's loader.
PEER_LOADERS = {"fa3": load_fa3, "fa4": load_fa4}


def peer_call(function, q, k, v, causal: bool, **descales) -> Callable[[], object]:
    """A call of a peer's flash_attn_func as the tools run it (its lse, where returned, is dropped);
    FP8 inputs' ``descales`` (``make_descales``) go by FlashAttention-3's keywords, which are ours."""
    return lambda: function(q, k, v, causal=causal, **descales)


def add_peers_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """--peers: the PEER_LOADERS names whose flash_attn_func the tool runs (``what``: "time", ...)."""
    parser.add_argument(
        "--peers",
        nargs="*",
        choices=tuple(PEER_LOADERS),
        default=[],
        help=f"peers whose flash_attn_func to {what} beside ours (default: none)",
    )


def gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


def no_gpu_message(tool: str) -> str:
    return f"no CUDA GPU visible: {tool} needs one"


def register_transformers_attention() -> str | None:
    """Our attention registered with transformers (flash_attention.integrations.transformers): its
    implementation name, or None, with the reason on stderr, where transformers is missing or too old."""
    from flash_attention.integrations.transformers import register

    try:
        return register()
    except ImportError as error:
        print(error, file=sys.stderr)
        return None


# Where the inputs are made: the tools measure the GPU.
DEVICE = "cuda"


def make_inputs(problem: Problem, dtype: DType, seed: int | None = None):
    """Random q (batch, seqlen_q, heads_q, d_head), k and v (batch, seqlen_k, heads_kv, d_head) on the
    current GPU (never zeros: every kernel must do its real work). FP8 inputs are the same normal
    values drawn in their output's dtype (bfloat16) and rounded to e4m3; ``make_descales`` gives
    their dequantisation factors."""
    import torch

    generator = torch.Generator(device=DEVICE)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    q_shape = (problem.batch, problem.seqlen_q, problem.heads_q, problem.d_head)
    kv_shape = (problem.batch, problem.seqlen_k, problem.heads_kv, problem.d_head)
    drawn = output_dtype(DType(dtype)).to_torch_dtype()
    return tuple(
        torch.randn(shape, dtype=drawn, device=DEVICE, generator=generator).to(DType(dtype).to_torch_dtype())
        for shape in (q_shape, kv_shape, kv_shape)
    )


def make_descales(problem: Problem, dtype: DType) -> dict:
    """The keywords that inputs of ``dtype`` add to a call of ours or of FlashAttention-3 (the same
    names): for FP8 inputs q_descale, k_descale and v_descale of 1, float32 (batch, heads_kv), given
    so that each call dequantises as a real one does; none for 16-bit inputs."""
    if DType(dtype) not in FP8_DTYPES:
        return {}
    import torch

    return {
        name: torch.ones((problem.batch, problem.heads_kv), dtype=torch.float32, device=DEVICE)
        for name in ("q_descale", "k_descale", "v_descale")
    }


def make_output(q):
    """An o for a call on q: q's shape, in the dtype the call writes (q's own; bfloat16 for FP8 q)."""
    return q.new_empty(q.shape, dtype=output_dtype(DType.from_torch_dtype(q.dtype)).to_torch_dtype())


# Warm-up and measurement budget of the CUDA-event fallback, like do_bench's defaults.
DEFAULT_REP_MS = 100
_EVENT_WARMUP_CALLS = 5
_EVENT_MIN_REPEATS, _EVENT_MAX_REPEATS = 10, 1000


def median_ms_with_cuda_events(fn: Callable[[], object], rep_ms: float = DEFAULT_REP_MS) -> float:
    """Median time of ``fn`` in ms from CUDA events, repeated for about ``rep_ms`` after a warm-up."""
    import torch

    def timed_calls(count: int) -> list[float]:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(count)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]

    estimate = statistics.median(timed_calls(_EVENT_WARMUP_CALLS))
    repeats = int(min(_EVENT_MAX_REPEATS, max(_EVENT_MIN_REPEATS, rep_ms / max(estimate, 1e-3))))
    return statistics.median(timed_calls(repeats))


# GPU time each batch of a sustained loop queues before the host checks the clock.
_SUSTAINED_BATCH_MS = 20.0


def sustained_ms(fn: Callable[[], object], seconds: float) -> float:
    """Mean time of ``fn`` in ms over back-to-back calls for about ``seconds``, after as long a
    warm-up of the same calls: under a power limit, the time at the clock this call's own power draw
    leaves, whatever ran before it. The host keeps one batch queued ahead, so the GPU never waits
    for it; nothing flushes the L2 cache between calls."""
    import time

    import torch

    estimate = median_ms_with_cuda_events(fn, rep_ms=_SUSTAINED_BATCH_MS)
    batch = max(1, int(_SUSTAINED_BATCH_MS / max(estimate, 1e-3)))

    def loop(duration: float) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        calls, queued = 0, None
        began = time.perf_counter()
        start.record()
        while time.perf_counter() - began < duration:
            for _ in range(batch):
                fn()
            calls += batch
            batch_done = torch.cuda.Event()
            batch_done.record()
            if queued is not None:
                queued.synchronize()
            queued = batch_done
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / calls

    loop(seconds)
    return loop(seconds)


def gpu_activities(run: Callable[[], object]) -> list[tuple[float, float, str]]:
    """(start µs, end µs, name) of every GPU activity (kernels, copies, memsets) ``run`` causes, from
    the PyTorch profiler, in the profiler's order; ``run`` is synchronized before the profile ends."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        run()
        torch.cuda.synchronize()
    return [
        (event.time_range.start, event.time_range.end, event.name)
        for event in profiler.events()
        if event.device_type == torch.autograd.DeviceType.CUDA
    ]


def make_timer(
    rep_ms: float = DEFAULT_REP_MS, sustain_s: float = 0.0
) -> tuple[Callable[[Callable[[], object]], float], str]:
    """The timing function (fn -> milliseconds) and a description of it for the report.

    triton.testing.do_bench flushes the L2 cache between calls and repeats for ``rep_ms``; without
    triton, CUDA events around each call give the same median without the flush. With ``sustain_s``,
    the mean of a sustained loop instead (``sustained_ms``).
    """
    if sustain_s > 0:
        return (
            lambda fn: sustained_ms(fn, sustain_s),
            f"mean of back-to-back calls over about {sustain_s:g} s after a warm-up as long, each implementation "
            "at the clock its own power draw leaves (no L2 flush between calls)",
        )
    try:
        from triton.testing import do_bench
    except ImportError:
        return (
            lambda fn: median_ms_with_cuda_events(fn, rep_ms),
            f"median of CUDA-event timings over about {rep_ms:g} ms (triton is not installed)",
        )
    return (
        lambda fn: do_bench(fn, rep=rep_ms, return_mode="median"),
        f"median of triton.testing.do_bench over about {rep_ms:g} ms",
    )


def timing_order(items: list, round_index: int, shape: object) -> list:
    """``items`` in the order to time them at ``shape`` in round ``round_index``: shuffled afresh
    for each round and shape, seeded by both so that a run repeats. Under the power limit a kernel
    timed right after a slower one (which drew less power) starts at a higher clock; in a fixed
    order the same kernel always follows the same one and its median keeps that advantage."""
    order = list(items)
    random.Random(f"{round_index} {shape!r}").shuffle(order)
    return order


# ----------------------------------------------------------------------------------------------
# PyTorch SDPA references

# Reference name (as the command lines spell it) -> column label.
SDPA_REFERENCES = {"flash": "SDPA FLASH", "cudnn": "SDPA CUDNN", "efficient": "SDPA EFFICIENT"}

# Why an implementation the tools compare with ours takes no FP8 inputs, by its name (a
# SDPA_REFERENCES or PEER_LOADERS key); FlashAttention-3 takes them, with the descales ours takes.
_WITHOUT_FP8 = {
    **{reference: "PyTorch's SDPA takes no float8_e4m3fn inputs" for reference in SDPA_REFERENCES},
    "fa4": "FlashAttention-4's flash_attn_func takes float16 and bfloat16 inputs alone",
}


def dtype_refusal(implementation: str, dtype: DType) -> str | None:
    """Why ``implementation`` (a SDPA_REFERENCES or PEER_LOADERS key) cannot run inputs of ``dtype``,
    or None where it can: the tools show it as missing with this reason instead of calling it."""
    return _WITHOUT_FP8.get(implementation) if DType(dtype) in FP8_DTYPES else None


def sdpa_backend(reference: str):
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }[reference]


def use_sdpa_reference(reference: str):
    """A context in which scaled_dot_product_attention may use only this reference's backend, so a
    backend that cannot run the shape raises instead of silently falling back to another."""
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel(sdpa_backend(reference))


def causal_lengths_error(seqlen_q: int, seqlen_k: int, reference: str) -> str | None:
    """Why SDPA cannot be a reference for a causal problem of these lengths, or None if it can: its
    is_causal aligns the mask top-left and ours bottom-right (FlashAttention-2's), so with
    seqlen_q != seqlen_k they would compute different problems."""
    if seqlen_q == seqlen_k or reference == "none":
        return None
    return (
        f"with the causal mask and seqlen_k {seqlen_k} != seqlen_q {seqlen_q}, SDPA's is_causal (aligned top-left) "
        "computes another problem than ours (aligned bottom-right): pass --reference none"
    )


def sdpa_runner(q, k, v, causal: bool = False, repeat_kv: bool = False) -> Callable[[], object]:
    """SDPA on the same tensors: it takes (batch, heads, seq, d_head), so it gets transposed views of
    our (batch, seq, heads, d_head) inputs, and returns the output in our layout. Call it inside
    ``use_sdpa_reference`` (entered once around the timing, not per call, to keep the CPU cost of
    the context out of the measurement).

    With fewer key/value heads than query heads (GQA), SDPA groups the query heads itself
    (enable_gqa), or, with ``repeat_kv``, is given k and v with each head repeated for its group
    (made here, outside any timing), for backends that do not take enable_gqa. SDPA's is_causal
    aligns the mask top-left and ours bottom-right: they agree only for seqlen_q = seqlen_k.
    """
    import torch.nn.functional as F

    if causal and q.shape[1] != k.shape[1]:
        raise ValueError("SDPA's causal mask is ours only for seqlen_q = seqlen_k (it is aligned top-left)")
    group = q.shape[2] // k.shape[2]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    options = {"is_causal": causal}
    if group > 1 and repeat_kv:
        k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    elif group > 1:
        options["enable_gqa"] = True
    return lambda: F.scaled_dot_product_attention(q, k, v, **options).transpose(1, 2)


# How an SDPA call was given grouped key/value heads (the "config" of its timing rows).
GQA_NATIVE = "enable_gqa"
GQA_REPEATED = "kv_repeated"


@dataclasses.dataclass
class SdpaCall:
    """One SDPA backend's call on our inputs, run once."""

    run: Callable[[], object]  # the call; time it inside use_sdpa_reference
    output: object  # its output, in our layout
    gqa: str  # "" without GQA, else GQA_NATIVE or GQA_REPEATED


def sdpa_call(reference: str, q, k, v, causal: bool = False) -> SdpaCall:
    """The call of one SDPA backend on q, k, v, run once to find a form the backend accepts: with GQA
    first enable_gqa (FLASH and CUDNN take it on torch >= 2.5; EFFICIENT does not), else k and v
    with repeated heads. Raises RuntimeError if the backend runs neither (it does not support this
    GPU, dtype, head size or shape)."""
    forms = (GQA_NATIVE, GQA_REPEATED) if q.shape[2] != k.shape[2] else ("",)
    with use_sdpa_reference(reference):
        for form in forms:
            run = sdpa_runner(q, k, v, causal, repeat_kv=form == GQA_REPEATED)
            try:
                return SdpaCall(run, run(), form)
            # TypeError: torch < 2.5 has no enable_gqa.
            except (RuntimeError, TypeError) as error:
                failure = error
    raise failure


# Largest |ours - SDPA FLASH| accepted: a loose sanity bound for outputs of magnitude up to ~1, where
# one unit in the last place is about 1e-3 in fp16 and 8e-3 in bf16 (the tests check precisely).
MAX_ABS_DIFFERENCE = {"fp16": 1e-2, "bf16": 4e-2}


def flash_mismatch(out, flash_output, dtype_name: str, what: str) -> str | None:
    """The correctness-failure message for ``what`` when ``out`` is further from SDPA FLASH's output
    than MAX_ABS_DIFFERENCE allows (or is NaN), else None."""
    difference = (out.float() - flash_output.float()).abs().max().item()
    if difference <= MAX_ABS_DIFFERENCE[dtype_name]:
        return None
    return (
        f"CORRECTNESS FAILURE: {what}: max |ours - {SDPA_REFERENCES['flash']}| = {difference:.3g} "
        f"> {MAX_ABS_DIFFERENCE[dtype_name]}"
    )


# ----------------------------------------------------------------------------------------------
# Selecting configurations


class ConfigSelectionError(ValueError):
    """The requested configurations cannot be run with this build."""


def _names_configs_explicitly(key: str) -> bool:
    """Whether ``key`` lists configurations (short forms or initializers) rather than naming a set."""
    return "(" in key or "{" in key


def select_compiled_configs(
    key: str | None, compiled: Sequence[KernelConfig], compiled_set: str, default_key: str | None = None
) -> list[KernelConfig]:
    """The compiled configurations that ``key`` selects, in the compiled order.

    ``key`` (a ``--kernels`` value) falls back to the KERNELS environment variable, then to
    ``default_key``; with none of them every compiled configuration is selected. Configurations named
    one by one must all be compiled; a named set (tune, prog, 'B_r,B_c', ...) is intersected with the
    build, and only an empty intersection is an error. Errors say how to build what is missing.
    """
    key = key or os.environ.get(KERNELS_ENV) or default_key
    if not key:
        return list(compiled)
    build_hint = f"build them with {BUILD_KERNELS_ENV}='{key}' pip install --no-build-isolation -e ."
    try:
        requested = get_kernel_configs(key)
    except ValueError as error:
        raise ConfigSelectionError(str(error)) from None
    compiled_configs = set(compiled)
    missing = [cfg for cfg in requested if cfg not in compiled_configs]
    if missing and _names_configs_explicitly(key):
        listed = "\n  ".join(cfg.short_form() for cfg in missing)
        raise ConfigSelectionError(
            f"{len(missing)} requested configuration(s) are not compiled into this build (kernel set "
            f"'{compiled_set}'):\n  {listed}\n{build_hint}"
        )
    selected = [cfg for cfg in compiled if cfg in set(requested)]
    if not selected:
        raise ConfigSelectionError(
            f"none of the {len(requested)} configurations of '{key}' is compiled into this build (kernel set "
            f"'{compiled_set}'); {build_hint}"
        )
    if missing:
        print(
            f"note: {len(selected)} of the {len(requested)} configurations of '{key}' are compiled (kernel set "
            f"'{compiled_set}') and run; to run them all, {build_hint}",
            file=sys.stderr,
        )
    return selected


def select_runnable_configs(
    configs: Sequence[KernelConfig], capability: tuple[int, int], gpu: str
) -> list[KernelConfig]:
    """The configurations among ``configs`` that a GPU of this compute capability runs
    (``cfg.runs_on``), in their order.

    A build for several architectures holds kernels that some of its GPUs cannot run: the Hopper
    family's sm_90a code runs on sm_90 alone, and a block may need more shared memory than an sm_86
    GPU has. Those are left out with a note that counts them per family; if none is left, it is an
    error.
    """
    runnable = [cfg for cfg in configs if cfg.runs_on(capability)]
    left_out = collections.Counter(cfg.family for cfg in configs if not cfg.runs_on(capability))
    if not left_out:
        return runnable
    counts = ", ".join(f"{count} of family {family}" for family, count in sorted(left_out.items()))
    reason = (
        f"{sum(left_out.values())} selected configuration(s) ({counts}) do not run on {gpu} ({arch_name(capability)}): "
        "the Hopper family (sm90) needs sm_90, and a block's shared memory must fit the GPU's"
    )
    if not runnable:
        raise ConfigSelectionError(f"none of the selected configurations runs on this GPU: {reason}")
    print(f"note: {reason}; they are left out", file=sys.stderr)
    return runnable


def select_configs(key: str | None, default_key: str | None = None) -> list[KernelConfig]:
    """``select_compiled_configs`` against the built extension, then ``select_runnable_configs`` on
    the current GPU."""
    import torch

    import flash_attention

    compiled = select_compiled_configs(
        key, flash_attention.compiled_configs(), flash_attention.compiled_kernel_set(), default_key
    )
    return select_runnable_configs(compiled, torch.cuda.get_device_capability(), torch.cuda.get_device_name())


# ----------------------------------------------------------------------------------------------
# Results: timing rows, CSV files, tables, means


@dataclasses.dataclass
class TimingRow:
    """One timed implementation at one problem: a row of the benchmark and autotuning CSV files."""

    dtype: str
    d_head: int
    causal: bool
    seq_len: int  # seqlen_q
    seqlen_k: int
    batch: int
    heads: int  # heads_q
    heads_kv: int
    implementation: str  # "ours", or "sdpa_" + an SDPA_REFERENCES key
    config: str  # our configuration's short form; for SDPA, how GQA was passed (SdpaCall.gqa)
    time_ms: float  # NaN where the implementation could not run
    tflops: float  # attention TFLOP/s: the first of flop_counts over the time

    @property
    def problem(self) -> Problem:
        return Problem(self.batch, self.seq_len, self.seqlen_k, self.heads, self.heads_kv, self.d_head, self.causal)


TIMING_FIELDS = [field.name for field in dataclasses.fields(TimingRow)]
# Columns that files written before masks and GQA lack, and their values there.
_ADDED_TIMING_FIELDS = {
    "causal": lambda row: "False",
    "seqlen_k": lambda row: row["seq_len"],
    "heads_kv": lambda row: row["heads"],
}


def timing_row(dtype: str, problem: Problem, implementation: str, config: str, time_ms: float) -> TimingRow:
    attn_flop, _ = problem.flop_counts()
    return TimingRow(
        dtype,
        problem.d_head,
        problem.causal,
        problem.seqlen_q,
        problem.seqlen_k,
        problem.batch,
        problem.heads_q,
        problem.heads_kv,
        implementation,
        config,
        time_ms,
        tflops(attn_flop, time_ms),
    )


def median_timings(rows: Iterable[TimingRow]) -> list[TimingRow]:
    """Rows that time the same implementation and configuration at the same problem more than once
    (the rounds of one run, or several runs in one CSV file) merged into one each, in the order each
    first appears: the median of the times that ran, NaN if none did."""
    measured: dict[tuple, list[TimingRow]] = {}
    for row in rows:
        measured.setdefault((row.dtype, row.problem, row.implementation, row.config), []).append(row)
    merged = []
    for (dtype, problem, implementation, config), repeats in measured.items():
        times = [row.time_ms for row in repeats if math.isfinite(row.time_ms)]
        merged.append(timing_row(dtype, problem, implementation, config, statistics.median(times) if times else math.nan))
    return merged


def _parse_bool(text: str) -> bool:
    """A bool as csv.DictWriter writes it."""
    if text not in ("True", "False"):
        raise ValueError(f"not a boolean: {text!r}")
    return text == "True"


def read_timing_csv(path: str | os.PathLike) -> list[TimingRow]:
    """Rows written by ``TimingCsvWriter`` or ``write_csv`` (pt_bench and autotune files), including
    files from before the causal, seqlen_k and heads_kv columns (unmasked, self-attention, no GQA)."""
    types = {field.name: field.type for field in dataclasses.fields(TimingRow)}
    converters = {"int": int, "float": float, "str": str, "bool": _parse_bool}
    with open(path, newline="") as file:
        reader = csv.DictReader(file)
        absent = set(TIMING_FIELDS) - set(_ADDED_TIMING_FIELDS) - set(reader.fieldnames or [])
        if absent:
            raise ValueError(f"{path}: not a timing CSV file, it lacks the columns {', '.join(sorted(absent))}")
        rows = []
        for row in reader:
            for name, default in _ADDED_TIMING_FIELDS.items():
                if row.get(name) is None:
                    row[name] = default(row)
            rows.append(TimingRow(**{name: converters[types[name]](row[name]) for name in TIMING_FIELDS}))
        return rows


def write_csv(path: str | os.PathLike, rows: Sequence[object], fieldnames: Sequence[str] | None = None) -> None:
    """Writes dataclass instances or dicts to a CSV file, creating its directory."""
    dicts = [dataclasses.asdict(row) if dataclasses.is_dataclass(row) else dict(row) for row in rows]
    if fieldnames is None:
        fieldnames = list(dicts[0]) if dicts else []
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(dicts)


class TimingCsvWriter:
    """Appends timing rows to a CSV file as they are measured, so an interrupted sweep keeps them."""

    def __init__(self, path: str | os.PathLike):
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "w", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=TIMING_FIELDS)
        self._writer.writeheader()

    def write(self, row: TimingRow) -> None:
        self._writer.writerow(dataclasses.asdict(row))
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TimingCsvWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def harmonic_mean(values: Iterable[float]) -> float:
    """Harmonic mean of the finite positive values (NaN if there are none): the mean of rates over
    workloads of equal size, dominated by the slow ones."""
    usable = [value for value in values if math.isfinite(value) and value > 0]
    return statistics.harmonic_mean(usable) if usable else math.nan


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def format_cell(value: object, float_format: str = ".1f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return format(value, float_format)
    return str(value)


def format_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], float_formats: dict[int, str] | None = None
) -> str:
    """A plain-text table: a header, a rule, then the rows. Numeric columns are right-aligned, text
    columns left-aligned; floats use ``float_formats[column]`` (default one decimal), NaN and None
    show as '-'."""
    float_formats = float_formats or {}
    cells = [[format_cell(value, float_formats.get(i, ".1f")) for i, value in enumerate(row)] for row in rows]
    numeric = [
        all(_is_number(row[i]) or row[i] is None for row in rows) if rows else False for i in range(len(headers))
    ]
    widths = [max([len(header), *(len(row[i]) for row in cells)]) for i, header in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [
            value.rjust(width) if right else value.ljust(width)
            for value, width, right in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(headers), rule, *(line(row) for row in cells)])


# ----------------------------------------------------------------------------------------------
# Progress


class Progress:
    """A progress bar on stderr: tqdm's on a terminal if tqdm is installed, else a plain line.

    The plain line is rewritten in place on a terminal; in a log (stderr not a terminal) it is
    printed at every tenth of the work, so logs stay short.
    """

    def __init__(self, total: int, description: str = ""):
        self.total, self.description, self.done = total, description, 0
        self._interactive = sys.stderr.isatty()
        self._last_tenth = -1
        self._bar = None
        if self._interactive:
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self._bar = tqdm(total=total, desc=description, file=sys.stderr, leave=False, dynamic_ncols=True)

    def set_description(self, description: str) -> None:
        self.description = description
        if self._bar is not None:
            self._bar.set_description(description, refresh=False)

    def update(self, count: int = 1) -> None:
        self.done += count
        if self._bar is not None:
            self._bar.update(count)
        elif self._interactive:
            print(f"\r{self.description} {self.done}/{self.total}\033[K", end="", file=sys.stderr, flush=True)
        elif (tenth := 10 * self.done // max(self.total, 1)) != self._last_tenth:
            self._last_tenth = tenth
            print(f"{self.description} {self.done}/{self.total}", file=sys.stderr, flush=True)

    def write(self, message: str) -> None:
        """Prints a message to stderr without breaking the bar."""
        if self._bar is not None:
            self._bar.write(message, file=sys.stderr)
            return
        if self._interactive:
            print("\r\033[K", end="", file=sys.stderr)
        print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._interactive and self.done:
            print("\r\033[K", end="", file=sys.stderr, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def track(items: Iterable, total: int | None = None, description: str = "") -> Iterator:
    """Yields ``items`` while a Progress shows how many have been handled."""
    items = list(items) if total is None else items
    with Progress(len(items) if total is None else total, description) as progress:
        for item in items:
            yield item
            progress.update()


# ----------------------------------------------------------------------------------------------
# Plots


@contextlib.contextmanager
def png_figure(path: str, panels: int = 1, panel_size: tuple[float, float] = (5.5, 4.5)):
    """Yields ``panels`` matplotlib axes side by side; on exit the figure is written to the PNG
    file ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display is needed (or present on the GPU machine)
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, panels, figsize=(panel_size[0] * panels, panel_size[1]), squeeze=False)
    try:
        yield list(axes[0])
        figure.tight_layout()
        figure.savefig(path, dpi=120)
    finally:
        plt.close(figure)
    print(f"plot written to {path}")


def finish_tflops_axis(axis, title: str, legend_size: str = "medium") -> None:
    """TFLOP/s from zero on the y axis, the title, a light grid and the legend."""
    axis.set_ylim(bottom=0)
    axis.set_ylabel("TFLOP/s")
    axis.set_title(title)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=legend_size)


@contextlib.contextmanager
def optional_import_note(module: str, consequence: str):
    """Runs the body; if it fails because ``module`` is missing, prints why and what is skipped."""
    try:
        yield
    except ModuleNotFoundError as error:
        if error.name != module:
            raise
        print(f"note: {module} is not installed: {consequence}", file=sys.stderr)
