#!/usr/bin/env python3
"""The order of one compiled forward kernel's scheduling instructions: its matrix products, their
fences and waits, barriers, mbarrier operations, branches, exponentials and conversions, in program
order, each run of one opcode printed once with its length.

    python tools/analysis/sass_order.py "sm90(BF16, 128, 128, 128, 2): ws+pingpong+overlap+persistent+mcast"
    python tools/analysis/sass_order.py "sm90(E4M3, 256, 128, 128, 2): ws+pingpong+overlap" --variant causal \\
        --families QGMMA WARPGROUP MUFU F2FP

What overlaps what in a kernel is decided by where ptxas puts the waits, not by the source: it may
hoist a wait for a product (`WARPGROUP.DEPBAR.LE gsb0, 0x0`) to the top of its basic block, before
the softmax that was meant to run while the product does. sass_counts.py counts instructions; this
shows where they sit. Disassembles the built extension like sass_counts.py (or reads --sass-file)
and prints, per architecture, the kernel of the configuration in --variant (default: none, no mask
and whole blocks): each kept instruction's offset, predicate, opcode and operands, a run of the same
opcode among the kept instructions as its first and `x N`. --families takes opcode families (the part before the
first '.'); --all keeps every instruction.
"""

from __future__ import annotations

import argparse
import sys

import sass_counts  # first: it makes bench_common and flash_helpers importable

# The families that shape a schedule: the three kinds of matrix products (mma.sync, 16-bit and
# 8-bit wgmma), wgmma's fences and waits, named barriers, mbarriers, branches, exponentials and the
# conversions that pack probabilities.
DEFAULT_FAMILIES = ("HMMA", "HGMMA", "QGMMA", "WARPGROUP", "BAR", "SYNCS", "BRA", "MUFU", "F2FP")


def runs(instructions: list[sass_counts.Instruction]) -> list[tuple[sass_counts.Instruction, int]]:
    """Consecutive instructions of one opcode as (the first of them, how many)."""
    collapsed: list[tuple[sass_counts.Instruction, int]] = []
    for instruction in instructions:
        if collapsed and collapsed[-1][0].opcode == instruction.opcode:
            collapsed[-1] = (collapsed[-1][0], collapsed[-1][1] + 1)
        else:
            collapsed.append((instruction, 1))
    return collapsed


def kept(instructions: list[sass_counts.Instruction], families: set[str] | None) -> list[sass_counts.Instruction]:
    """The instructions of the given opcode families (None: all), in program order."""
    if families is None:
        return list(instructions)
    return [i for i in instructions if sass_counts.opcode_family(i.opcode) in families]


def format_order(kernel: sass_counts.KernelCounts, families: set[str] | None) -> str:
    lines = [
        f"{kernel.arch}, variant {sass_counts.variant_name(kernel.variant)}: {kernel.config.short_form()}",
        f"{len(kernel.instructions)} instructions; kept: {'all' if families is None else ' '.join(sorted(families))}",
    ]
    for instruction, count in runs(kept(kernel.instructions, families)):
        text = " ".join(part for part in (instruction.predicate, instruction.opcode, instruction.operands) if part)
        lines.append(f"{instruction.offset:06x}  {text}" + (f"  x {count}" if count > 1 else ""))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", type=sass_counts.parse_config, metavar="CFG", help="a configuration's short form")
    sass_counts.add_source_arguments(parser)
    sass_counts.add_variant_argument(parser, "kernel is shown")
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument(
        "--families",
        nargs="+",
        default=list(DEFAULT_FAMILIES),
        metavar="FAMILY",
        help="the opcode families kept (default: %(default)s)",
    )
    choice.add_argument("--all", action="store_true", help="keep every instruction")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        by_arch = sass_counts.load_variant_kernels(args, keep_instructions=True)
    except (sass_counts.SassError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    families = None if args.all else set(args.families)
    orders = [format_order(at_arch[args.config], families) for at_arch in by_arch.values() if args.config in at_arch]
    if not orders:
        print(sass_counts.not_held_message([args.config], by_arch, args.variant, args.arch), file=sys.stderr)
        return 1
    print("\n\n".join(orders))
    return 0


if __name__ == "__main__":
    sys.exit(main())
