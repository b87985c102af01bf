#!/usr/bin/env python3
"""Compares the compiled forward kernels with PyTorch's SDPA (FLASH, CUDNN and EFFICIENT backends)
and the peers FlashAttention-3 and FlashAttention-4.

For each dtype, d_head, mask (--causal) and sequence length, at the benchmark shape (batch 16,
capped at 64Ki tokens: 16/16/16/16/8/4 for seq 512/1024/2048/4096/8192/16384; heads * d_head =
2048, or the nearest below: 16 heads for d_head 128, 32 for 64, 21 for 96; --gqa-ratio R query
heads per key/value head; --shape llama70b: batch 2, 64 query heads over 8 key/value heads of 128,
the grouped-query problem the peers publish figures for),
times every selected compiled configuration that has the kernel variant the problem needs (any
length fits a configuration compiled with masked tails), then automatic configuration ("auto":
flash_attn_func, the configuration chosen per call from the dispatch table), then SDPA with each
backend and each peer's flash_attn_func (FA3: the fa3-fwd package's fa3_fwd_interface, which runs
bfloat16 and e4m3; FA4: the flash-attn-4 package's flash_attn.cute, its SM90 path on Hopper), on the
same inputs in the same run; the peers' wheels are installed apart, as decode_bench.py says. Time is
the median of triton.testing.do_bench (of CUDA-event timings if triton is missing); TFLOP/s =
4 * batch * heads_q * seq^2 * d_head / time, half of that with the causal mask, as FlashAttention
counts. With --rounds R every shape is measured R times, round
robin over the whole list, and each row keeps its median time: the GPU's clock drifts with its
power and temperature over a run, and rounds spread that drift over every implementation and
length alike instead of letting it favour whichever was timed first. At each shape and round the
implementations are timed in a new seeded random order (bench_common.timing_order): under the
power limit one timed right after a slower one starts at a higher clock. With --sustain-s S each
timing is instead the mean of back-to-back calls over S seconds after a warm-up as long: every
implementation at the steady clock its own power draw leaves, as in a training or serving loop
(slower: about 2 S seconds per implementation and shape).

Prints one table per (dtype, d_head, mask) with the best configuration per seq and its ratios to
the FLASH and CUDNN backends and to each peer, then the harmonic means of those ratios, for each
length that is not a multiple of 128 (with its next multiple among the lengths) how much more time
per FLOP ours takes there than at the multiple, where a backend or peer was missing and why, and
auto's ratio to the best
configuration: "auto/ours" compares its own timing with the best's (run-to-run noise and the
call's overhead included), "choice/ours" the chosen configuration's timing among ours with the
best's (auto is not counted as a configuration). A backend or peer that cannot be imported or
cannot run a shape is shown as '-', and a line under the table says why; with GQA, a backend that
rejects enable_gqa is given k and v with repeated heads, and the table says so. The best
configuration's output is checked against the FLASH backend's once per shape; a mismatch is
reported and makes the exit status 1. A head size without configurations of its own (--d-heads
takes any multiple of 8 up to 256, e.g. 72) is timed through automatic configuration alone, which
serves it with a larger compiled head size; its TFLOP/s count the call's head size, the useful work.
With --larger-heads, every selected configuration of a larger head size is timed on it too (each
serves it in place, with zero columns past the call's), so that which head sizes deserve blocks of
their own and which should round up is measured in one run.

--dtypes e4m3 times FP8 inputs: random normal values (drawn in bfloat16) rounded to float8_e4m3fn,
with descales of 1 ((batch, heads_kv) float32) given to ours and to FA3 alike, by FlashAttention-3's
keywords (our output is bfloat16, as FA3's); the FLOPs are counted as for 16-bit inputs. The SDPA backends and
FA4 take no e4m3: they are shown as missing, and our output goes unchecked here (run_kernels.py
--dtype e4m3 --check checks it against the FP8 reference).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import math
import sys

import bench_common as common

# The SDPA backends timed, in table order; the ours/<backend> ratios; the backend the check uses.
REFERENCES = ("flash", "cudnn", "efficient")
RATIO_REFERENCES = ("flash", "cudnn")
CHECK_REFERENCE = "flash"
# Automatic configuration: flash_attn_func, which picks its configuration per call (choose_config),
# timed as a model calls it, beside the best configuration chosen by hand.
AUTO = "auto"
# The peers timed, in table order, with their flash_attn_func's loader.
PEERS = common.PEER_LOADERS
# The rows of a backend or peer where it could not run: the config field says why, after this prefix.
MISSING = "missing: "


@dataclasses.dataclass
class Group:
    """The problems of one table: one dtype, d_head and mask, every sequence length."""

    dtype_name: str
    d_head: int
    causal: bool
    problems: list[common.Problem]


def groups(args: argparse.Namespace) -> list[Group]:
    def problems(d_head: int, causal: bool) -> list[common.Problem]:
        return [common.shape_problem(args.shape, s, d_head, causal, args.gqa_ratio) for s in args.seq_lens]

    masks = common.causal_values(args.causal)
    return [
        Group(dtype_name, d_head, causal, problems(d_head, causal))
        for dtype_name, d_head, causal in itertools.product(args.dtypes, args.d_heads, masks)
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--d-heads",
        nargs="+",
        type=common.served_d_head,
        default=[128],
        help="head sizes, multiples of 8 up to 256; one without configurations of its own (e.g. 72) times "
        "automatic configuration alone (and, with --larger-heads, the larger ones), which runs it on a larger "
        "compiled head size (default: 128)",
    )
    common.add_dtype_argument(parser, default=list(common.DTYPE_NAMES))
    parser.add_argument(
        "--seq-lens",
        nargs="+",
        type=common.positive_int,
        default=list(common.SEQ_LENS),
        metavar="SEQ",
        help="sequence lengths, any positive values, e.g. 1000 4000 8000 (default: 512 ... 16384)",
    )
    common.add_causal_argument(parser, default="off")
    parser.add_argument(
        "--gqa-ratio",
        type=common.positive_int,
        default=1,
        metavar="R",
        help="query heads per key/value head (grouped-query attention): heads_kv = heads_q / R, where heads_q "
        "is the benchmark shape's (default: 1)",
    )
    common.add_shape_argument(parser, "the benchmark shape above")
    parser.add_argument(
        "--kernels",
        help="configurations to time: short forms separated by ';', or a set name (prog, progall, tune, all, "
        "'B_r,B_c'); default: the KERNELS environment variable, else every compiled configuration",
    )
    parser.add_argument(
        "--larger-heads",
        action="store_true",
        help="also time each selected configuration of a larger head size, which serves the call's in place "
        "(zero columns past it), as automatic configuration does for a head size without configurations of its "
        "own: d_head 40 on d_head 48's and 64's blocks side by side, say",
    )
    parser.add_argument(
        "--rep-ms",
        type=float,
        default=common.DEFAULT_REP_MS,
        help="how long each timing repeats the call, in ms (default: %(default)g)",
    )
    common.add_sustain_argument(parser)
    parser.add_argument(
        "--rounds",
        type=common.positive_int,
        default=1,
        metavar="R",
        help="measure every shape R times, round robin over all of them, and keep each timing's median "
        "(default: %(default)s)",
    )
    parser.add_argument("--csv", metavar="PATH", help="also write every timing (every configuration) to PATH")
    parser.add_argument(
        "--plot",
        metavar="PATH",
        help="also draw TFLOP/s against seq per (dtype, d_head, mask) to the PNG file PATH: our best configuration "
        "and each SDPA backend (needs matplotlib)",
    )
    parser.add_argument(
        "--check-gpu", action="store_true", help="only check that a CUDA GPU is visible (exit status 0 if so)"
    )
    args = parser.parse_args(argv)
    shape_error = common.shape_error(args.shape, args.d_heads, args.gqa_ratio)
    if shape_error:
        parser.error(shape_error)
    if sustain_error := common.sustain_error(args.sustain_s):
        parser.error(sustain_error)
    # The shapes are built here once so that a ratio not dividing some d_head's heads is a usage
    # error, not a failure halfway through the measurements.
    try:
        groups(args)
    except ValueError as error:
        parser.error(f"--gqa-ratio: {error}")
    return args


def implementation_name(reference: str) -> str:
    return f"sdpa_{reference}"


def peer_implementation(peer: str) -> str:
    return f"peer_{peer}"


def compared_implementation(name: str) -> str:
    """The rows' implementation of a REFERENCES or PEERS name."""
    return peer_implementation(name) if name in PEERS else implementation_name(name)


