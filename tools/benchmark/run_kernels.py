#!/usr/bin/env python3
"""Runs compiled forward-kernel configurations (and PyTorch SDPA references) at one shape, so a
profiler such as Nsight Compute can measure them:

    ncu --metrics gpu__time_duration.sum python tools/benchmark/run_kernels.py 4096 128 --n_runs 3

Every selected compiled configuration with this dtype and d_head that has the kernel variant the
problem needs (--causal or not; masked tails where SEQ_LEN is not a multiple of its block sizes)
runs N times on the same random inputs, then each chosen SDPA backend N times. --seqlen_k gives
the keys and values their own length (default SEQ_LEN), so a query tail and a key tail can be
profiled apart. Batch and heads default to the benchmark shape of SEQ_LEN (batch 16, at most 64Ki tokens: 16/16/16/16/8/4 for seq
512..16384; heads * d_head = 2048: 16 heads for d_head 128, 32 for d_head 64); --heads_kv groups
the query heads over fewer key/value heads (GQA).

--peer fa3 (or fa4) runs that peer's flash_attn_func N times instead, and nothing else of ours or
SDPA's: a profile of this process then holds the peer's kernels and the inputs' fills alone, so
they need no recognising by name (ncu_bench.py --peers). A peer that is not installed or cannot
run the shape is reported and the exit status is 1.

--check also compares each configuration's output with a float32 reference with the same mask
(the tests' criterion: max|out - ref32| <= 2 * max|ref16 - ref32| + 1e-5 and relative norm error
< 1e-2; for e4m3 inputs tests/test_fp8.py's), prints the errors and exits with status 1 on any
mismatch. Leave it off under a profiler: the reference launches many kernels of its own.

--dtype e4m3 runs FP8 inputs (random normal values rounded to float8_e4m3fn) with descales of 1
((batch, heads_kv) float32), given to ours and to FA3 alike. The SDPA backends and FA4 take no
e4m3: a --reference is reported and left out, and --peer fa4 is refused (exit status 1).
"""

from __future__ import annotations

import argparse
import sys

import bench_common as common
from flash_helpers.reference import FloatReference, Fp8Reference

