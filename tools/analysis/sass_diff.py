#!/usr/bin/env python3
"""Compares the SASS instruction counts of two compiled forward-kernel configurations in one problem variant.

    python tools/analysis/sass_diff.py "(FP16, 128, 128, 64, 4): async+eager+swizzled" \\
        "(FP16, 128, 128, 64, 4): async+eager+swizzled+load_1_1_1_tiles" --arch sm_90
    python tools/analysis/sass_diff.py "sm90(FP16, 128, 128, 128, 2): ws" "sm90(FP16, 128, 128, 128, 2): ws+pingpong"

Disassembles the built extension like sass_counts.py and prints, per architecture, the two
configurations' kernels (of either family) for the variant --variant (default: none, no mask and
whole blocks; e.g. causal, causal+tails) side by side with the difference B - A: first by opcode
family, then by opcode, largest differences first. Static counts: an instruction inside a loop
counts once.
"""

from __future__ import annotations

import argparse
import collections
import sys

import sass_counts  # first: it makes bench_common and flash_helpers importable

import bench_common as common


def diff_rows(a: collections.Counter, b: collections.Counter, keys=None) -> list[list]:
    """[key, a, b, b - a] for ``keys`` (default: every key of either), largest |b - a| first, ties by key."""
    keys = sorted(set(a) | set(b)) if keys is None else list(keys)
    rows = [[key, a[key], b[key], b[key] - a[key]] for key in keys]
    return sorted(rows, key=lambda row: (-abs(row[3]), row[0]))


def format_comparison(arch: str, a: sass_counts.KernelCounts, b: sass_counts.KernelCounts, top: int | None) -> str:
    families = diff_rows(a.families, b.families, keys=(*sass_counts.shown_families([a, b]), sass_counts.TOTAL))
    opcodes = diff_rows(a.opcodes, b.opcodes)[:top]
    return "\n\n".join(
        [
            f"{arch}, variant {sass_counts.variant_name(a.variant)}\n"
            f"A = {a.config.short_form()}\nB = {b.config.short_form()}",
            common.format_table(["family", "A", "B", "B - A"], families),
            common.format_table(["opcode", "A", "B", "B - A"], opcodes),
        ]
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "config_a",
        type=sass_counts.parse_config,
        metavar="CFG_A",
        help="a configuration's short form, of either family",
    )
    parser.add_argument(
        "config_b", type=sass_counts.parse_config, metavar="CFG_B", help="the configuration to compare it with"
    )
    sass_counts.add_source_arguments(parser)
    sass_counts.add_variant_argument(parser, "kernels are compared")
    parser.add_argument("--top", type=int, metavar="N", help="show only the N opcodes that differ most")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        by_arch = sass_counts.load_variant_kernels(args)
    except (sass_counts.SassError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    comparisons = []
    for arch, at_arch in by_arch.items():
        if args.config_a in at_arch and args.config_b in at_arch:
            comparisons.append(format_comparison(arch, at_arch[args.config_a], at_arch[args.config_b], args.top))
    if not comparisons:
        wanted = [args.config_a, args.config_b]
        print(sass_counts.not_held_message(wanted, by_arch, args.variant, args.arch), file=sys.stderr)
        return 1
    print("\n\n".join(comparisons))
    return 0


if __name__ == "__main__":
    sys.exit(main())