def compared_label(name: str) -> str:
    """The tables' label of a REFERENCES or PEERS name: SDPA FLASH, ..., FA3, FA4."""
    return name.upper() if name in PEERS else common.SDPA_REFERENCES[name]


def first_line(error: Exception) -> str:
    """Why a backend or peer could not run, for a table's line: the error's type and first line."""
    text = str(error)
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def load_peers() -> dict:
    """Each peer's flash_attn_func, or None, with why it is missing."""
    return {peer: load("flash_attn_func") for peer, load in PEERS.items()}


def benchmark_shape(
    dtype_name: str, problem: common.Problem, configs, timer, progress, round_index: int = 0, peers: dict | None = None
) -> tuple[list[common.TimingRow], str | None]:
    """Times our configurations, automatic configuration, SDPA and the peers (``load_peers``) on one
    problem, in the order ``common.timing_order`` gives for the round; returns the rows (in that
    order) and a correctness failure, if any."""
    import flash_attention

    dtype = common.dtype_from_name(dtype_name)
    q, k, v = common.make_inputs(problem, dtype)
    descales = common.make_descales(problem, dtype)
    o = common.make_output(q)
    forward = functools.partial(flash_attention.forward, causal=problem.causal, **descales)

    def row(implementation: str, config: str, time_ms: float) -> common.TimingRow:
        return common.timing_row(dtype_name, problem, implementation, config, time_ms)

    rows = []
    check_output = None
    peers = peers or {}
    # What to time: our configurations, then AUTO, then each SDPA reference and each peer by name.
    for item in common.timing_order([*configs, AUTO, *REFERENCES, *PEERS], round_index, (dtype_name, problem)):
        if item in (*REFERENCES, *PEERS) and (refusal := common.dtype_refusal(item, dtype)):
            rows.append(row(compared_implementation(item), MISSING + refusal, math.nan))
        elif item in PEERS:
            function, missing = peers.get(item, (None, "not loaded"))
            if function is not None:
                try:
                    call = common.peer_call(function, q, k, v, problem.causal, **descales)
                    rows.append(row(peer_implementation(item), "", timer(call)))
                except Exception as error:  # the peers raise their own types for what they do not run
                    missing = first_line(error)
                    progress.write(f"{item.upper()} cannot run {dtype_name}, {problem.describe()}: {missing}")
            if missing:
                rows.append(row(peer_implementation(item), MISSING + missing, math.nan))
        elif item == AUTO:
            choice = flash_attention.choose_config(q, k, causal=problem.causal)
            auto = functools.partial(flash_attention.flash_attn_func, q, k, v, causal=problem.causal, **descales)
            rows.append(row(AUTO, choice.config.short_form(), timer(auto)))
        elif item in REFERENCES:
            try:
                call = common.sdpa_call(item, q, k, v, problem.causal)
                with common.use_sdpa_reference(item):
                    rows.append(row(implementation_name(item), call.gqa, timer(call.run)))
            except RuntimeError as error:
                label = common.SDPA_REFERENCES[item]
                progress.write(f"{label} cannot run {dtype_name}, {problem.describe()}: {error}")
                rows.append(row(implementation_name(item), MISSING + first_line(error), math.nan))
            else:
                if item == CHECK_REFERENCE:
                    check_output = call.output
        else:
            rows.append(row("ours", item.short_form(), timer(functools.partial(forward, item, q, k, v, o))))
        progress.update()

    failure = None
    best = best_ours(rows)
    if check_output is not None:
        if best is not None:
            out, checked = forward(best.config, q, k, v), best.config
        else:  # a head size without configurations of its own: automatic configuration's output
            out, checked = flash_attention.flash_attn_func(q, k, v, causal=problem.causal), AUTO
        failure = common.flash_mismatch(out, check_output, dtype_name, f"{checked} at {problem.describe()}")
    return rows, failure


