"""Variable-length batches, in the spirit of FlashAttention-2's varlen tests: flash_attention.forward
with cu_seqlens_q/k (packed sequences), seqused_q/k (FlashAttention-3's used lengths inside fixed
slots) and leftpad_q/k, and the entry points flash_attn_varlen_func and its packed forms.

Every result is compared with the float32 reference sequence by sequence (VarlenReference: each
sequence's used rows against its used keys, masks and ALiBi aligned to its own lengths, the
criterion of the other tests per sequence); padding rows are never compared as results, except
that with seqused or leftpad every row outside the sequences must be 0 (lse +inf). The rows of q, k
and v that no sequence uses hold NaN, so a kernel that lets one into a result shows (a key past a
sequence's end that the mask drops still reaches P V, where zero times NaN is NaN). Each call writes
into a NaN-poisoned o and is repeated bitwise identically (helpers.check_forward).

- The main matrix: per-sequence lengths (0, 1, lengths that are multiples of no block, queries and
  keys of their own lengths), the layouts (packed; packed slots with seqused and leftpad; 4-D slots
  padded on the right, the left or both), every mask kind (causal, windows bounded on one side or
  both), softcap, ALiBi per head and per (batch, head), MHA/GQA/MQA, on every configuration
  compiled with the varlen kernels (both families, every head size and dtype that has them).
- Focused tests: softmax scales; seqused_k alone (decode-like); the Hopper family's work plan (a
  long sequence after short ones, a plan written by several blocks, the largest batch it sorts
  and a larger one; its order, read through flash_attention._C.varlen_work_plan, against the model of
  varlen_work_plan.cuh); rows outside the batch; equal
  lengths against the dense call; the automatic choice (flash_attn_varlen_func) and the packed
  entry points; configurations without varlen kernels.
- Bad arguments (the exception, the argument named, CUDA usable afterwards); contents that break
  the rules (run without harm to the other sequences, and raising under
  FLASH_ATTENTION_CHECK_SEQLENS=1).
- torch.compile without graph breaks, CUDA graphs replayed with new cu_seqlens contents, opcheck of
  the operators with the varlen arguments, nested jagged tensors through
  scaled_dot_product_attention against PyTorch's.
- Without a GPU: the reference itself, and the checks that need only the build.

The default run is a deterministic sample of each matrix (every pair of values of any two axes);
FLASH_TEST_FULL=1 runs them whole:

    python3 -m pytest -n 8 tests/test_varlen.py
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import pathlib
import random
import sys
from collections.abc import Callable
from typing import NamedTuple

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: these tests need it")

import helpers  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tools" / "analysis"))
import work_order_tail  # noqa: E402
from flash_helpers.problem import VARLEN_VARIANTS  # noqa: E402
from flash_helpers.reference import (  # noqa: E402
    VARLEN_KEYWORDS,
    FloatReference,
    SequenceRows,
    VarlenReference,
    reference_for_call,
)
from helpers import Inputs, Varlen, VarlenLayout, check_forward, nan_like, varlen_problem  # noqa: E402

BUILT = helpers.extension_is_built()
if BUILT:
    import flash_attention

gpu = pytest.mark.gpu
needs_build = pytest.mark.skipif(not BUILT, reason=helpers.NOT_BUILT_REASON)

CONFIGS = helpers.configs_under_test() if BUILT else []
VARLEN_CONFIGS = helpers.configs_with(CONFIGS, *VARLEN_VARIANTS) if BUILT else []
NO_VARLEN_CONFIG = (
    "no configuration under test is compiled with the varlen kernels (a default build has them for "
    "flash_helpers.default_set.VARLEN_KERNELS)"
)
CHECK_SEQLENS_ENV = "FLASH_ATTENTION_CHECK_SEQLENS"


def varlen_cases(argnames: str, cases: list[tuple], describe: Callable[..., str]):
    return helpers.gpu_cases(argnames, cases, describe, NO_VARLEN_CONFIG)


def config_and_problem_id(cfg, problem: helpers.Problem) -> str:
    return f"{cfg.short_form()}-{problem.describe()}"


def automatic_shapes() -> list[tuple[torch.dtype, int]]:
    """(dtype, d_head) pairs the automatic choice can serve with a varlen kernel on this GPU."""
    return sorted({(cfg.dtype.to_torch_dtype(), cfg.d_head) for cfg in VARLEN_CONFIGS}, key=str)


def shape_id(dtype: torch.dtype, d_head: int) -> str:
    return f"{str(dtype).removeprefix('torch.')}-d{d_head}"


def cu_seqlens_of(lengths, device="cuda", dtype=torch.int32) -> torch.Tensor:
    """The prefix sums of ``lengths``: cu_seqlens (int32), or a nested tensor's offsets (int64)."""
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=dtype, device=device)


# ----------------------------------------------------------------------------------------------
# The main matrix


def random_lengths(name: str, count: int, shortest: int, longest: int, with_extremes: bool) -> tuple[int, ...]:
    """``count`` lengths drawn (seeded by ``name``) from shortest to longest; with_extremes puts a 0
    and a 1 among them."""
    draw = random.Random(name)
    lengths = [draw.randint(shortest, longest) for _ in range(count)]
    if with_extremes:
        lengths[draw.randrange(count)] = 0
        lengths[draw.randrange(count)] = 1
    return tuple(lengths)


