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
from flash_helpers.kernel_config import KernelConfig
from flash_helpers.kernel_names import parse_kernel_name_into_config


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


def parse_config(text: str) -> KernelConfig:
    """A configuration of any family, from its short form or a kernel name."""
    try:
        return parse_kernel_name_into_config(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "config_a", type=parse_config, metavar="CFG_A", help="a configuration's short form, of either family"
    )
    parser.add_argument("config_b", type=parse_config, metavar="CFG_B", help="the configuration to compare it with")
    sass_counts.add_source_arguments(parser)
    parser.add_argument(
        "--variant",
        choices=sass_counts.VARIANTS_BY_NAME,
        default=sass_counts.DEFAULT_VARIANT,
        help="the problem variant whose kernels are compared (default: %(default)s)",
    )
    parser.add_argument("--top", type=int, metavar="N", help="show only the N opcodes that differ most")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        kernels, _ = sass_counts.load_kernels(args.module, args.sass_file)
    except (sass_counts.SassError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    variant = sass_counts.VARIANTS_BY_NAME[args.variant]
    by_arch = collections.defaultdict(dict)
    for kernel in kernels:
        if sass_counts.arch_matches(kernel.arch, args.arch) and kernel.variant == variant:
            by_arch[kernel.arch][kernel.config] = kernel

    comparisons = []
    for arch, at_arch in sorted(by_arch.items()):
        if args.config_a in at_arch and args.config_b in at_arch:
            comparisons.append(format_comparison(arch, at_arch[args.config_a], at_arch[args.config_b], args.top))
    if not comparisons:
        present = sorted({cfg for at_arch in by_arch.values() for cfg in at_arch})
        missing = [cfg.short_form() for cfg in (args.config_a, args.config_b) if cfg not in present]
        print(
            f"error: the extension does not hold both configurations in variant {args.variant}"
            + (f" for {args.arch}" if args.arch else "")
            + (f"; missing: {'; '.join(missing)}" if missing else "")
            + "\nconfigurations it holds:\n  "
            + "\n  ".join(cfg.short_form() for cfg in present),
            file=sys.stderr,
        )
        return 1
    print("\n\n".join(comparisons))
    return 0


if __name__ == "__main__":
    sys.exit(main())