def best_ours(rows: list[common.TimingRow]) -> common.TimingRow | None:
    """Our fastest configuration among ``rows`` (ignoring ones that could not run)."""
    ours = [r for r in rows if r.implementation == "ours" and math.isfinite(r.tflops)]
    return max(ours, key=lambda r: r.tflops, default=None)


def ours_for_table(rows: list[common.TimingRow]) -> tuple[float, str]:
    """Our TFLOP/s at one shape and its label: the best configuration's, or, for a head size without
    configurations of its own, automatic configuration's (with the configuration that served it)."""
    best = best_ours(rows)
    if best is not None:
        return best.tflops, best.config
    auto = auto_row(rows)
    if auto is not None and math.isfinite(auto.tflops):
        return auto.tflops, f"auto: {auto.config}"
    return math.nan, "(no configuration fits)"


def reference_tflops(rows: list[common.TimingRow], reference: str) -> float:
    return next((r.tflops for r in rows if r.implementation == implementation_name(reference)), math.nan)


def peer_tflops(rows: list[common.TimingRow], peer: str) -> float:
    return next((r.tflops for r in rows if r.implementation == peer_implementation(peer)), math.nan)


def missing_lines(rows: list[common.TimingRow]) -> list[str]:
    """Per SDPA backend and peer that did not run at some length of the table: where and why."""
    lines = []
    seq_lens = sorted({r.seq_len for r in rows})
    for name in (*REFERENCES, *PEERS):
        missing = {}
        for seq_len in seq_lens:
            at_seq = [r for r in rows if r.seq_len == seq_len and r.implementation == compared_implementation(name)]
            if not at_seq:
                missing.setdefault("not timed", []).append(seq_len)
            elif not math.isfinite(at_seq[0].tflops):
                reason = at_seq[0].config.removeprefix(MISSING) or "no time"
                missing.setdefault(reason, []).append(seq_len)
        for reason, at in missing.items():
            where = "every length" if at == seq_lens else "seq " + ", ".join(map(str, at))
            lines.append(f"{compared_label(name)} missing at {where}: {reason}")
    return lines


