"""The default set: what a plain install compiles, small enough for a build of minutes. Per dtype
and head size, the configurations that measured fastest on the H200 (benchmarks/HISTORY.md,
section "default-set", says how each was chosen; the e4m3 ones' comment says theirs). Every problem
variant is compiled for them
(``kernel_sets.variants_to_build``), and automatic configuration chooses among them (the dispatch
table). The varlen variants (batches whose sequences have lengths of their own) are compiled for
one configuration per family, dtype and head size (VARLEN_KERNELS), which serves every such call,
and for the decoding configurations (DECODE_KERNELS), which have no other.
Importable without torch.
"""

from __future__ import annotations

__all__ = ["DECODE_KERNELS", "DEFAULT_BUILD_KERNELS", "VARLEN_KERNELS"]

DEFAULT_BUILD_KERNELS = (
    # d_head 32: the tuning sweep's fastest at seq 4096.
    "(FP16, 32, 128, 64, 4): async+eager+swizzled+load_0_1_2_tiles+buffer+opt_softmax",
    "(BF16, 32, 128, 64, 4): async+eager+swizzled+load_0_1_2_tiles+buffer+opt_softmax",
    # d_head 64: the tuning sweep's fastest over every benchmark length.
    "(FP16, 64, 128, 64, 4): async+eager+swizzled+load_0_1_1_tiles+buffer+opt_softmax",
    "(BF16, 64, 128, 64, 4): async+eager+swizzled+load_0_1_1_tiles+buffer+opt_softmax",
    # d_head 96: the tuning sweep's fastest at seq 4096.
    "(FP16, 96, 128, 32, 4): async+eager+swizzled+load_0_2_1_tiles+buffer+opt_softmax",
    "(BF16, 96, 128, 32, 4): async+eager+swizzled+load_0_2_1_tiles+buffer+opt_softmax",
    # d_head 128: the tuning sweep's fastest over every benchmark length.
    "(FP16, 128, 128, 64, 4): async+eager+swizzled+load_1_1_2_tiles+buffer+opt_softmax",
    "(BF16, 128, 128, 64, 4): async+eager+swizzled+load_1_1_2_tiles+buffer+opt_softmax",
    # d_head 192: the tuning sweep's fastest at seq 4096, and the causal winner at long lengths.
    "(FP16, 192, 128, 64, 8): async+eager+swizzled+load_0_1_1_tiles+buffer+opt_softmax",
    "(BF16, 192, 128, 64, 8): async+eager+swizzled+load_0_1_1_tiles+buffer+opt_softmax",
    # d_head 192: the causal winner at short lengths.
    "(FP16, 192, 64, 32, 4): async+eager+swizzled+load_0_2_1_tiles+buffer+opt_softmax",
    "(BF16, 192, 64, 32, 4): async+eager+swizzled+load_0_2_1_tiles+buffer+opt_softmax",
    # d_head 256: the tuning sweep's fastest at seq 4096, and the causal winner at long lengths.
    "(FP16, 256, 128, 32, 8): async+eager+swizzled+load_0_2_1_tiles+buffer+opt_softmax",
    "(BF16, 256, 128, 32, 8): async+eager+swizzled+load_0_2_1_tiles+buffer+opt_softmax",
    "(FP16, 256, 128, 64, 8): async+eager+swizzled+load_2_2_1_tiles+buffer+opt_softmax",
    "(BF16, 256, 128, 64, 8): async+eager+swizzled+load_2_2_1_tiles+buffer+opt_softmax",
    # d_head 256: the causal winner at short lengths, whose shared memory fits sm_86's and sm_89's 99 KiB.
    "(FP16, 256, 64, 32, 4): async+eager+swizzled+load_2_2_1_tiles+buffer+opt_softmax",
    "(BF16, 256, 64, 32, 4): async+eager+swizzled+load_2_2_1_tiles+buffer+opt_softmax",
    # d_head 32: the H200 sweep's fastest; qregs is faster without a mask, slower with the causal one.
    "sm90(FP16, 32, 192, 128, 2): ws+pingpong+overlap+persistent",
    "sm90(BF16, 32, 192, 128, 2): ws+pingpong+overlap+persistent",
    "sm90(FP16, 32, 192, 128, 2): ws+pingpong+overlap+persistent+qregs",
    "sm90(BF16, 32, 192, 128, 2): ws+pingpong+overlap+persistent+qregs",
    # d_head 64: two consumer warpgroups, faster at short lengths with the causal mask.
    "sm90(FP16, 64, 128, 128, 2): ws+pingpong+overlap+persistent+qregs",
    "sm90(BF16, 64, 128, 128, 2): ws+pingpong+overlap+persistent+qregs",
    # d_head 64: the H200 sweep's fastest.
    "sm90(FP16, 64, 192, 128, 2): ws+pingpong+overlap",
    "sm90(BF16, 64, 192, 128, 2): ws+pingpong+overlap",
    # d_head 64: persistent, faster at short lengths without a mask.
    "sm90(FP16, 64, 192, 128, 2): ws+pingpong+overlap+persistent",
    "sm90(BF16, 64, 192, 128, 2): ws+pingpong+overlap+persistent",
    # d_head 48 (32-byte swizzled rows): the fastest of an H100 sweep of four shapes; d_head 40 runs on
    # it. d_head 80 runs on d_head 96's blocks: its own (128, 128) measured no faster, and its sweep's
    # winner, (192, 96), awaits a full test run with its varlen kernels.
    "sm90(FP16, 48, 192, 128, 2): ws+pingpong+overlap+persistent",
    "sm90(BF16, 48, 192, 128, 2): ws+pingpong+overlap+persistent",
    # d_head 96: the H200 sweep's winner with the causal mask.
    "sm90(FP16, 96, 128, 128, 2): ws+pingpong+overlap+persistent+qregs",
    "sm90(BF16, 96, 128, 128, 2): ws+pingpong+overlap+persistent+qregs",
    # d_head 96: the H200 sweep's winner without a mask.
    "sm90(FP16, 96, 128, 176, 2): ws+pingpong+overlap+persistent",
    "sm90(BF16, 96, 128, 176, 2): ws+pingpong+overlap+persistent",
    # d_head 128: the H200 sweep's fastest.
    "sm90(FP16, 128, 128, 128, 2): ws+pingpong+overlap+qregs",
    "sm90(BF16, 128, 128, 128, 2): ws+pingpong+overlap+qregs",
    # d_head 128: persistent, faster at short lengths; without qregs, faster with the causal mask.
    "sm90(FP16, 128, 128, 128, 2): ws+pingpong+overlap+persistent",
    "sm90(BF16, 128, 128, 128, 2): ws+pingpong+overlap+persistent",
    # d_head 128: persistent with qregs, faster without a mask.
    "sm90(FP16, 128, 128, 128, 2): ws+pingpong+overlap+persistent+qregs",
    "sm90(BF16, 128, 128, 128, 2): ws+pingpong+overlap+persistent+qregs",
    # d_head 128: pairs of persistent blocks that load each K/V tile once for both (multicast): half
    # the K/V traffic out of L2, whose power the clock gets back under the power limit.
    "sm90(FP16, 128, 128, 128, 2): ws+pingpong+overlap+persistent+mcast",
    "sm90(BF16, 128, 128, 128, 2): ws+pingpong+overlap+persistent+mcast",
    # d_head 128: 144-key tiles waste less of the last tile at lengths such as 1000 keys.
    "sm90(FP16, 128, 128, 144, 2): ws+pingpong+overlap+persistent",
    "sm90(BF16, 128, 128, 144, 2): ws+pingpong+overlap+persistent",
    # d_head 128: 160-key tiles cover lengths such as 4000 and 8000 keys whole.
    "sm90(FP16, 128, 128, 160, 2): ws+pingpong+overlap+persistent",
    "sm90(BF16, 128, 128, 160, 2): ws+pingpong+overlap+persistent",
    # d_head 160: the fastest of six candidates on the H200 (at 4,096 and 8,192 keys within 3% of the
    # best); FlashAttention-2 compiles this head size too.
    "sm90(FP16, 160, 128, 128, 2): ws+pingpong+overlap",
    "sm90(BF16, 160, 128, 128, 2): ws+pingpong+overlap",
    # d_head 192: the H200 sweep's fastest.
    "sm90(FP16, 192, 128, 112, 2): ws+pingpong+overlap",
    "sm90(BF16, 192, 128, 112, 2): ws+pingpong+overlap",
    # d_head 224: the fastest of four candidates on the H200 (without a mask at 8,192 keys, 2.5%
    # behind 80-key tiles); FlashAttention-2 compiles this head size too.
    "sm90(FP16, 224, 128, 96, 2): ws+pingpong+overlap",
    "sm90(BF16, 224, 128, 96, 2): ws+pingpong+overlap",
    # d_head 256: the H200 sweep's fastest.
    "sm90(FP16, 256, 128, 64, 2): ws+pingpong+overlap",
    "sm90(BF16, 256, 128, 64, 2): ws+pingpong+overlap",
    # e4m3 (FP8) inputs, 128-key tiles as large as the FP8 kernel's rules allow;
    # at d_head 64 three consumer warpgroups, the fastest at every benchmark length with both masks
    # (0.90 to 0.92 x FlashAttention-3; two warpgroups 448 against its 641 TFLOP/s at 16k), without
    # ping-pong turns, 1.02 to 1.10 x with them (#2026-12-02-fp8-transposer-turns); at 128 persistent,
    # which measured 1.0 to 1.2 x the single-pass configuration and within 2% where it was slower
    # (H200, benchmarks/HISTORY.md #2026-11-27-fp8-cache); beside it 192-key tiles, 2 to 6% faster
    # without a mask from 2k keys and slower below (#2026-11-28-fp8-wide-tiles); at 256 without the
    # intra-warpgroup overlap, 1.06 to 1.17 x the 64-key tiles at every length and 1 to 4% faster than
    # with it (#2026-12-02-fp8-d256-wide-tiles); the 64-key tiles beside them serve its varlen calls
    # (VARLEN_KERNELS).
    "sm90(E4M3, 64, 192, 128, 2): ws+overlap",
    "sm90(E4M3, 128, 128, 128, 2): ws+pingpong+overlap+persistent",
    "sm90(E4M3, 128, 128, 192, 2): ws+pingpong+overlap+persistent",
    "sm90(E4M3, 256, 128, 128, 2): ws+pingpong",
    "sm90(E4M3, 256, 128, 64, 2): ws+pingpong+overlap",
    # Beside them, for long dense calls, V transposed by a copy kernel first: at every head size 1.06
    # to 1.11 x the blocks above at 16k without a mask and 1.02 to 1.09 x from 8k causal, slower below
    # 4k (the copy's fixed cost); at d_head 256 with the intra-warpgroup overlap, which no longer
    # contends with transposing warps (#2026-12-07-fp8-transposed-v-copy, an H100).
    "sm90(E4M3, 64, 192, 128, 2): ws+overlap+vtcopy",
    "sm90(E4M3, 128, 128, 192, 2): ws+pingpong+overlap+persistent+vtcopy",
    "sm90(E4M3, 256, 128, 128, 2): ws+pingpong+overlap+vtcopy",
)