def _self_attention(count: int, longest: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    lengths = random_lengths("self_attention", count, 1, longest, with_extremes=False)
    return lengths, lengths


# name: (query lengths, key lengths), one of each per sequence.
LENGTHS = {
    "tiny": ((0, 1, 1, 2, 3, 1, 5), (1, 0, 1, 3, 2, 5, 1)),
    "ragged": (random_lengths("ragged_q", 9, 0, 300, True), random_lengths("ragged_k", 9, 0, 300, True)),
    "self_attention": _self_attention(6, 700),
    # Several query blocks and key tiles per sequence, whole (128, 256) and partial.
    "long": ((1100, 128, 731, 1), (977, 256, 1500, 1)),
}
# name: (causal, window_size)
MASKS = {
    "no_mask": (False, (-1, -1)),
    "causal": (True, (-1, -1)),
    "window_40_7": (False, (40, 7)),
    "left_96": (False, (96, -1)),
    "right_33": (False, (-1, 33)),
    "causal_left_64": (True, (64, -1)),
    "diagonal_only": (False, (0, 0)),
}
HEADS = [(6, 6), (8, 2), (8, 1), (6, 3)]  # (heads_q, heads_kv): MHA, GQA, MQA


def main_matrix() -> list[tuple]:
    axes = itertools.product(VARLEN_CONFIGS, LENGTHS, helpers.VARLEN_LAYOUTS, MASKS, helpers.SCORE_MODS, HEADS)
    cases = []
    sample = helpers.covering_sample(list(axes), lambda case: case, "varlen")
    for cfg, lengths, layout, mask, mods, (heads_q, heads_kv) in sample:
        causal, window_size = MASKS[mask]
        softcap, alibi = helpers.SCORE_MODS[mods]
        varlen = Varlen(*LENGTHS[lengths], helpers.VARLEN_LAYOUTS[layout])
        problem = varlen_problem(
            varlen,
            heads_q=heads_q,
            heads_kv=heads_kv,
            causal=causal,
            window_size=window_size,
            softcap=softcap,
            alibi=alibi,
        )
        cases.append((cfg, problem))
    return cases


@gpu
@varlen_cases("cfg, problem", main_matrix(), config_and_problem_id)
def test_matches_reference(cfg, problem, rng):
    assert problem.variant(cfg).varlen
    check_forward(cfg, problem.make(cfg, rng))


# Paged caches: every family's varlen kernels read k and v from pages (block_table), vLLM's 16 rows
# and sizes that are not powers of two, against the same keys packed.
PAGE_SIZES = (16, 48, 256)


def paged_cases() -> list[tuple]:
    axes = itertools.product(VARLEN_CONFIGS, PAGE_SIZES, LENGTHS, MASKS)
    return helpers.covering_sample(list(axes), lambda case: case, "varlen_paged")


@gpu
@varlen_cases(
    "cfg, page_size, lengths, mask",
    paged_cases(),
    lambda cfg, page_size, lengths, mask: f"{cfg.short_form()}-page{page_size}-{lengths}-{mask}",
)
def test_a_paged_cache_gives_the_bits_of_the_packed_keys(cfg, page_size, lengths, mask, rng):
    """Packed queries against keys and values on pages in random order, the pages' rows that no
    sequence uses (past each sequence's last key, and spare pages) holding NaN: bit for bit the call
    on the same keys packed, and the reference; the pools may also be strided views (each page's keys
    and values side by side, as vLLM's cache stores them)."""
    causal, window_size = MASKS[mask]
    lengths_q, lengths_k = LENGTHS[lengths]
    dtype = cfg.dtype.to_torch_dtype()
    q = helpers.random_tensor((sum(lengths_q), 8, cfg.d_head), dtype, rng)
    k, v = (helpers.random_tensor((sum(lengths_k), 2, cfg.d_head), dtype, rng) for _ in range(2))
    cu_q, cu_k = cu_seqlens_of(lengths_q), cu_seqlens_of(lengths_k)
    bounds = cu_k.tolist()
    pages = helpers.PagedCache.of(
        *([t[start:end] for start, end in zip(bounds, bounds[1:])] for t in (k, v)), page_size, rng
    )
    pages.poison_unused_rows()
    keywords = dict(
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
        max_seqlen_q=max(lengths_q),
        max_seqlen_k=max(lengths_k),
        causal=causal,
        window_size=window_size,
    )
    paged = flash_attention.forward(cfg, q, pages.k, pages.v, nan_like(q), block_table=pages.block_table, **keywords)
    packed = flash_attention.forward(cfg, q, k, v, **keywords)
    assert torch.equal(paged, packed), f"{cfg}: the paged and packed calls differ"
    helpers.assert_matches_reference(paged, q, k, v, **keywords)
    side_by_side = torch.stack([pages.k, pages.v], dim=1)  # (num_pages, 2, page_size, heads_kv, d_head)
    strided = flash_attention.forward(
        cfg, q, side_by_side[:, 0], side_by_side[:, 1], block_table=pages.block_table, **keywords
    )
    assert torch.equal(strided, packed), f"{cfg}: pools with a page stride of their own give other results"


# ----------------------------------------------------------------------------------------------
# Focused tests


def softmax_scale_cases() -> list[tuple]:
    varlen = Varlen(*LENGTHS["ragged"])
    shapes = {"plain": {}, "causal": {"causal": True}, "softcap": {"softcap": 30.0}}
    axes = list(itertools.product(VARLEN_CONFIGS, [1e-3, 0.05, 0.5, 2.0], shapes))
    return [
        (cfg, varlen_problem(varlen, heads_q=6, heads_kv=3, softmax_scale=scale, **shapes[shape]))
        for cfg, scale, shape in helpers.covering_sample(axes, lambda case: case, "varlen_softmax_scale")
    ]


@gpu
@varlen_cases("cfg, problem", softmax_scale_cases(), config_and_problem_id)
def test_softmax_scale(cfg, problem, rng):
    check_forward(cfg, problem.make(cfg, rng))


def seqused_k_alone_cases() -> list[tuple]:
    """Queries that fill their slots (one per sequence, as in decoding, or a few) against keys that
    use part of theirs: 4-D, and packed with cu_seqlens slots."""
    layouts = {"padded": VarlenLayout(packed=False, seqused_k=True), "packed": VarlenLayout(seqused_k=True)}
    lengths_k = random_lengths("seqused_k", 7, 0, 500, with_extremes=True)
    axes = list(itertools.product(VARLEN_CONFIGS, layouts, (1, 4), (False, True)))
    cases = []
    for cfg, layout, queries, causal in helpers.covering_sample(axes, lambda case: case, "seqused_k"):
        varlen = Varlen((queries,) * len(lengths_k), lengths_k, layouts[layout])
        cases.append((cfg, varlen_problem(varlen, heads_q=8, heads_kv=2, causal=causal)))
    return cases


@gpu
@varlen_cases("cfg, problem", seqused_k_alone_cases(), config_and_problem_id)
def test_seqused_k_alone(cfg, problem, rng):
    check_forward(cfg, problem.make(cfg, rng))


def plan_cases() -> list[tuple]:
    """The Hopper family's work plan (its varlen kernels list their work tiles, longest sequences
    first): one long sequence after many short ones, which the plan moves to the front; and more
    tiles than one planning block lists (1,024), so that several blocks write the plan."""
    long_last = (*random_lengths("plan_short", 40, 1, 70, with_extremes=False), 1500)
    many_tiles = random_lengths("plan_tiles", 24, 300, 1500, with_extremes=False)
    problems = [
        varlen_problem(Varlen(long_last, long_last), heads_q=4, heads_kv=2),
        varlen_problem(Varlen(many_tiles, many_tiles), heads_q=16, heads_kv=4),
    ]
    return [(cfg, problem) for cfg in VARLEN_CONFIGS if cfg.family == "sm90" for problem in problems]


NO_HOPPER_VARLEN_CONFIG = "no Hopper configuration under test is compiled with the varlen kernels (the work plan is theirs)"


@gpu
@helpers.gpu_cases("cfg, problem", plan_cases(), config_and_problem_id, NO_HOPPER_VARLEN_CONFIG)
def test_work_plan_with_a_long_sequence_last(cfg, problem, rng):
    check_forward(cfg, problem.make(cfg, rng))


@gpu
@helpers.gpu_cases(
    "cfg, batch",
    [(cfg, batch) for cfg in VARLEN_CONFIGS if cfg.family == "sm90" for batch in (4096, 4200)],
    lambda cfg, batch: f"{cfg.short_form()}-{batch}",
    NO_HOPPER_VARLEN_CONFIG,
)
def test_work_plan_of_many_sequences(cfg, batch, rng):
    """4,096 sequences (the most the plan sorts) and 4,200 (a batch whose order it keeps) of 0 or 1
    query and as many keys: each row's output is its one key's value exactly, which a work tile
    given the wrong sequence would not be."""
    lengths = random_lengths(f"plan_many_{batch}", batch, 0, 1, with_extremes=True)
    inputs = varlen_problem(Varlen(lengths, lengths), heads_q=4, heads_kv=2).make(cfg, rng)
    out = inputs.forward(cfg, nan_like(inputs.q))
    assert torch.equal(out, inputs.v.repeat_interleave(2, dim=1)), "a row's output is not its key's value"


# The most sequences the plan sorts (varlen_work_plan.cu's PLAN_SORTED_SEQUENCES).
PLAN_SORTED_SEQUENCES = 4096


def planned_order(lengths_q, lengths_k, heads_q: int, heads_kv: int, B_r: int, cluster: int, masked: bool,
                  KV_row_bytes: int) -> list[tuple[int, int, int, int]]:
    """The (sequence, head, first query block, query blocks) of each work tile, in the order
    sm90/varlen_work_plan.cuh states: the sequences by keys, most first (a stable sort; a batch of
    more than PLAN_SORTED_SEQUENCES keeps its order), and each run of consecutive sequences with the
    same query blocks and keys ordered as a dense problem of that many sequences (work_order.cuh:
    unit after unit without a mask; under one, in chunks of the units whose K and V fit the chunk's
    budget, longest position first)."""
    batch = len(lengths_q)
    Q_blocks = [-(-length // B_r) for length in lengths_q]
    order = sorted(range(batch), key=lambda b: -lengths_k[b]) if batch <= PLAN_SORTED_SEQUENCES else list(range(batch))
    tiles = []
    first = 0
    while first < batch:
        size = (Q_blocks[order[first]], lengths_k[order[first]])
        end = first
        while end < batch and (Q_blocks[order[end]], lengths_k[order[end]]) == size:
            end += 1
        run = order[first:end]
        units = len(run) * heads_q
        groups = -(-size[0] // cluster)
        if masked:
            unit_bytes = max(1, size[1] * KV_row_bytes // (heads_q // heads_kv))
            chunk = min(units, max(1, work_order_tail.KERNEL_CHUNK_KV_BYTES // unit_bytes))
            work = work_order_tail.work_order(groups, units, chunk)
        else:
            work = [(position, unit) for unit in range(units) for position in range(groups)]
        tiles += [(run[unit // heads_q], unit % heads_q, position * cluster, size[0]) for position, unit in work]
        first = end
    return tiles


def plan_order_cases() -> list[tuple]:
    """Batches whose runs of equal sequences the plan orders: runs of equal lengths interleaved with
    others in the batch (the sort brings them together), a query length that differs inside a run of
    equal keys, a sequence of no rows; each without and with a mask, in clusters of 1 and 2, with K
    and V rows that make chunks of a few units; a batch of more tiles than one planning block lists;
    and batches sorted by each path of the planning kernel (one item per thread, four, and none)."""
    mixed = (512, 300, 512, 1500, 300, 512, 0, 512, 300, 512, 300, 1)
    keys = (512, 300, 512, 1500, 300, 512, 0, 512, 512, 512, 300, 1)  # sequence 8: 3 query blocks, 512 keys
    many_tiles = random_lengths("plan_order_tiles", 64, 200, 2000, with_extremes=True)
    cases = []
    for masked in (False, True):
        for cluster in (1, 2):
            cases.append(("mixed", mixed, keys, 4, 2, 128, cluster, masked, 1 << 13))
        cases.append(("many_tiles", many_tiles, many_tiles, 16, 4, 128, 2, masked, 1 << 12))
        for batch in (1000, 3000, 4200):
            draw = random.Random(f"plan_order_{batch}")
            lengths = tuple(draw.choice((0, 1, 64, 200, 256)) for _ in range(batch))
            cases.append((f"batch{batch}", lengths, lengths, 2, 1, 64, 1, masked, 1 << 20))
    return cases


@gpu
@pytest.mark.skipif(
    not BUILT or 900 not in flash_attention._C.compiled_architectures(),
    reason="the work plan is the Hopper family's: this build has no sm_90 code",
)
@pytest.mark.parametrize(
    "lengths_q, lengths_k, heads_q, heads_kv, B_r, cluster, masked, KV_row_bytes",
    [pytest.param(*case[1:], id=f"{case[0]}-c{case[6]}-{'masked' if case[7] else 'none'}") for case in plan_order_cases()],
)
def test_work_plan_order(lengths_q, lengths_k, heads_q, heads_kv, B_r, cluster, masked, KV_row_bytes):
    """The planning kernel's tiles (flash_attention._C.varlen_work_plan) are the model's, in its order:
    each (sequence, head, query block group) once, runs of equal sequences in the dense order."""
    def offsets(lengths):
        return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")

    plan = flash_attention._C.varlen_work_plan(
        offsets(lengths_q), offsets(lengths_k), heads_q, heads_kv, B_r, cluster, masked, KV_row_bytes
    )
    expected = planned_order(lengths_q, lengths_k, heads_q, heads_kv, B_r, cluster, masked, KV_row_bytes)
    assert [tuple(row) for row in plan[:, :4].tolist()] == expected
    starts_q = list(itertools.accumulate(lengths_q, initial=0))
    starts_k = list(itertools.accumulate(lengths_k, initial=0))
    assert [tuple(row) for row in plan[:, 4:].tolist()] == [
        (starts_q[b], lengths_q[b], starts_k[b], lengths_k[b]) for b, *_ in expected
    ], "a tile's rows are not its sequence's"


@gpu
@needs_build
def test_work_plan_refuses_bad_arguments():
    offsets = torch.tensor([0, 3, 7], dtype=torch.int32, device="cuda")
    plan = flash_attention._C.varlen_work_plan
    with pytest.raises(TypeError, match="cu_seqlens_k: dtype must be int32"):
        plan(offsets, offsets.long(), 2, 1, 64, 1, False, 256)
    with pytest.raises(ValueError, match=r"cu_seqlens_k: shape \[2\] must be \(3,\)"):
        plan(offsets, offsets[:2], 2, 1, 64, 1, False, 256)
    with pytest.raises(ValueError, match="cu_seqlens_q: expected a CUDA tensor"):
        plan(offsets.cpu(), offsets, 2, 1, 64, 1, False, 256)
    with pytest.raises(ValueError, match="heads_kv dividing heads_q"):
        plan(offsets, offsets, 3, 2, 64, 1, False, 256)
    with pytest.raises(ValueError, match="B_r, cluster, KV_row_bytes: must be positive"):
        plan(offsets, offsets, 2, 1, 0, 1, False, 256)
    assert plan(offsets, offsets, 2, 1, 64, 1, False, 256).shape == (4, 8)  # CUDA still usable


def with_rows_around(inputs: Inputs, before: int, after: int) -> Inputs:
    """``inputs`` (packed) inside q, k and v with ``before`` rows of NaN ahead of the batch and
    ``after`` behind it, the cu_seqlens moved along: rows that belong to no sequence."""
    def surround(t):
        return torch.cat([t.new_full((before, *t.shape[1:]), float("nan")), t,
                          t.new_full((after, *t.shape[1:]), float("nan"))])  # fmt: skip

    kwargs = dict(inputs.kwargs, cu_seqlens_q=inputs.kwargs["cu_seqlens_q"] + before)
    kwargs["cu_seqlens_k"] = inputs.kwargs["cu_seqlens_k"] + before
    return Inputs(surround(inputs.q), surround(inputs.k), surround(inputs.v), kwargs)


@gpu
@varlen_cases(
    "cfg, layout",
    [(cfg, layout) for cfg in VARLEN_CONFIGS for layout in ("packed", "packed_seqused")],
    lambda cfg, layout: f"{cfg.short_form()}-{layout}",
)
def test_rows_outside_the_batch(cfg, layout, rng):
    """cu_seqlens that start past row 0 and end before the last row: with cu_seqlens alone those rows
    are left as they were; with seqused they are 0 (and their lse +inf)."""
    problem = varlen_problem(Varlen(*LENGTHS["ragged"], helpers.VARLEN_LAYOUTS[layout]), causal=True)
    inputs = with_rows_around(problem.make(cfg, rng), before=5, after=7)
    if layout == "packed":
        out, lse = inputs.forward(cfg, nan_like(inputs.q), return_lse=True)
        assert out[:5].isnan().all() and out[-7:].isnan().all(), "rows outside the batch were written"
        reference = inputs.reference()
        assert reference.compare(out).passed, reference.compare(out).describe()
        assert reference.compare_lse(lse).passed, reference.compare_lse(lse).describe()
    else:
        check_forward(cfg, inputs)  # the rows outside are compared with 0 and +inf


def equal_lengths_cases() -> list[tuple]:
    """Configurations with varlen kernels that also have the dense kernel the same tokens need."""
    cases = []
    for cfg, causal, softcap in itertools.product(VARLEN_CONFIGS, (False, True), (0.0, 30.0)):
        problem = helpers.Problem(197, 197, 8, 2, batch=3, causal=causal, softcap=softcap)
        if problem.variant(cfg) in flash_attention.compiled_variants(cfg):
            cases.append((cfg, problem))
    return helpers.covering_sample(cases, lambda case: (case[0], case[1].causal, case[1].softcap), "equal_lengths")


@gpu
@varlen_cases("cfg, problem", equal_lengths_cases(), config_and_problem_id)
def test_equal_lengths_give_the_dense_result(cfg, problem, rng):
    """A packed batch of equal lengths is the dense batch's tokens: both calls meet the dense
    problem's reference (the varlen and the dense kernels are different kernels, so their results
    may differ within it), and their lse too."""
    dense = problem.make(cfg, rng)
    batch, seqlen = dense.q.shape[:2]
    cu_seqlens = torch.arange(0, (batch + 1) * seqlen, seqlen, dtype=torch.int32, device="cuda")
    packed = Inputs(
        *(t.flatten(0, 1) for t in (dense.q, dense.k, dense.v)),
        dict(dense.kwargs, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=seqlen, max_seqlen_k=seqlen),
    )
    out, lse = packed.forward(cfg, nan_like(packed.q), return_lse=True)
    results = {
        # (heads, batch * seqlen) -> (batch, heads, seqlen)
        "varlen": (out.view_as(dense.q), lse.view(-1, batch, seqlen).transpose(0, 1)),
        "dense": dense.forward(cfg, return_lse=True),
    }
    reference = dense.reference()
    for what, (output, log_sum_exp) in results.items():
        comparison, lse_comparison = reference.compare(output), reference.compare_lse(log_sum_exp)
        assert comparison.passed, f"{what}: {comparison.describe()}"
        assert lse_comparison.passed, f"{what}: {lse_comparison.describe()}"


@gpu
@varlen_cases("dtype, d_head", automatic_shapes(), shape_id)
@pytest.mark.parametrize("causal", [False, True], ids=["no_mask", "causal"])
def test_flash_attn_varlen_func(dtype, d_head, causal, rng):
    """The automatic choice, FlashAttention-2's signature: o, or (o, lse, None) with return_attn_probs."""
    lengths_q, lengths_k = LENGTHS["ragged"]
    cu_q, cu_k = (cu_seqlens_of(lengths) for lengths in LENGTHS["ragged"])
    q = helpers.random_tensor((sum(lengths_q), 8, d_head), dtype, rng)
    k, v = (helpers.random_tensor((sum(lengths_k), 2, d_head), dtype, rng) for _ in range(2))
    slopes = torch.rand((len(lengths_q), 8), generator=rng, device="cuda") * 0.3
    args = (q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k))
    call = dict(causal=causal, window_size=(-1, 50), alibi_slopes=slopes)
    out, lse, probs = flash_attention.flash_attn_varlen_func(*args, return_attn_probs=True, **call)
    assert probs is None
    keywords = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k))
    reference = helpers.assert_matches_reference(out, q, k, v, **keywords, **call)
    helpers.assert_lse_matches(lse, reference)
    assert torch.equal(flash_attention.flash_attn_varlen_func(*args, **call), out), "repeated calls differ"


@gpu
@varlen_cases("dtype, d_head", automatic_shapes(), shape_id)
def test_packed_entry_points_match_flash_attn_varlen_func(dtype, d_head, rng):
    lengths = LENGTHS["self_attention"][0]
    cu_seqlens = cu_seqlens_of(lengths)
    qkv = helpers.random_tensor((sum(lengths), 3, 4, d_head), dtype, rng)
    q, k, v = qkv.unbind(dim=1)
    longest = max(lengths)
    expected = flash_attention.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, longest, longest, causal=True)
    packed = flash_attention.flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, longest, causal=True)
    assert torch.equal(packed, expected)
    kv_packed = flash_attention.flash_attn_varlen_kvpacked_func(
        q, qkv[:, 1:], cu_seqlens, cu_seqlens, longest, longest, causal=True
    )
    assert torch.equal(kv_packed, expected)


def configs_without_varlen_kernels() -> list[tuple]:
    return [(cfg,) for cfg in CONFIGS if not set(VARLEN_VARIANTS) & set(flash_attention.compiled_variants(cfg))]


@gpu
@helpers.gpu_cases(
    "cfg",
    configs_without_varlen_kernels() if BUILT else [],
    lambda cfg: cfg.short_form(),
    "every configuration under test has the varlen kernels",
)
def test_configs_without_varlen_kernels_reject_varlen_calls(cfg, rng):
    """A block that never has varlen kernels (V_transposed_copy) says why; another says the build lacks them."""
    inputs = varlen_problem(Varlen(*LENGTHS["tiny"])).make(cfg, rng)
    if getattr(cfg, "V_transposed_copy", False):
        expected = r"^kernel_cfg: .*has no kernel for this call .*: V_transposed_copy \(vtcopy\) runs dense calls alone"
    else:
        expected = r"^kernel_cfg: .*has no kernel for this problem"
    with pytest.raises(ValueError, match=expected):
        inputs.forward(cfg)


# ----------------------------------------------------------------------------------------------
# Bad arguments: each raises, naming the argument first, before anything runs, and CUDA stays
# usable for the next call.


def valid_inputs(rng, layout: str = "packed") -> tuple[object, Inputs]:
    cfg = VARLEN_CONFIGS[0]
    varlen = Varlen((5, 0, 130), (7, 3, 90), helpers.VARLEN_LAYOUTS[layout])
    return cfg, varlen_problem(varlen, heads_q=4, heads_kv=2, causal=True).make(cfg, rng)


def varlen_arguments(inputs: Inputs) -> dict:
    """The call's variable-length keywords (cu_seqlens, max_seqlen, seqused, leftpad)."""
    return {name: value for name, value in inputs.kwargs.items() if name in VARLEN_KEYWORDS}


def assert_still_usable(cfg, inputs: Inputs) -> None:
    out = inputs.forward(cfg)
    torch.cuda.synchronize()
    helpers.assert_matches_reference(out, inputs.q, inputs.k, inputs.v, **inputs.kwargs)


def _keywords(**changes: Callable) -> Callable[[Inputs], Inputs]:
    """A change of the call's keywords: each a function of the valid value (None removes it)."""

    def change(inputs: Inputs) -> Inputs:
        kwargs = dict(inputs.kwargs)
        for name, make in changes.items():
            value = make(kwargs.get(name))
            if value is None:
                kwargs.pop(name, None)
            else:
                kwargs[name] = value
        return dataclasses.replace(inputs, kwargs=kwargs)

    return change


def _tensors(**changes: Callable) -> Callable[[Inputs], Inputs]:
    """A change of q, k or v: each a function of the valid tensor."""
    return lambda inputs: dataclasses.replace(
        inputs, **{name: make(getattr(inputs, name)) for name, make in changes.items()}
    )


def _drop(_):
    return None


class BadArgument(NamedTuple):
    id: str
    error: type[Exception]
    names: tuple[str, ...]  # the message starts with one of these
    change: Callable[[Inputs], Inputs]
    layout: str = "packed"


BAD_ARGUMENTS = [
    BadArgument("cu_seqlens_q_int64", TypeError, ("cu_seqlens_q",), _keywords(cu_seqlens_q=lambda t: t.long())),
    BadArgument("cu_seqlens_k_float", TypeError, ("cu_seqlens_k",), _keywords(cu_seqlens_k=lambda t: t.float())),
    BadArgument("cu_seqlens_q_on_cpu", ValueError, ("cu_seqlens_q",), _keywords(cu_seqlens_q=lambda t: t.cpu())),
    BadArgument("cu_seqlens_k_2d", ValueError, ("cu_seqlens_k",), _keywords(cu_seqlens_k=lambda t: t[None])),
    BadArgument(
        "cu_seqlens_q_empty", ValueError, ("cu_seqlens_q", "cu_seqlens_k"), _keywords(cu_seqlens_q=lambda t: t[:0])
    ),
    BadArgument(
        "cu_seqlens_k_one_longer", ValueError, ("cu_seqlens_k", "cu_seqlens_q"),
        _keywords(cu_seqlens_k=lambda t: torch.cat([t, t[-1:]])),
    ),  # fmt: skip
    BadArgument(
        "only_cu_seqlens_q", ValueError, ("cu_seqlens_k", "cu_seqlens_q", "max_seqlen_k"),
        _keywords(cu_seqlens_k=_drop, max_seqlen_k=_drop),
    ),  # fmt: skip
    BadArgument(
        "only_cu_seqlens_k", ValueError, ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q"),
        _keywords(cu_seqlens_q=_drop, max_seqlen_q=_drop),
    ),  # fmt: skip
    BadArgument("max_seqlen_q_missing", ValueError, ("max_seqlen_q",), _keywords(max_seqlen_q=_drop)),
    BadArgument("max_seqlen_k_missing", ValueError, ("max_seqlen_k",), _keywords(max_seqlen_k=_drop)),
    BadArgument("max_seqlen_k_negative", ValueError, ("max_seqlen_k",), _keywords(max_seqlen_k=lambda _: -1)),
    BadArgument("max_seqlen_q_a_float", TypeError, ("max_seqlen_q",), _keywords(max_seqlen_q=lambda n: float(n))),
    BadArgument("q_4d_with_cu_seqlens", ValueError, ("q",), _tensors(q=lambda q: q[None])),
    BadArgument("k_and_v_4d_with_cu_seqlens", ValueError, ("k",), _tensors(k=lambda k: k[None], v=lambda v: v[None])),
    BadArgument("v_total_differs_from_k", ValueError, ("v",), _tensors(v=lambda v: v[:-1])),
    BadArgument(
        "alibi_slopes_of_another_batch", ValueError, ("alibi_slopes",),
        _keywords(alibi_slopes=lambda _: torch.full((4, 4), 0.1, device="cuda")),
    ),  # fmt: skip
    BadArgument(
        "seqused_q_int64", TypeError, ("seqused_q",), _keywords(seqused_q=lambda t: t.long()), "packed_seqused"
    ),
    BadArgument(
        "seqused_k_one_longer", ValueError, ("seqused_k",),
        _keywords(seqused_k=lambda t: torch.cat([t, t[-1:]])), "packed_seqused",
    ),  # fmt: skip
    BadArgument("leftpad_k_on_cpu", ValueError, ("leftpad_k",), _keywords(leftpad_k=lambda t: t.cpu()), "padded_left"),
    BadArgument(
        "max_seqlen_without_cu_seqlens", ValueError, ("max_seqlen_q",),
        _keywords(max_seqlen_q=lambda _: 130), "padded_right",
    ),  # fmt: skip
    BadArgument("q_3d_with_seqused", ValueError, ("q", "seqused_q"), _tensors(q=lambda q: q[0]), "padded_right"),
]


@gpu
@varlen_cases("bad", [(bad,) for bad in BAD_ARGUMENTS] if VARLEN_CONFIGS else [], lambda bad: bad.id)
def test_rejects_bad_arguments(bad, rng):
    cfg, inputs = valid_inputs(rng, bad.layout)
    bad_inputs = bad.change(inputs)
    o = nan_like(bad_inputs.q)
    with pytest.raises(bad.error) as raised:
        bad_inputs.forward(cfg, o)
    message = str(raised.value)
    assert message.startswith(tuple(f"{name}:" for name in bad.names)), message
    assert o.isnan().all(), "a rejected call wrote its output"
    assert_still_usable(cfg, inputs)


@gpu
@varlen_cases("layout", [("packed",), ("padded_right",)] if VARLEN_CONFIGS else [], lambda layout: layout)
def test_heads_first_is_rejected_with_varlen_arguments(layout, rng):
    """heads_first (the SDPA-shaped layout) has no variable-length form."""
    cfg, inputs = valid_inputs(rng, layout)
    positional = (False, False, None, (-1, -1), 0.0, None, False, True)  # benchmark ... return_lse, heads_first
    with pytest.raises(ValueError) as raised:
        flash_attention._C.forward(cfg, inputs.q, inputs.k, inputs.v, None, *positional, **varlen_arguments(inputs))
    names = ("heads_first", *varlen_arguments(inputs))
    assert str(raised.value).startswith(tuple(f"{name}:" for name in names)), str(raised.value)
    assert_still_usable(cfg, inputs)


# ----------------------------------------------------------------------------------------------
# Contents that break the rules: the kernels clamp them, never reading or writing out of bounds, so
# the other sequences come out right; the debug check names them.


class BrokenContents(NamedTuple):
    id: str
    argument: str  # the argument whose contents break the rules
    layout: str
    change: Callable[[list[int], dict], list[int]]  # the argument's values -> broken values (given all keywords)
    broken: int  # the index of the sequence it breaks (-1: the last)


BROKEN_CONTENTS = [
    BrokenContents("cu_seqlens_q_decreasing", "cu_seqlens_q", "packed", lambda cu, _: [*cu[:-1], cu[-2] - 5], -1),
    BrokenContents("cu_seqlens_q_past_total", "cu_seqlens_q", "packed", lambda cu, _: [*cu[:-1], cu[-1] + 40], -1),
    BrokenContents("cu_seqlens_q_negative_start", "cu_seqlens_q", "packed", lambda cu, _: [-8, *cu[1:]], 0),
    BrokenContents("cu_seqlens_k_decreasing", "cu_seqlens_k", "packed", lambda cu, _: [*cu[:-1], cu[-2] - 3], -1),
    BrokenContents("cu_seqlens_k_past_total", "cu_seqlens_k", "packed", lambda cu, _: [*cu[:-1], cu[-1] + 1000], -1),
    BrokenContents(
        "seqused_q_past_slot", "seqused_q", "packed_seqused",
        lambda used, kw: [*used[:2], slot_length(kw["cu_seqlens_q"], 2) + 6, *used[3:]], 2,
    ),  # fmt: skip
    BrokenContents(
        "seqused_k_past_slot", "seqused_k", "padded_right", lambda used, _: [*used[:2], 10**6, *used[3:]], 2
    ),
    BrokenContents("seqused_k_negative", "seqused_k", "padded_right", lambda used, _: [used[0], -3, *used[2:]], 1),
    BrokenContents("leftpad_k_past_slot", "leftpad_k", "padded_left", lambda left, _: [*left[:3], 10**6, *left[4:]], 3),
    BrokenContents(
        "leftpad_q_negative", "leftpad_q", "packed_leftpad_seqused", lambda left, _: [left[0], -4, *left[2:]], 1
    ),
]
BROKEN_LENGTHS = ((37, 1, 130, 64, 90), (50, 7, 100, 64, 120))


def slot_length(cu_seqlens: torch.Tensor, index: int) -> int:
    return int(cu_seqlens[index + 1] - cu_seqlens[index])


def broken_inputs(case: BrokenContents, cfg, rng) -> tuple[Inputs, Inputs, list[int]]:
    """(the valid inputs, the same with ``case``'s argument broken, the sequences left well-formed)."""
    problem = varlen_problem(Varlen(*BROKEN_LENGTHS, helpers.VARLEN_LAYOUTS[case.layout]), heads_q=4, heads_kv=2,
                             causal=True, alibi="per_batch_head")  # fmt: skip
    valid = problem.make(cfg, rng)
    values = valid.kwargs[case.argument]
    broken_values = torch.tensor(case.change(values.tolist(), valid.kwargs), dtype=torch.int32, device=values.device)
    broken = dataclasses.replace(valid, kwargs=dict(valid.kwargs, **{case.argument: broken_values}))
    count = len(BROKEN_LENGTHS[0])
    return valid, broken, [index for index in range(count) if index != case.broken % count]


@gpu
@varlen_cases("case", [(case,) for case in BROKEN_CONTENTS] if VARLEN_CONFIGS else [], lambda case: case.id)
def test_contents_that_break_the_rules_harm_no_other_sequence(case, rng, monkeypatch):
    monkeypatch.delenv(CHECK_SEQLENS_ENV, raising=False)
    cfg = VARLEN_CONFIGS[0]
    valid, broken, well_formed = broken_inputs(case, cfg, rng)
    out, lse = broken.forward(cfg, nan_like(broken.q), return_lse=True)
    torch.cuda.synchronize()
    reference = valid.reference()
    comparison = reference.compare(out, sequences=well_formed)
    assert comparison.passed, comparison.describe()
    lse_comparison = reference.compare_lse(lse, sequences=well_formed)
    assert lse_comparison.passed, lse_comparison.describe()
    assert_still_usable(cfg, valid)


@gpu
@varlen_cases("case", [(case,) for case in BROKEN_CONTENTS] if VARLEN_CONFIGS else [], lambda case: case.id)
def test_seqlens_check_names_contents_that_break_the_rules(case, rng, monkeypatch):
    cfg = VARLEN_CONFIGS[0]
    valid, broken, _ = broken_inputs(case, cfg, rng)
    unchecked = valid.forward(cfg)
    monkeypatch.setenv(CHECK_SEQLENS_ENV, "1")
    o = nan_like(broken.q)
    with pytest.raises(ValueError, match=f"^{case.argument}: "):
        broken.forward(cfg, o)
    assert o.isnan().all(), "a rejected call wrote its output"
    assert torch.equal(valid.forward(cfg), unchecked), "the check changed a valid call's result"


# ----------------------------------------------------------------------------------------------
# torch.compile, CUDA graphs and the operators


def packed_qkv(dtype, d_head, lengths, rng, heads=(8, 2)):
    """Packed q, k, v of self-attention over ``lengths`` and their cu_seqlens."""
    cu_seqlens = cu_seqlens_of(lengths)
    q = helpers.random_tensor((sum(lengths), heads[0], d_head), dtype, rng)
    k, v = (helpers.random_tensor((sum(lengths), heads[1], d_head), dtype, rng) for _ in range(2))
    return q, k, v, cu_seqlens


@gpu
@varlen_cases("dtype, d_head", automatic_shapes(), shape_id)
def test_torch_compile_fullgraph_without_breaks(dtype, d_head, rng):
    longest = 300

    def fn(q, k, v, cu_seqlens):
        return flash_attention.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, longest, longest, causal=True)

    torch._dynamo.reset()
    inputs = packed_qkv(dtype, d_head, (300, 1, 77, 0, 129), rng)
    explanation = torch._dynamo.explain(fn)(*inputs)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(fn, fullgraph=True)
    with torch.inference_mode():
        assert torch.equal(compiled(*inputs), fn(*inputs))
        other = packed_qkv(dtype, d_head, (17, 300, 2, 250), rng)
        assert torch.equal(compiled(*other), fn(*other)), "a recompiled shape differs"


@gpu
@varlen_cases("cfg", [(cfg,) for cfg in VARLEN_CONFIGS[:1]], lambda cfg: cfg.short_form())
def test_torch_compile_of_forward_with_seqused(cfg, rng):
    """forward with an explicit configuration, 4-D slots with seqused and lse, compiled whole."""
    varlen = Varlen(*LENGTHS["tiny"], helpers.VARLEN_LAYOUTS["padded_right"])
    inputs = varlen_problem(varlen, causal=True).make(cfg, rng)

    def fn(q, k, v, seqused_q, seqused_k):
        keywords = dict(seqused_q=seqused_q, seqused_k=seqused_k, causal=True, return_lse=True)
        return flash_attention.forward(cfg, q, k, v, **keywords)

    torch._dynamo.reset()
    args = (inputs.q, inputs.k, inputs.v, inputs.kwargs["seqused_q"], inputs.kwargs["seqused_k"])
    compiled = torch.compile(fn, fullgraph=True)
    with torch.inference_mode():
        (out, lse), (expected, expected_lse) = compiled(*args), fn(*args)
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)


def random_partition(total: int, count: int, longest: int, draw: random.Random) -> list[int]:
    """``count`` lengths of at most ``longest`` that add up to ``total``."""
    while True:
        cuts = sorted(draw.randint(0, total) for _ in range(count - 1))
        lengths = [end - start for start, end in zip([0, *cuts], [*cuts, total])]
        if max(lengths) <= longest:
            return lengths


@gpu
@varlen_cases("dtype, d_head", automatic_shapes()[:1], shape_id)
def test_cuda_graph_replays_new_cu_seqlens(dtype, d_head, rng, seed):
    """Captured once, replayed with other lengths in the same cu_seqlens tensors: the graph reads
    their contents at each replay, as an eager call does."""
    count, total, longest = 6, 1200, 400
    draw = random.Random(seed)
    q, k, v, cu_seqlens = packed_qkv(dtype, d_head, random_partition(total, count, longest, draw), rng)

    def call():
        return flash_attention.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, longest, longest, causal=True)

    call()  # choose and set up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = call()
    for _ in range(3):
        lengths = random_partition(total, count, longest, draw)
        cu_seqlens.copy_(cu_seqlens_of(lengths))
        for t in (q, k, v):
            t.copy_(helpers.random_tensor(t.shape, t.dtype, rng))
        graph.replay()
        torch.cuda.synchronize()
        expected = call()
        assert torch.equal(static_out, expected), f"the replay differs from an eager call at lengths {lengths}"
        helpers.assert_matches_reference(
            static_out, q, k, v, causal=True,
            cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=longest, max_seqlen_k=longest,
        )  # fmt: skip


@gpu
@varlen_cases(
    "explicit, layout",
    [(explicit, layout) for explicit in (False, True) for layout in ("packed_leftpad_seqused", "padded_both_sides")]
    if VARLEN_CONFIGS
    else [],
    lambda explicit, layout: f"{'explicit' if explicit else 'automatic'}-{layout}",
)
@pytest.mark.parametrize("return_lse", [False, True])
def test_opcheck(explicit, layout, return_lse, rng):
    cfg = VARLEN_CONFIGS[0]
    config = cfg.short_form() if explicit else ""  # "": the automatic choice
    varlen = Varlen(*LENGTHS["tiny"], helpers.VARLEN_LAYOUTS[layout])
    inputs = varlen_problem(varlen, causal=True, alibi="per_batch_head").make(cfg, rng)
    args = (inputs.q, inputs.k, inputs.v, config, True, None, [-1, 0], 0.0, inputs.kwargs["alibi_slopes"], return_lse)
    varlen = varlen_arguments(inputs)
    torch.library.opcheck(torch.ops.flash_attention.forward.default, args, varlen)
    torch.library.opcheck(torch.ops.flash_attention.forward_out.default, (*args, nan_like(inputs.q)), varlen)


# ----------------------------------------------------------------------------------------------
# Nested jagged tensors through scaled_dot_product_attention


def jagged(values: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """(batch, heads, jagged seq, d) from packed (total, heads, d) values: PyTorch's SDPA layout."""
    return torch.nested.nested_tensor_from_jagged(values, offsets).transpose(1, 2)


NESTED_LENGTHS = ((1, 37, 128, 200, 511), (64, 5, 300, 1, 129))


@gpu
@varlen_cases("dtype, d_head", automatic_shapes(), shape_id)
@pytest.mark.parametrize(
    "is_causal, cross", [(False, False), (True, False), (False, True)], ids=["self", "self_causal", "cross"]
)
def test_nested_jagged_tensors_match_pytorch(dtype, d_head, is_causal, cross, rng):
    """Our SDPA on nested jagged tensors against PyTorch's on the same tensors (the criterion with
    its float32 and input-dtype results) and against the per-sequence reference. is_causal only
    with equal query and key lengths per sequence, where its top-left mask is the bottom-right one."""
    lengths_q = NESTED_LENGTHS[0]
    lengths_k = NESTED_LENGTHS[1] if cross else lengths_q
    offsets_q, offsets_k = (cu_seqlens_of(lengths, dtype=torch.int64) for lengths in (lengths_q, lengths_k))
    q = helpers.random_tensor((sum(lengths_q), 4, d_head), dtype, rng)
    k, v = (helpers.random_tensor((sum(lengths_k), 4, d_head), dtype, rng) for _ in range(2))
    nested = (jagged(q, offsets_q), jagged(k, offsets_k), jagged(v, offsets_k))

    out = flash_attention.scaled_dot_product_attention(*nested, is_causal=is_causal)
    assert out.is_nested and torch.equal(out.offsets().to(offsets_q.dtype), offsets_q)
    values = out.transpose(1, 2).values()
    ref32, ref16 = (
        torch.nn.functional.scaled_dot_product_attention(*(t.to(kind) for t in nested), is_causal=is_causal)
        .transpose(1, 2).values().float()
        for kind in (torch.float32, dtype)
    )  # fmt: skip
    error, bound = (values.float() - ref32).abs().max().item(), 2 * (ref16 - ref32).abs().max().item() + 1e-5
    assert error <= bound, f"max error {error:.3g} against PyTorch's SDPA exceeds {bound:.3g}"
    helpers.assert_matches_reference(
        values, q, k, v, causal=is_causal, cu_seqlens_q=offsets_q.int(), cu_seqlens_k=offsets_k.int(),
        max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k),
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Checks that need the build but no GPU (CPU and meta tensors)


def _cpu_call(**changes):
    """A packed call on CPU tensors (two sequences), with ``changes`` to its keywords."""
    cfg = flash_attention.compiled_configs()[0]
    dtype = cfg.dtype.to_torch_dtype()
    q = torch.randn(10, 2, cfg.d_head).to(dtype)
    cu_seqlens = torch.tensor([0, 4, 10], dtype=torch.int32)
    keywords = {"cu_seqlens_q": cu_seqlens, "cu_seqlens_k": cu_seqlens, "max_seqlen_q": 6, "max_seqlen_k": 6, **changes}
    return lambda: flash_attention.forward(cfg, q, q, q, **keywords)


@needs_build
@pytest.mark.parametrize(
    "changes, error, name",
    [
        ({"max_seqlen_q": 6.0}, TypeError, "max_seqlen_q"),
        ({"max_seqlen_k": "6"}, TypeError, "max_seqlen_k"),
        ({"max_seqlen_k": -1}, ValueError, "max_seqlen_k"),
        ({"cu_seqlens_q": [0, 4, 10]}, TypeError, "cu_seqlens_q"),
        ({"seqused_k": (4, 6)}, TypeError, "seqused_k"),
    ],
    ids=["max_seqlen_q_float", "max_seqlen_k_string", "max_seqlen_k_negative", "cu_seqlens_q_list", "seqused_k_tuple"],
)
def test_argument_types_and_values_are_checked_before_the_tensors(changes, error, name):
    with pytest.raises(error, match=f"^{name}: "):
        _cpu_call(**changes)()


def _meta(shape, dtype=torch.float16):
    return torch.empty(shape, dtype=dtype, device="meta")


@needs_build
def test_packed_varlen_shapes_are_checked():
    cu_seqlens = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^qkv: "):
        flash_attention.flash_attn_varlen_qkvpacked_func(_meta((8, 2, 1, 64)), cu_seqlens, 8)
    with pytest.raises(ValueError, match=r"^kv: "):
        flash_attention.flash_attn_varlen_kvpacked_func(
            _meta((8, 1, 64)), _meta((8, 3, 1, 64)), cu_seqlens, cu_seqlens, 8, 8
        )


@needs_build
def test_varlen_dropout_is_not_implemented():
    q, cu_seqlens = _meta((8, 1, 64)), torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flash_attention.flash_attn_varlen_func(q, q, q, cu_seqlens, cu_seqlens, 8, 8, dropout_p=0.1)


# ----------------------------------------------------------------------------------------------
# The per-sequence reference itself (CPU, torch only)


def cpu_tensors(seed: int, *shapes, dtype=torch.float16):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator).to(dtype) for shape in shapes]


def test_reference_of_equal_lengths_is_the_dense_reference(seed):
    batch, seqlen, heads, d_head = 3, 13, 4, 16
    q, k, v = cpu_tensors(seed, *[(batch, seqlen, heads, d_head)] * 3)
    slopes = torch.rand(batch, heads, generator=torch.Generator().manual_seed(seed))
    semantics = dict(causal=True, window_size=(4, -1), softcap=5.0, alibi_slopes=slopes)
    dense = FloatReference(q, k, v, **semantics)
    cu_seqlens = torch.arange(0, (batch + 1) * seqlen, seqlen, dtype=torch.int32)
    packed = reference_for_call(
        *(t.flatten(0, 1) for t in (q, k, v)), cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens,
        max_seqlen_q=seqlen, max_seqlen_k=seqlen, **semantics,
    )  # fmt: skip
    assert isinstance(packed, VarlenReference)
    assert torch.allclose(packed.ref32, dense.ref32.flatten(0, 1), atol=1e-6)
    assert torch.allclose(packed.lse, dense.lse.transpose(0, 1).flatten(1), atol=1e-5)
    assert packed.compare(dense.ref32.flatten(0, 1)).passed
    assert packed.compare_lse(dense.lse.transpose(0, 1).flatten(1)).passed


def test_reference_of_slots_is_the_reference_of_the_used_rows(seed):
    """4-D slots with leftpad and seqused hold the same sequences as a packed batch of their used rows."""
    lengths_q, lengths_k, left_q, left_k = (3, 0, 7), (5, 2, 1), (2, 5, 0), (0, 3, 6)
    q, k, v = cpu_tensors(seed, (3, 9, 2, 16), (3, 8, 1, 16), (3, 8, 1, 16))
    semantics = dict(causal=True, alibi_slopes=torch.tensor([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]))
    int32 = lambda values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
    slots = reference_for_call(
        q, k, v, seqused_q=int32(lengths_q), seqused_k=int32(lengths_k), leftpad_q=int32(left_q),
        leftpad_k=int32(left_k), **semantics,
    )  # fmt: skip
    def used(t, lengths, left):
        return torch.cat([t[b, left[b] : left[b] + n] for b, n in enumerate(lengths)])

    packed_k, packed_v = used(k, lengths_k, left_k), used(v, lengths_k, left_k)
    cu_q, cu_k = (cu_seqlens_of(lengths, device="cpu") for lengths in (lengths_q, lengths_k))
    packed = reference_for_call(
        used(q, lengths_q, left_q), packed_k, packed_v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        max_seqlen_q=max(lengths_q), max_seqlen_k=max(lengths_k), **semantics,
    )  # fmt: skip
    assert slots.lse_shape == (3, 2, 9) and packed.lse_shape == (2, sum(lengths_q))
    rows = torch.cat([torch.arange(b * 9 + left_q[b], b * 9 + left_q[b] + n) for b, n in enumerate(lengths_q)])
    assert torch.equal(slots.ref32[rows], packed.ref32) and torch.equal(slots.lse[:, rows], packed.lse)
    outside = torch.ones(27, dtype=torch.bool)
    outside[rows] = False
    assert (slots.ref32[outside] == 0).all() and (slots.lse[:, outside] == math.inf).all()
    # The comparisons take the call's 4-D layout.
    out = slots.ref32.view(3, 9, 2, 16)
    assert slots.compare(out).passed and slots.compare_lse(slots.lse.view(2, 3, 9).transpose(0, 1)).passed


def test_reference_criteria_reject_wrong_results(seed):
    lengths_q, lengths_k = (4, 0, 6, 3), (5, 2, 6, 0)
    q, k, v = cpu_tensors(seed, (13, 2, 16), (13, 1, 16), (13, 1, 16))
    cu_q, cu_k = (cu_seqlens_of(lengths, device="cpu") for lengths in (lengths_q, lengths_k))
    keywords = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=6, max_seqlen_k=6, causal=True)
    reference = reference_for_call(q, k, v, **keywords)
    assert reference.compare(reference.ref32).passed and reference.compare_lse(reference.lse).passed
    # The whole packed batch as one sequence: attention across sequences.
    across = FloatReference(q[None], k[None], v[None], causal=True)
    assert not reference.compare(across.ref32[0]).passed
    # Two sequences' outputs swapped (the last sequence has no key: its rows are 0).
    swapped = reference.ref32.clone()
    swapped[:3], swapped[4:7] = reference.ref32[4:7], reference.ref32[:3]
    assert not reference.compare(swapped).passed
    assert "sequence 0" in reference.compare(swapped).describe()
    assert not reference.compare_lse(reference.lse + 1e-2).passed
    assert not reference.compare_lse(reference.lse[:, 1:]).passed
    # The rows of the sequence without keys must be exactly 0.
    assert (reference.outputs_without_keys(reference.ref32) == 0).all()
    assert reference.outputs_without_keys(reference.ref32).numel() == 3 * 2 * 16
    # With seqused, a row outside every sequence must be 0 and its lse +inf.
    used = reference_for_call(q, k, v, **keywords, seqused_q=torch.tensor([3, 0, 6, 3], dtype=torch.int32))
    assert used.compare(used.ref32).passed
    leaked = used.ref32.clone()
    leaked[3] = 1.0  # the unused fourth row of the first slot
    assert not used.compare(leaked).passed and used.compare(leaked, sequences=[0, 1, 2, 3]).passed
    finite = used.lse.clone()
    finite[:, 3] = 0.0
    assert not used.compare_lse(finite).passed