def auto_row(rows: list[common.TimingRow]) -> common.TimingRow | None:
    return next((r for r in rows if r.implementation == AUTO), None)


def choice_tflops(rows: list[common.TimingRow]) -> float:
    """The TFLOP/s of automatic configuration's choice as timed among our configurations: a
    comparison with the best free of the two timings' run-to-run noise and of the call overhead."""
    auto = auto_row(rows)
    chosen = [r.tflops for r in rows if r.implementation == "ours" and auto and r.config == auto.config]
    return chosen[0] if chosen else math.nan


def format_group_table(rows: list[common.TimingRow]) -> str:
    """The table of one (dtype, d_head, mask): best configuration per seq, automatic configuration,
    each backend, the ratios to FLASH and CUDNN and their harmonic means, auto's ratio to the best,
    and how GQA was given to each backend."""
    first = rows[0].problem
    headers = [
        "seq",
        "batch",
        "best config",
        "ours",
        "auto",
        *(r.upper() for r in REFERENCES),
        *(p.upper() for p in PEERS),
        *(f"ours/{r.upper()}" for r in RATIO_REFERENCES),
        *(f"ours/{p.upper()}" for p in PEERS),
        "auto/ours",
        "choice/ours",
    ]
    table = []
    ratios = {reference: [] for reference in RATIO_REFERENCES}
    peer_ratios = {peer: [] for peer in PEERS}
    auto_ratios, choice_ratios = [], []
    ours_by_seq = {}
    for seq_len in sorted({r.seq_len for r in rows}):
        at_seq = [r for r in rows if r.seq_len == seq_len]
        ours, ours_label = ours_for_table(at_seq)
        ours_by_seq[seq_len] = ours
        for reference in RATIO_REFERENCES:
            ratios[reference].append(ours / reference_tflops(at_seq, reference))
        for peer in PEERS:
            peer_ratios[peer].append(ours / peer_tflops(at_seq, peer))
        auto = auto_row(at_seq)
        auto_ratios.append(auto.tflops / ours if auto else math.nan)
        choice_ratios.append(choice_tflops(at_seq) / ours)
        table.append(
            [
                seq_len,
                at_seq[0].batch,
                ours_label,
                ours,
                auto.tflops if auto else math.nan,
                *(reference_tflops(at_seq, reference) for reference in REFERENCES),
                *(peer_tflops(at_seq, peer) for peer in PEERS),
                *(ratios[reference][-1] for reference in RATIO_REFERENCES),
                *(peer_ratios[peer][-1] for peer in PEERS),
                auto_ratios[-1],
                choice_ratios[-1],
            ]
        )
    heads = f"{first.heads_q} heads" + (f", {first.heads_kv} k/v heads" if first.heads_kv != first.heads_q else "")
    title = f"{rows[0].dtype}, d_head {first.d_head}, {heads}, {common.mask_name(first.causal)} (TFLOP/s)"
    ratio_formats = {len(headers) - 1 - i: ".3f" for i in range(len(RATIO_REFERENCES) + len(PEERS) + 2)}
    lines = [title, f"FLOPs: {common.flop_rule(first)}"]
    lines.append(common.format_table(headers, table, float_formats=ratio_formats))
    for name, values in [*ratios.items(), *peer_ratios.items()]:
        usable = [ratio for ratio in values if math.isfinite(ratio)]
        if usable:
            mean = common.harmonic_mean(usable)
            lines.append(f"harmonic mean of ours/{name.upper()} over {len(usable)} sequence lengths: {mean:.3f}")
    lines += ragged_length_lines(ours_by_seq)
    measured = [ratio for ratio in auto_ratios if math.isfinite(ratio)]
    chosen = [ratio for ratio in choice_ratios if math.isfinite(ratio)]
    if measured and chosen:
        lines.append(
            f"automatic configuration chose the best at {sum(ratio == 1 for ratio in chosen)} of {len(chosen)} "
            f"lengths; choice/ours lowest {min(chosen):.3f}; auto/ours (timed apart) lowest {min(measured):.3f}"
        )
    for reference in REFERENCES:
        if any(r.implementation == implementation_name(reference) and r.config == common.GQA_REPEATED for r in rows):
            label = common.SDPA_REFERENCES[reference]
            lines.append(f"{label} rejects enable_gqa: it was given k and v with each head repeated")
    lines += missing_lines(rows)
    return "\n".join(lines)