REFERENCE_CHOICES = ("none", *common.SDPA_REFERENCES, "all")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("seq_len", type=int, metavar="SEQ_LEN", help="sequence length")
    parser.add_argument(
        "d_head",
        type=int,
        choices=common.D_HEADS,
        metavar="D_HEAD",
        help=f"head dimension: {', '.join(map(str, common.D_HEADS))}",
    )
    parser.add_argument(
        "--kernels",
        help="configurations to run: short forms separated by ';', or a set name (prog, progall, tune, all, "
        "'B_r,B_c'); default: the KERNELS environment variable, else every compiled configuration",
    )
    parser.add_argument("--seqlen_k", type=int, metavar="K", help="keys and values per sequence (default: SEQ_LEN)")
    parser.add_argument("--n_runs", type=int, default=1, metavar="N", help="runs of each kernel (default: 1)")
    parser.add_argument("--batch", type=int, help="batch size (default: the benchmark shape's)")
    parser.add_argument("--heads", type=int, help="query heads (default: the benchmark shape's)")
    parser.add_argument("--heads_kv", type=int, help="key/value heads, dividing --heads (default: --heads)")
    common.add_dtype_argument(parser, default="fp16")
    parser.add_argument("--causal", action="store_true", help="with the causal mask (bottom-right aligned)")
    parser.add_argument(
        "--reference",
        choices=REFERENCE_CHOICES,
        default="flash",
        help="SDPA backend(s) to run as well (default: flash)",
    )
    parser.add_argument(
        "--check", action="store_true", help="compare each configuration's output with a float32 reference"
    )
    parser.add_argument(
        "--peer",
        choices=tuple(common.PEER_LOADERS),
        help="run this peer's flash_attn_func instead of our configurations and the SDPA references",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    args = parser.parse_args(argv)
    for name in ("seq_len", "seqlen_k", "n_runs", "batch", "heads", "heads_kv"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"{name} must be positive, got {value}")
    args.seqlen_k = args.seqlen_k or args.seq_len
    heads = args.heads or common.heads_for_d_head(args.d_head)
    if args.heads_kv is not None and heads % args.heads_kv:
        parser.error(f"--heads_kv must divide the {heads} query heads, got {args.heads_kv}")
    if args.peer and args.check:
        parser.error("--check compares our configurations; --peer runs none of them")
    if args.causal:
        error = common.causal_lengths_error(args.seq_len, args.seqlen_k, args.reference)
        if error:
            parser.error(error)
    return args


def chosen_references(reference: str) -> list[str]:
    if reference == "all":
        return list(common.SDPA_REFERENCES)
    return [] if reference == "none" else [reference]


def run_peer(peer: str, problem: common.Problem, args: argparse.Namespace) -> int:
    """Runs the peer's flash_attn_func n_runs times on the problem's random inputs."""
    import torch

    dtype = common.dtype_from_name(args.dtype)
    refusal = common.dtype_refusal(peer, dtype)
    if refusal:
        print(f"{peer} cannot run {args.dtype}: {refusal}", file=sys.stderr)
        return 1
    function, missing = common.PEER_LOADERS[peer]("flash_attn_func")
    if function is None:
        print(f"{peer} is missing: {missing}", file=sys.stderr)
        return 1
    q, k, v = common.make_inputs(problem, dtype, seed=args.seed)
    print(f"{problem.describe()}, {args.dtype}: {peer} ({function.__module__})")
    call = common.peer_call(function, q, k, v, args.causal, **common.make_descales(problem, dtype))
    try:
        for _ in range(args.n_runs):
            call()
        torch.cuda.synchronize()
    except Exception as error:  # a peer's own checks raise what they like (RuntimeError, ValueError, ...)
        print(f"{peer} cannot run this shape: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    print(f"ran {args.n_runs}x {peer}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not common.gpu_available():
        print(common.no_gpu_message("run_kernels.py"), file=sys.stderr)
        return 1

    import torch

    import flash_attention

    dtype = common.dtype_from_name(args.dtype)
    batch = args.batch or common.batch_for_seq_len(args.seq_len)
    heads = args.heads or common.heads_for_d_head(args.d_head)
    heads_kv = args.heads_kv or heads
    problem = common.Problem(batch, args.seq_len, args.seqlen_k, heads, heads_kv, args.d_head, args.causal)
    if args.peer:
        return run_peer(args.peer, problem, args)
    try:
        selected = common.select_configs(args.kernels)
    except common.ConfigSelectionError as error:
        print(error, file=sys.stderr)
        return 1
    configs = common.fitting_configs(selected, dtype, problem)
    references = []
    for name in chosen_references(args.reference):
        refusal = common.dtype_refusal(name, dtype)
        if refusal:
            print(f"{common.SDPA_REFERENCES[name]} cannot run {args.dtype}: {refusal}", file=sys.stderr)
        else:
            references.append(name)
    skipped = len(selected) - len(configs)
    print(
        f"{problem.describe()}, {args.dtype}: {len(configs)} configuration(s), {skipped} skipped "
        "(other dtype or d_head, or no kernel for this mask and length)"
    )
    if not configs and not references:
        print("nothing to run: no selected configuration fits this shape and no SDPA reference runs", file=sys.stderr)
        return 1

    q, k, v = common.make_inputs(problem, dtype, seed=args.seed)
    descales = common.make_descales(problem, dtype)
    reference = None
    if args.check and configs:
        reference_type = Fp8Reference if dtype in common.FP8_DTYPES else FloatReference
        reference = reference_type(q, k, v, causal=args.causal, **descales)
    o = common.make_output(q)
    comparisons = {}
    for cfg in configs:
        if reference is not None:
            # Poisoned with NaN so that any element the kernel fails to write shows in the check.
            o.fill_(float("nan"))
        for _ in range(args.n_runs):
            flash_attention.forward(cfg, q, k, v, o, causal=args.causal, **descales)
        print(f"ran {args.n_runs}x {cfg.short_form()}")
        if reference is not None:
            comparisons[cfg.short_form()] = reference.compare(o)

    for name in references:
        # A backend that does not support this GPU or shape is only reported: the references are
        # there for comparison, our configurations are what is under test.
        try:
            call = common.sdpa_call(name, q, k, v, args.causal)  # the first of the N runs
            with common.use_sdpa_reference(name):
                for _ in range(args.n_runs - 1):
                    call.run()
        except RuntimeError as error:
            print(f"{common.SDPA_REFERENCES[name]} cannot run this shape: {error}", file=sys.stderr)
            continue
        print(f"ran {args.n_runs}x {common.SDPA_REFERENCES[name]}")
    torch.cuda.synchronize()

    if not comparisons:
        return 0
    headers = ["config", "max error", "allowed", "rel. norm error", "result"]
    table = [
        [name, c.max_error, c.tolerance, c.relative_norm_error, "ok" if c.passed else "MISMATCH"]
        for name, c in comparisons.items()
    ]
    print(common.format_table(headers, table, float_formats={1: ".3g", 2: ".3g", 3: ".3g"}))
    mismatches = [name for name, c in comparisons.items() if not c.passed]
    if mismatches:
        print(f"{len(mismatches)} configuration(s) do not match the float32 reference", file=sys.stderr)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