@pytest.mark.parametrize(
    "keywords, argument",
    [
        ({"cu_seqlens_q": [0, 5, 3]}, "cu_seqlens_q"),
        ({"cu_seqlens_k": [0, 4, 20]}, "cu_seqlens_k"),
        ({"seqused_q": [6, 2]}, "seqused_q"),
        ({"leftpad_k": [-1, 0]}, "leftpad_k"),
        ({"max_seqlen_q": 4}, "max_seqlen_q"),
    ],
    ids=["decreasing", "past_total", "seqused_past_slot", "negative_leftpad", "longer_than_max_seqlen"],
)
def test_reference_refuses_contents_that_break_the_rules(keywords, argument, seed):
    q, k, v = cpu_tensors(seed, (8, 1, 16), (8, 1, 16), (8, 1, 16))
    call = dict(cu_seqlens_q=[0, 5, 8], cu_seqlens_k=[0, 4, 8], max_seqlen_q=5, max_seqlen_k=4)
    call.update(keywords)
    as_tensor = lambda value: torch.tensor(value, dtype=torch.int32) if isinstance(value, list) else value  # noqa: E731
    tensors = {name: as_tensor(value) for name, value in call.items()}
    with pytest.raises(ValueError, match=f"^{argument}: "):
        reference_for_call(q, k, v, **tensors)


def test_sequence_rows_of_a_packed_call():
    q, k, v = cpu_tensors(0, (10, 1, 16), (7, 1, 16), (7, 1, 16))
    int32 = lambda values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
    reference = reference_for_call(
        q, k, v, cu_seqlens_q=int32([1, 4, 4, 9]), cu_seqlens_k=int32([0, 2, 5, 7]), max_seqlen_q=4, max_seqlen_k=3,
        seqused_q=int32([2, 0, 4]), leftpad_k=int32([1, 0, 2]),
    )  # fmt: skip
    assert reference.sequences == [
        SequenceRows(0, range(1, 3), range(1, 2)),
        SequenceRows(1, range(4, 4), range(2, 5)),
        SequenceRows(2, range(4, 8), range(7, 7)),
    ]
    assert reference.outside.tolist() == [True, False, False, True, False, False, False, False, True, True]