def ragged_length_lines(ours_by_seq: dict[int, float]) -> list[str]:
    """For each length that is not a multiple of common.ALIGNED_LENGTH and whose next multiple was
    timed too: how much more time per FLOP our best configuration takes there than at the multiple."""
    lines = []
    for seq_len, tflops in sorted(ours_by_seq.items()):
        aligned = common.next_aligned_length(seq_len)
        aligned_tflops = ours_by_seq.get(aligned, math.nan)
        if seq_len != aligned and math.isfinite(tflops) and math.isfinite(aligned_tflops):
            extra = 100 * (aligned_tflops / tflops - 1)
            lines.append(f"seq {seq_len}: {extra:+.1f}% time per FLOP against seq {aligned} (ours at both)")
    return lines


def plot(path: str, rows: list[common.TimingRow]) -> None:
    """TFLOP/s against seq, one panel per (dtype, d_head, mask): our best configuration, each backend
    and each peer."""
    groups_plotted = sorted({(r.dtype, r.d_head, r.causal) for r in rows})
    with common.png_figure(path, panels=len(groups_plotted)) as axes:
        for axis, (dtype_name, d_head, causal) in zip(axes, groups_plotted, strict=True):
            group = [r for r in rows if (r.dtype, r.d_head, r.causal) == (dtype_name, d_head, causal)]
            seq_lens = sorted({r.seq_len for r in group})
            at_seq = {seq_len: [r for r in group if r.seq_len == seq_len] for seq_len in seq_lens}
            best = [best_ours(at_seq[s]) for s in seq_lens]
            lines = [("ours (best config)", [b.tflops if b else math.nan for b in best])]
            lines += [
                (f"SDPA {ref.upper()}", [reference_tflops(at_seq[s], ref) for s in seq_lens]) for ref in REFERENCES
            ]
            lines += [(peer.upper(), [peer_tflops(at_seq[s], peer) for s in seq_lens]) for peer in PEERS]
            for label, values in lines:
                axis.plot(seq_lens, values, marker="o", label=label)
            axis.set_xscale("log", base=2)
            axis.set_xticks(seq_lens, [str(s) for s in seq_lens])
            axis.set_xlabel("sequence length")
            common.finish_tflops_axis(axis, f"{dtype_name}, d_head {d_head}, {common.mask_name(causal)}")


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
    variants = common.compiled_variants()
    timer, timing = common.make_timer(args.rep_ms, args.sustain_s)
    versions = f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}"
    rounds = f"; the median of {args.rounds} rounds" if args.rounds > 1 else ""
    print(f"{torch.cuda.get_device_name()}, {versions}; {timing}{rounds}")
    peers = load_peers()
    for peer, (function, missing) in peers.items():
        print(f"{peer.upper()}: {function.__module__ if function else 'missing: ' + missing}")
    if set(args.dtypes) & set(common.FP8_DTYPE_NAMES):
        print("e4m3: no SDPA backend takes it, so our output is not checked here (run_kernels.py --check does)")

    all_rows, failures = [], []
    plan = []  # per group: the configurations that fit each of its problems
    for group in groups(args):
        dtype = common.dtype_from_name(group.dtype_name)
        plan.append(
            (group, [[c for c in configs if common.fits(c, dtype, p, variants, args.larger_heads)] for p in group.problems])
        )
    # Per group and problem, the rows of every round; a group's table is printed once its last round is done.
    measured = {}
    for round_index in range(args.rounds):
        for group_index, (group, fitting) in enumerate(plan):
            total = sum(len(at_problem) + 1 + len(REFERENCES) + len(PEERS) for at_problem in fitting)
            description = f"{group.dtype_name} d_head {group.d_head} {common.mask_name(group.causal)}"
            if args.rounds > 1:
                description += f", round {round_index + 1} of {args.rounds}"
            with common.Progress(total, description) as progress:
                for problem_index, (problem, at_problem) in enumerate(zip(group.problems, fitting, strict=True)):
                    rows, failure = benchmark_shape(
                        group.dtype_name, problem, at_problem, timer, progress, round_index, peers
                    )
                    measured.setdefault((group_index, problem_index), []).extend(rows)
                    if failure and failure not in failures:
                        failures.append(failure)
            if round_index == args.rounds - 1:
                group_rows = common.median_timings(
                    row for problem_index in range(len(group.problems)) for row in measured[(group_index, problem_index)]
                )
                print()
                print(format_group_table(group_rows))
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