# Decoding (a few query rows per sequence, the keys split over blocks; binding/split_kv.h): blocks
# of 16 rows, whose four warps split each 64-key tile's keys (so that a decode step's few rows keep
# every warp's tensor cores busy, not one warp's), and of 64 rows, the fewest the four warps take
# without splitting keys, for calls of 17 to 64 rows per sequence (many queries, or many query heads
# per KV head); 64-key tiles, so that two blocks or more fit a multiprocessor. A call takes the
# fewest rows that hold its queries. Compiled with the varlen variants only (the variants splits
# run on), for the head sizes of most models.
DECODE_KERNELS = tuple(
    f"({dtype}, {d_head}, {B_r}, 64, 4): async+eager+swizzled+{tiles}+buffer+opt_softmax"
    for dtype in ("FP16", "BF16")
    for d_head, B_r, tiles in (
        (64, 16, "load_0_1_0_tiles"),
        (64, 64, "load_0_1_1_tiles"),
        (128, 16, "load_0_1_0_tiles"),
        (128, 64, "load_1_1_2_tiles"),
    )
)

# The configurations compiled with the varlen variants too: per family, dtype and head size, a
# default configuration; in the Hopper family persistent ones where the default set has them, so
# that its blocks take the work tiles of a ragged batch as they free up (the dispatch table's
# rankings at the longest sequence's length choose among them); every e4m3 one but d_head 256's
# 128-key tiles, whose consumers would spill at the 232 registers a varlen kernel gives them (its
# 64-key tiles serve varlen calls instead).
VARLEN_KERNELS = (
    "sm90(E4M3, 64, 192, 128, 2): ws+overlap",
    "sm90(E4M3, 128, 128, 128, 2): ws+pingpong+overlap+persistent",
    "sm90(E4M3, 128, 128, 192, 2): ws+pingpong+overlap+persistent",
    "sm90(E4M3, 256, 128, 64, 2): ws+pingpong+overlap",
) + tuple(
    short_form.replace("(DTYPE", f"({dtype}")
    for dtype in ("FP16", "BF16")
    for short_form in (
        "(DTYPE, 32, 128, 64, 4): async+eager+swizzled+load_0_1_2_tiles+buffer+opt_softmax",
        "(DTYPE, 64, 128, 64, 4): async+eager+swizzled+load_0_1_1_tiles+buffer+opt_softmax",
        "(DTYPE, 96, 128, 32, 4): async+eager+swizzled+load_0_2_1_tiles+buffer+opt_softmax",
        "(DTYPE, 128, 128, 64, 4): async+eager+swizzled+load_1_1_2_tiles+buffer+opt_softmax",
        "(DTYPE, 192, 128, 64, 8): async+eager+swizzled+load_0_1_1_tiles+buffer+opt_softmax",
        "(DTYPE, 256, 128, 32, 8): async+eager+swizzled+load_0_2_1_tiles+buffer+opt_softmax",
        "sm90(DTYPE, 32, 192, 128, 2): ws+pingpong+overlap+persistent",
        "sm90(DTYPE, 64, 192, 128, 2): ws+pingpong+overlap+persistent",
        "sm90(DTYPE, 64, 128, 128, 2): ws+pingpong+overlap+persistent+qregs",
        "sm90(DTYPE, 48, 192, 128, 2): ws+pingpong+overlap+persistent",
        "sm90(DTYPE, 96, 128, 128, 2): ws+pingpong+overlap+persistent+qregs",
        # d_head 128: the dispatch table's rankings choose among them (qregs is faster without a
        # mask at short lengths, the multicast pair at long ones).
        "sm90(DTYPE, 128, 128, 128, 2): ws+pingpong+overlap+persistent",
        "sm90(DTYPE, 128, 128, 128, 2): ws+pingpong+overlap+persistent+qregs",
        "sm90(DTYPE, 128, 128, 128, 2): ws+pingpong+overlap+persistent+mcast",
        # d_head 160 to 256: the default set has no persistent configuration.
        "sm90(DTYPE, 160, 128, 128, 2): ws+pingpong+overlap",
        "sm90(DTYPE, 192, 128, 112, 2): ws+pingpong+overlap",
        "sm90(DTYPE, 224, 128, 96, 2): ws+pingpong+overlap",
        "sm90(DTYPE, 256, 128, 64, 2): ws+pingpong+overlap",
    )
)
