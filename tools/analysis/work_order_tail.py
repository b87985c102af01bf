#!/usr/bin/env python3
"""How much of a persistent Hopper grid's time its work order leaves idle at the end, under the
causal mask: a model of the work counter, not a measurement.

The persistent blocks take work tiles from a global counter in the kernel's numbering
(src/sm90/work_order.cuh, which a varlen call's plan follows too): heads are taken in chunks, and inside a chunk every head's
longest query block first, then every head's next. Each block takes the next work tile when it is
free, as the counter hands them out; a work tile costs the KV tiles it visits (with the causal mask
and as many queries as keys, query block i of B_r rows visits ceil((i + 1) * B_r / B_c)) plus a
fixed cost per work tile (--tile-cost, in KV tiles). The grid's time is when its last block ends,
and its efficiency the work over blocks * time: what remains is the tail, blocks idle while the
last long work tiles end.

For each length of the benchmark shape (pt_bench's batch and heads), prints the efficiency of each
chunk budget: `head` is one head per chunk (each head's query blocks longest first, head after
head), `kernel` the kernel's budget (WORK_CHUNK_KV_BYTES: as many heads as keep their K and V in
16 MB of L2), `all` every head in one chunk (the whole grid longest first, whatever L2 holds).

    python3 tools/analysis/work_order_tail.py [--d-head 128] [--seq-lens 1024 2048 ...] [--blocks 132]
"""

from __future__ import annotations

import argparse
import heapq
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmark"))
import bench_common as common  # noqa: E402

# The kernel's chunk budget (work_order.cuh's WORK_CHUNK_KV_BYTES).
KERNEL_CHUNK_KV_BYTES = 16 << 20
# The multiprocessors of an H100 SXM or H200: one persistent block each.
DEFAULT_BLOCKS = 132


def chunk_heads(budget_bytes: int | None, seqlen_k: int, d_head: int, element_bytes: int, heads: int) -> int:
    """Heads per chunk: as many as keep their K and V within budget_bytes (at least one); None: all."""
    if budget_bytes is None:
        return heads
    return max(1, budget_bytes // (seqlen_k * 2 * d_head * element_bytes))


def work_order(Q_blocks: int, units: int, chunk_units: int) -> list[tuple[int, int]]:
    """The (query block, unit) of each work index, as ordered_work numbers a masked problem's work
    tiles (without clusters): in chunks of chunk_units units, inside a chunk every unit's last query
    block first."""
    order = []
    for index in range(Q_blocks * units):
        chunk, in_chunk = divmod(index, chunk_units * Q_blocks)
        size = min(chunk_units, units - chunk * chunk_units)
        order.append((Q_blocks - 1 - in_chunk // size, chunk * chunk_units + in_chunk % size))
    return order


def causal_kv_tiles(Q_block: int, B_r: int, B_c: int) -> int:
    """The KV tiles query block Q_block visits under the causal mask with as many queries as keys."""
    return math.ceil((Q_block + 1) * B_r / B_c)


def efficiency(costs: list[float], blocks: int) -> float:
    """The work over blocks * time when `blocks` blocks take the costs in order, each the next when free."""
    ends = [0.0] * blocks
    for cost in costs:
        heapq.heapreplace(ends, ends[0] + cost)
    return sum(costs) / (blocks * max(ends))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-head", type=int, default=128, help="head size (default 128)")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=list(common.SEQ_LENS), metavar="SEQ",
                        help="sequence lengths (default: the benchmark's)")
    parser.add_argument("--blocks", type=int, default=DEFAULT_BLOCKS, help=f"persistent blocks (default {DEFAULT_BLOCKS})")
    parser.add_argument("--block-rows", type=int, default=128, help="B_r (default 128)")
    parser.add_argument("--block-keys", type=int, default=128, help="B_c (default 128)")
    parser.add_argument("--element-bytes", type=int, default=2, help="bytes per K or V element (default 2)")
    parser.add_argument("--tile-cost", type=float, default=1.0,
                        help="a work tile's fixed cost, in KV tiles (default 1)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    heads = common.heads_for_d_head(args.d_head)
    budgets = {"head": 0, "kernel": KERNEL_CHUNK_KV_BYTES, "all": None}
    print(f"causal, d_head {args.d_head}, {heads} heads, {args.blocks} blocks; efficiency = work / (blocks * time)")
    print(f"{'seq':>6} {'batch':>5} {'tiles':>6}  " + "  ".join(f"{name:>14}" for name in budgets))
    for seq_len in args.seq_lens:
        batch = common.batch_for_seq_len(seq_len)
        units = batch * heads
        Q_blocks = math.ceil(seq_len / args.block_rows)
        cells = []
        for budget in budgets.values():
            chunk = min(units, chunk_heads(budget, seq_len, args.d_head, args.element_bytes, units))
            costs = [causal_kv_tiles(q, args.block_rows, args.block_keys) + args.tile_cost
                     for q, _ in work_order(Q_blocks, units, chunk)]
            cells.append(f"{efficiency(costs, args.blocks):6.3f} ({chunk:>4})")
        print(f"{seq_len:>6} {batch:>5} {Q_blocks * units:>6}  " + "  ".join(f"{cell:>14}" for cell in cells))
    print("(in parentheses: heads per chunk)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
