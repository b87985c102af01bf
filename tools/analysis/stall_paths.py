#!/usr/bin/env python3
"""Where a kernel's warps spend their time, by code path: Nsight Compute's warp-state samples per
SASS instruction, grouped by how many times each instruction ran.

In a kernel of loops the execution count tells the paths apart: the instructions of a loop body
that runs once per KV tile share one count, those of a work tile's set-up and epilogue another,
a producer thread's a third. Each group's share of the samples is the share of the warps' time
spent there; divided by its passes (the count), it compares what one pass of each path costs.
Paths that run equally often fall into one group: two branches that different warps take the same
number of times (a masked tile's two widths, say) count as one path of twice the instructions.

The input is the source page of a report exported as CSV:

    ncu --clock-control none -k regex:hopper_forward -c 1 --section SourceCounters -o stalls \\
        python tools/benchmark/run_kernels.py 2048 128 --causal --kernels "$K" --n_runs 1
    ncu -i stalls.ncu-rep --page source --print-source sass --csv > sass_stalls.csv
    python3 tools/analysis/stall_paths.py sass_stalls.csv [--groups 12] [--hottest 3]

(a peer's kernel the same way, through `run_kernels.py ... --peer fa3`: FlashAttention-3's is named
`device_kernel`, so `-k regex:device_kernel`), or a CSV with the same columns and any rows left out,
such as the ones benchmarks/ keeps. Prints the stall reasons over the whole kernel, then per group of
execution count, largest first: its share of the samples, its instructions, their samples per pass
relative to the largest group's, its leading stall reasons and opcodes, and its hottest instructions.
"""

from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import sys
from collections.abc import Iterable

SOURCE = "Source"
SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
STALL_PREFIX = "stall_"
NOT_ISSUED_SUFFIX = "(Not Issued)"


@dataclasses.dataclass(frozen=True)
class Instruction:
    source: str
    samples: float
    executed: int
    stalls: dict[str, float]  # reason (without the prefix) -> samples

    @property
    def opcode(self) -> str:
        """The opcode without its modifiers or predicate: FFMA, HGMMA, WARPGROUP, ..."""
        words = self.source.split()
        if not words:
            return ""
        word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        return word.split(".")[0]


@dataclasses.dataclass
class Group:
    executed: int
    instructions: list[Instruction]

    @property
    def samples(self) -> float:
        return sum(instruction.samples for instruction in self.instructions)

    def stalls(self) -> collections.Counter:
        total = collections.Counter()
        for instruction in self.instructions:
            total.update(instruction.stalls)
        return total

    def opcodes(self) -> collections.Counter:
        return collections.Counter(instruction.opcode for instruction in self.instructions)


def _number(text: str) -> float:
    text = text.strip().replace(",", "")
    return float(text) if text not in ("", "-") else 0.0


def read_instructions(lines: Iterable[str]) -> list[Instruction]:
    """The instructions of an exported source page: the rows after the header that names the
    source, samples and execution count columns (the export's first line names the kernel)."""
    rows = csv.reader(lines)
    for header in rows:
        if SOURCE in header and SAMPLES in header and EXECUTED in header:
            break
    else:
        raise ValueError(f"no header with the columns {SOURCE!r}, {SAMPLES!r} and {EXECUTED!r}")
    column = {name: i for i, name in enumerate(header)}
    reasons = [name for name in header if name.startswith(STALL_PREFIX) and not name.endswith(NOT_ISSUED_SUFFIX)]
    instructions = []
    for row in rows:
        if len(row) < len(header):
            continue
        stalls = {name.removeprefix(STALL_PREFIX): _number(row[column[name]]) for name in reasons}
        instructions.append(
            Instruction(
                row[column[SOURCE]].strip(),
                _number(row[column[SAMPLES]]),
                int(_number(row[column[EXECUTED]])),
                {reason: value for reason, value in stalls.items() if value},
            )
        )
    return instructions


def group_by_executions(instructions: list[Instruction]) -> list[Group]:
    """The instructions that ran the same number of times, most samples first (instructions that
    never ran are left out)."""
    groups: dict[int, list[Instruction]] = collections.defaultdict(list)
    for instruction in instructions:
        if instruction.executed:
            groups[instruction.executed].append(instruction)
    return sorted((Group(executed, members) for executed, members in groups.items()), key=lambda g: -g.samples)


def _leading(counter: collections.Counter, total: float, n: int) -> str:
    return ", ".join(f"{name} {value / total * 100:.1f}" for name, value in counter.most_common(n) if value)


def report(instructions: list[Instruction], groups: int, hottest: int) -> str:
    total = sum(instruction.samples for instruction in instructions)
    if total == 0:
        return "no samples"
    overall = collections.Counter()
    for instruction in instructions:
        overall.update(instruction.stalls)
    lines = [
        f"{total:.0f} samples over {len(instructions)} instructions; stall reasons (% of all samples): "
        + _leading(overall, total, 12),
        "",
        "| executions | % of samples | instructions | per pass (vs the first) | leading stalls (% of all) | leading opcodes |",
        "|---:|---:|---:|---:|---|---|",
    ]
    ranked = group_by_executions(instructions)
    reference = ranked[0].samples / ranked[0].executed if ranked else 1.0
    for group in ranked[:groups]:
        per_pass = group.samples / group.executed / reference
        opcodes = ", ".join(f"{name} {count}" for name, count in group.opcodes().most_common(5))
        lines.append(
            f"| {group.executed} | {group.samples / total * 100:.1f} | {len(group.instructions)} | {per_pass:.2f} | "
            f"{_leading(group.stalls(), total, 3)} | {opcodes} |"
        )
    if len(ranked) > groups:
        rest = sum(group.samples for group in ranked[groups:])
        lines.append(f"({len(ranked) - groups} more groups, {rest / total * 100:.1f}% of the samples)")
    if hottest:
        lines += ["", "hottest instructions of each group above (% of all samples):"]
        for group in ranked[:groups]:
            top = sorted(group.instructions, key=lambda instruction: -instruction.samples)[:hottest]
            lines.append(
                f"  {group.executed}: "
                + "; ".join(f"{instruction.samples / total * 100:.2f} {instruction.source}" for instruction in top)
            )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="the source page exported as CSV (ncu -i REPORT --page source --print-source sass --csv)")
    parser.add_argument("--groups", type=int, default=12, help="execution counts to list (default 12)")
    parser.add_argument("--hottest", type=int, default=3, help="hottest instructions listed per group (default 3; 0: none)")
    args = parser.parse_args(argv)
    if args.groups < 1:
        parser.error(f"--groups: expected a positive number, got {args.groups}")
    if args.hottest < 0:
        parser.error(f"--hottest: expected 0 or more, got {args.hottest}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with open(args.csv, newline="") as file:
            instructions = read_instructions(file)
    except (OSError, ValueError) as error:
        print(f"stall_paths: {args.csv}: {error}", file=sys.stderr)
        return 1
    print(report(instructions, args.groups, args.hottest))
    return 0


if __name__ == "__main__":
    sys.exit(main())
