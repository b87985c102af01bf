#!/usr/bin/env python3
"""Runs every compiled kernel (configuration and problem variant) once, on a small problem that
needs exactly that kernel, and checks each result against the float32 reference: what
tools/sanitize.sh runs under compute-sanitizer.

The problems are the tests' (tests/helpers.py, problem_for_variant): lengths that end in partial
blocks for the masked-tails variants, causal and local masks with more queries than keys (whole
query blocks and parts of blocks attend no key), softcap with per-(batch, head) ALiBi slopes for
the score-modifying variants, and grouped heads (2 query heads per key/value head; multicast
configurations also 3, which their pairs split differently), with lse. The varlen kernels get a
packed batch (cu_seqlens) of five sequences of their own lengths: no queries,
one query and one key, partial last blocks with more queries than keys and fewer, and queries
without keys; the last sequence ends the tensors, so a read past its end leaves them. They run the
batch a second time with its keys and values on pages of 16 rows in random order (block_table
entries past a sequence's pages point past the pool), which checks the paged loads; those of a
family that splits the keys split that call in 3 (num_splits), which checks the split's partial
results, and then run a decode step: 3 queries per sequence whose 2 grouped heads are packed as
rows (rows_per_query), against slots of keys of which seqused_k are used (one sequence uses none),
split in 3, which checks the packed queries' masks and the combine. Every compiled configuration
is run, the decoding ones (compiled with their varlen variants alone, and those of an FP8 cache:
e4m3 k and v with descales beside 16-bit q) and the e4m3 ones (FP8 inputs, factors of 1, a bfloat16
output) too; those with V_transposed_copy also with a head 32 below theirs, read in place (views of the
inputs' first columns). Last, flash_attn_with_kvcache's append kernel, once per dtype and once into an FP8
cache (run_append).

    python3 tools/sanitize_cases.py [--kernels SELECTION] [--no-check] [--list]

Exit status 1 if a call fails or a result differs from the reference. Needs a CUDA GPU (--list
does not).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "py"), str(ROOT / "tests")]

import torch  # noqa: E402

import flash_attention  # noqa: E402
import helpers  # noqa: E402
from flash_helpers.kernel_sets import KERNELS_ENV, get_kernel_configs  # noqa: E402

# Small grids, so the slowest tool (racecheck) stays quick: batch 2 (the ALiBi batch stride
# matters), 2 query heads sharing 1 key/value head.
BATCH = 2
HEADS = (2, 1)
# A multicast pair's blocks take one query block of two heads of such a group; with an odd group they
# take two query blocks of one head, which multicast configurations run as well.
ODD_GROUP_HEADS = (3, 1)
# The paged call's page size (vLLM's default); the families whose varlen kernels split the keys
# (their FamilyInfo::splits_keys), and how many splits their paged call and decode step take.
PAGE_SIZE = 16
SPLITTING_FAMILIES = ("sm80",)
PAGED_SPLITS = 3
# The decode step's queries per sequence and each sequence's used keys, in slots of DECODE_SLOT keys.
DECODE_QUERIES = 3
DECODE_KEYS = (77, 0)
DECODE_SLOT = 100
# New rows per sequence of the KV cache append's step.
APPEND_ROWS = 3
# V_transposed_copy configurations also run a head this much below theirs: the copy's rows end at the call's.
HEAD_CUT = 32


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--kernels",
        help=f"configurations to run, as for the tests: short forms separated by ';', or a set name "
        f"(default: {KERNELS_ENV} if set, else every compiled one); intersected with the compiled ones",
    )
    parser.add_argument("--no-check", dest="check", action="store_false", help="skip the comparison with the reference")
    parser.add_argument("--list", action="store_true", help="print the kernels and their problems, run nothing")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    return parser.parse_args(argv)


def selected_kernels(selection: str | None) -> list[tuple]:
    # The compiled configurations this GPU runs, the decoding and e4m3 ones too, then those the
    # selection names.
    configs = helpers.configs_under_test(decoding=True, fp8=True)
    if selection:
        wanted = set(get_kernel_configs(selection))
        configs = [cfg for cfg in configs if cfg in wanted]
    chosen = set(configs)
    return [(cfg, variant) for cfg, variant in flash_attention.compiled_kernels() if cfg in chosen]


def on_gpu(inputs: helpers.Inputs) -> helpers.Inputs:
    """``inputs`` on the GPU: the tensors, and the tensor keywords (ALiBi slopes, cu_seqlens)."""
    kwargs = {key: value.cuda() if isinstance(value, torch.Tensor) else value for key, value in inputs.kwargs.items()}
    return helpers.Inputs(inputs.q.cuda(), inputs.k.cuda(), inputs.v.cuda(), kwargs)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    kernels = selected_kernels(args.kernels)
    if not kernels:
        print("no compiled kernel is selected", file=sys.stderr)
        return 1
    problems = [(cfg, variant, helpers.problem_for_variant(cfg, variant, BATCH, HEADS)) for cfg, variant in kernels]
    if args.list:
        for cfg, variant, problem in problems:
            print(f"{cfg.short_form()} [{variant.describe()}]: {problem.describe()}")
        return 0
    if not torch.cuda.is_available():
        print("no CUDA GPU visible: the kernels need one", file=sys.stderr)
        return 1

    # Inputs are drawn on the host and copied over: initcheck sees a copy's writes, but not those
    # of PyTorch's kernels, which the kernel filter leaves uninstrumented.
    rng = torch.Generator().manual_seed(args.seed)
    failures = 0
    runs = 0
    for cfg, variant, problem in problems:
        label = f"{cfg.short_form()} [{variant.describe()}] {problem.describe()}"
        inputs = on_gpu(problem.make(cfg, rng))
        calls = [(inputs, label, inputs.k, inputs.v, inputs.kwargs)]
        if getattr(cfg, "multicast", False):
            odd = helpers.problem_for_variant(cfg, variant, BATCH, ODD_GROUP_HEADS)
            odd_inputs = on_gpu(odd.make(cfg, rng))
            calls.append((odd_inputs, f"{cfg.short_form()} [{variant.describe()}] {odd.describe()}", odd_inputs.k,
                          odd_inputs.v, odd_inputs.kwargs))
        if getattr(cfg, "V_transposed_copy", False):
            narrow = dataclasses.replace(inputs, q=inputs.q[..., :-HEAD_CUT], k=inputs.k[..., :-HEAD_CUT],
                                         v=inputs.v[..., :-HEAD_CUT])
            calls.append((narrow, f"{label}, d_head {cfg.d_head - HEAD_CUT}", narrow.k, narrow.v, narrow.kwargs))
        splits = cfg.family in SPLITTING_FAMILIES
        if variant.varlen:
            paged = f"{label}, paged" + (f" and split in {PAGED_SPLITS}" if splits else "")
            calls.append((inputs, paged, *paged_call(inputs, rng, PAGED_SPLITS if splits else 1)))
        if variant.varlen and splits:
            step = decode_step(cfg, inputs, rng)
            calls.append((step, f"{label}, a decode step of {DECODE_QUERIES} packed queries split in {PAGED_SPLITS}",
                          step.k, step.v, {**step.kwargs, "num_splits": PAGED_SPLITS}))
        for call in calls:
            runs += 1
            failures += not run_call(cfg, *call, check=args.check)
    for dtype, fp8_cache in ((torch.float16, False), (torch.bfloat16, False), (torch.bfloat16, True)):
        runs += 1
        failures += not run_append(dtype, rng, fp8_cache)
    print(f"{runs} calls of {len(problems)} kernels and the KV cache append run, {failures} failed", flush=True)
    return 1 if failures else 0


def paged_call(inputs: helpers.Inputs, rng, num_splits: int) -> tuple:
    """(k, v, keywords) of the packed batch ``inputs`` with its keys and values on pages
    (helpers.PagedCache), split over the keys in num_splits."""
    bounds = inputs.kwargs["cu_seqlens_k"].tolist()
    keys, values = ([t[start:end] for start, end in zip(bounds, bounds[1:])] for t in (inputs.k, inputs.v))
    cache = helpers.PagedCache.of(keys, values, PAGE_SIZE, rng)
    return cache.k, cache.v, {**inputs.kwargs, "block_table": cache.block_table, "num_splits": num_splits}


def decode_step(cfg, inputs: helpers.Inputs, rng) -> helpers.Inputs:
    """A decode step with the mask and softcap of ``inputs`` (no ALiBi: a slope per query head would
    keep the heads apart): DECODE_QUERIES queries per sequence, slots of DECODE_SLOT keys. q is a view
    whose queries lie a head further apart than their heads span, so a kernel that reads grouped
    rows in place finds them query by query."""
    dtype = cfg.dtype.to_torch_dtype()
    q_wide = helpers.random_tensor((len(DECODE_KEYS), DECODE_QUERIES, HEADS[0] + 1, cfg.d_head), dtype, rng)
    k, v = (helpers.random_tensor((len(DECODE_KEYS), DECODE_SLOT, HEADS[1], cfg.d_head), dtype, rng) for _ in range(2))
    kwargs = {key: inputs.kwargs[key] for key in ("causal", "window_size", "softcap") if key in inputs.kwargs}
    kwargs["seqused_k"] = torch.tensor(DECODE_KEYS, dtype=torch.int32)
    if inputs.k.dtype == torch.float8_e4m3fn:  # an FP8 cache's kernel: its keys and values e4m3 too
        k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
        for name in ("k_descale", "v_descale"):
            kwargs[name] = torch.rand((len(DECODE_KEYS), HEADS[1]), generator=rng) + 0.5
    step = on_gpu(helpers.Inputs(q_wide, k, v, kwargs))
    return dataclasses.replace(step, q=step.q[:, :, : HEADS[0]])


def run_append(dtype, rng, fp8_cache: bool) -> bool:
    """flash_attn_with_kvcache's append kernel (its operator), rotating by a float32 table: APPEND_ROWS new rows per
    sequence on a paged cache whose tables point past the pool where the last sequence's new rows
    run past its pages, and rotary positions past the table's end (all clamped); checks that each
    new value row is where its sequence's pages put it (v is not rotated), with an FP8 cache
    quantised by its descales."""
    d_head, pages, page_size = 64, 4, PAGE_SIZE
    cache_dtype = torch.float8_e4m3fn if fp8_cache else dtype
    q = helpers.random_tensor((2, APPEND_ROWS, HEADS[0], d_head), dtype, rng)
    k_cache, v_cache = (helpers.random_tensor((pages, page_size, HEADS[1], d_head), cache_dtype, rng) for _ in range(2))
    k, v = (helpers.random_tensor((2, APPEND_ROWS, HEADS[1], d_head), dtype, rng) for _ in range(2))
    descale = torch.rand((2, HEADS[1]), generator=rng) + 0.5
    angles = torch.rand((20, d_head // 4), generator=rng)
    table = torch.tensor([[0, 1], [2, pages + 5]], dtype=torch.int32)
    seqlens = torch.tensor([5, 2 * page_size - 2], dtype=torch.int32)
    q, k_cache, v_cache, k, v, cos, sin, table, seqlens, descale = (
        t.cuda() for t in (q, k_cache, v_cache, k, v, angles.cos(), angles.sin(), table, seqlens, descale)
    )
    descales = (descale, descale) if fp8_cache else (None, None)
    cache_kind = "an FP8 cache" if fp8_cache else "paged"
    label = f"KV cache append ({str(dtype).removeprefix('torch.')}, {cache_kind}, rotary, clamped)"
    try:
        # The operator alone: the attention after it would read lengths summed by a PyTorch kernel,
        # whose writes initcheck does not see.
        flash_attention._C.append_to_cache(
            q, k_cache, v_cache, k, v, seqlens, None, table, cos, sin, True, True, *descales
        )
        torch.cuda.synchronize()
    except Exception as error:  # as run_call
        print(f"{label}: FAILED: {type(error).__name__}: {error}", flush=True)
        return False
    capacity = table.shape[1] * page_size
    # Compared on the host: a comparison on the GPU would read a PyTorch kernel's result, whose
    # writes initcheck does not see.
    v_cache, v, table, descale = v_cache.cpu(), v.cpu(), table.cpu(), descale.cpu()
    if fp8_cache:  # the stored rows as bytes, against the quantised new values' (torch rounds as the kernel)
        v = (v.float() / descale[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
        v_cache = v_cache.view(torch.uint8)
    passed = True
    for b, start in enumerate(seqlens.tolist()):
        for i in range(APPEND_ROWS):
            position = start + i
            if position >= capacity - 1:  # rows clamped onto the last one: any of them may land there
                continue
            page = min(int(table[b, position // page_size]), pages - 1)
            passed &= torch.equal(v_cache[page, position % page_size], v[b, i])
    print(f"{label}: {'ok' if passed else 'MISPLACED ROWS'}", flush=True)
    return passed


def run_call(cfg, inputs: helpers.Inputs, label: str, k, v, keywords: dict, check: bool) -> bool:
    """One call on q and these k, v and keywords, checked against the reference of ``inputs`` (the
    same sequences); prints the outcome, returns whether it passed."""
    try:
        out, lse = flash_attention.forward(cfg, inputs.q, k, v, **keywords, return_lse=True)
        torch.cuda.synchronize()
    except Exception as error:  # a launch failure (or a context a sanitizer tore down): report, go on
        print(f"{label}: FAILED: {type(error).__name__}: {error}", flush=True)
        return False
    status, passed = "ran", True
    if check:
        reference = inputs.reference()
        output, log_sum_exp = reference.compare(out), reference.compare_lse(lse)
        passed = output.passed and log_sum_exp.passed
        status = "ok" if passed else f"MISMATCH: {output.describe()}; {log_sum_exp.describe()}"
    print(f"{label}: {status}", flush=True)
    return passed


if __name__ == "__main__":
    sys.exit(main())
