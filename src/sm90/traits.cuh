// The Hopper family's traits, StaticHopperKernelConfig<CFG>: every compile-time quantity the
// kernel and its launcher need, derived from one configuration, with static_asserts that guard
// against what the kernel cannot do (the Python validity rules reject those first, with reasons).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/common.h"
#include "common/fragments.cuh"
#include "common/problem_variant.h"
#include "common/type_utils.cuh"
#include "sm90/config.h"
#include "sm90/tile_scheduler.cuh"
#include "sm90/wgmma.cuh"

namespace flash::sm90 {

template <HopperForwardKernelConfig CFG>
struct StaticHopperKernelConfig {
    static constexpr HopperForwardKernelConfig config = CFG;
    using value_t = element_t<CFG.dtype>;

    static constexpr int d_head = CFG.d_head;
    static constexpr int B_r = CFG.B_r;
    static constexpr int B_c = CFG.B_c;
    static constexpr int stages = CFG.stages;
    static constexpr bool warp_specialized = CFG.warp_specialized;
    static constexpr bool pingpong = CFG.pingpong;
    static constexpr bool intra_wg_overlap = CFG.intra_wg_overlap;
    static constexpr bool persistent = CFG.persistent;
    static constexpr bool Q_in_registers = CFG.Q_in_registers;
    static constexpr bool multicast = CFG.multicast;
    static constexpr bool V_transposed_copy = CFG.V_transposed_copy;
    static constexpr bool deferred_O_rescale = CFG.deferred_O_rescale;

    // FP8 (e4m3) inputs: the wgmma of 8-bit types takes both operands K-major, so V, which arrives
    // with its keys as rows, is transposed in shared memory by the producer warpgroup (fp8_operands.cuh),
    // or, with V_transposed_copy, by a copy kernel before the call's (transposed_v_copy.cuh), whose
    // tiles TMA then loads as they are; and O is 16-bit (ForwardParams::o_dtype) in a shared-memory
    // block of its own.
    static constexpr bool fp8 = CFG.dtype == DType::E4M3;
    static constexpr bool transposes_V = fp8 && !V_transposed_copy;
    static constexpr int element_bytes = flash::element_bytes(CFG.dtype);
    // The elements of one wgmma's k-slice: 16 of a 16-bit type, 32 of e4m3.
    static constexpr int wgmma_k = WGMMA_K_BYTES / element_bytes;
    using Swizzle = SwizzleFor<d_head, element_bytes>;
    // O's tiles, of 16-bit elements.
    using O_Swizzle = SwizzleFor<d_head>;
    // A transposed V tile: d_head rows of B_c keys, in column blocks of one swizzled row's keys (the
    // 128-byte swizzle where B_c is a multiple of 128 keys, else the 64-byte one). Where B_c is not a
    // multiple of the row (224 keys: three and a half 64-byte rows), the last block's rows are part
    // filled: its 32-byte k-slices past B_c are neither written nor read.
    using Vt_Swizzle = sm90::Swizzle<B_c % 128 == 0 ? 128 : 64, element_bytes>;
    static_assert(d_head % (fp8 ? 64 : 16) == 0 && d_head <= 256, "d_head must be a multiple of 16 (of 64 with e4m3) up to 256");
    static_assert(B_r % WGMMA_M == 0 && B_r <= 3 * WGMMA_M, "B_r must be 64, 128 or 192");
    static_assert(B_c % WGMMA_K == 0 && B_c >= 64 && B_c <= 224, "B_c must be a multiple of 16 from 64 to 224");
    static_assert(stages >= 1 && stages <= 4, "stages must be 1 to 4"); // (e4m3's end words: two 8-byte words)
    static_assert(!fp8 || (warp_specialized && !Q_in_registers && !multicast && B_c % wgmma_k == 0),
                  "e4m3 needs a producer warpgroup (which transposes V), Q in shared memory, no multicast, and "
                  "B_c of whole 32-key k-slices");
    static_assert(!V_transposed_copy || (fp8 && B_c % Vt_Swizzle::cols == 0),
                  "V_transposed_copy is for e4m3, with B_c a whole number of the transposed tile's swizzled rows");

    // Each consumer warpgroup computes 64 query rows (one wgmma M) against every key; with warp
    // specialization one more warpgroup only issues the loads.
    static constexpr int consumer_warpgroups = B_r / WGMMA_M;
    static_assert(!pingpong || (warp_specialized && consumer_warpgroups >= 2),
                  "pingpong needs warp specialization and two or more consumer warpgroups");
    static_assert(!persistent || warp_specialized, "a persistent block needs a producer warpgroup");
    static_assert(!deferred_O_rescale || intra_wg_overlap,
                  "deferred_O_rescale moves the rescaling the intra-warpgroup overlap makes wait for P V");
    static_assert(!multicast || warp_specialized, "multicast needs a producer warpgroup");
    // The blocks of a cluster: two with multicast, each loading half of every KV tile for both.
    static constexpr int cluster_size = multicast ? 2 : 1;
    // Which block computes which work tile (tile_scheduler.cuh): one block (or cluster) per work
    // tile; persistent blocks that ask the work counter for their next; persistent clusters whose
    // first block asks it for all of them. The mask kind decides the work tiles' order, and a varlen
    // call's work tiles are those its plan lists, longest sequences first.
    static constexpr int KV_row_bytes = 2 * d_head * element_bytes; // a key's K and V rows (the work order's chunks)
    template <MaskKind MASK, bool VARLEN>
    using TileScheduler = std::conditional_t<
        !persistent, SinglePassScheduler<WorkTilesOf<B_r, cluster_size, MASK, VARLEN, KV_row_bytes>>,
        std::conditional_t<(cluster_size > 1),
                           ClusterCounterScheduler<WorkTilesOf<B_r, cluster_size, MASK, VARLEN, KV_row_bytes>>,
                           AtomicCounterScheduler<WorkTilesOf<B_r, 1, MASK, VARLEN, KV_row_bytes>>>>;

    static constexpr int n_threads = WARPGROUP_THREADS * (consumer_warpgroups + (warp_specialized ? 1 : 0));
    static constexpr int consumer_warps = consumer_warpgroups * WARPGROUP_THREADS / WARP_SIZE;

    // Registers per thread (setmaxnreg) when a producer warpgroup gives most of its own to the
    // consumers; with one consumer warpgroup the launch bound already allows 255. A varlen kernel's
    // producer (per work tile the plan's entry, the sequence's rows and bounded tensor maps) spills
    // at 24 beside two consumer warpgroups, so it keeps 40 and they take 232.
    //
    // With e4m3 the producer warpgroup's other warps transpose V (fp8_operands.cuh), by rows where
    // the consumers can spare the registers, else by matrices. By rows, the warpgroup keeps 56 and
    // each consumer thread has 224 (152 with three consumer warpgroups); at d_head 128's 192-key
    // tiles it ran 4 to 6% faster than by matrices, which transposes in as few registers as the loading
    // warp keeps. The consumers can spare them where their accumulators (S: B_c / 2 floats, O:
    // d_head / 2), P (B_c / 8 registers of four e4m3) and about 32 more for addresses and the
    // softmax's state fit what is left (d_head 256's 128-key and d_head 128's 224-key tiles do not).
    static constexpr bool moves_registers = warp_specialized && consumer_warpgroups >= 2;
    static constexpr int rows_transposer_producer_registers = 56;
    static constexpr int rows_transposer_consumer_registers = consumer_warpgroups == 2 ? 224 : 152;
    static constexpr int consumer_registers_needed = B_c / 2 + d_head / 2 + B_c * element_bytes / 8 + 32;
    static constexpr bool transposes_V_by_rows =
        transposes_V && (!moves_registers || consumer_registers_needed <= rows_transposer_consumer_registers);
    template <bool VARLEN>
    static constexpr int producer_registers =
        transposes_V_by_rows ? rows_transposer_producer_registers : consumer_warpgroups == 2 ? (VARLEN ? 40 : 24) : 32;
    template <bool VARLEN>
    static constexpr int consumer_registers = transposes_V_by_rows ? rows_transposer_consumer_registers
                                              : consumer_warpgroups == 2 ? (VARLEN ? 232 : 240)
                                                                         : 160;
    // setmaxnreg.inc waits until the block has the registers free, and a block has only what its
    // launch bound (n_threads, one block per multiprocessor) gave every thread: 65,536 over
    // n_threads, in steps of 8 (168 each at 384 threads, 64,512 in all). A split asking for more
    // than that hangs the second consumer warpgroup to claim its share.
    static constexpr int launch_registers = 65536 / n_threads / 8 * 8;
    template <bool VARLEN>
    static constexpr bool registers_fit =
        (producer_registers<VARLEN> + consumer_warpgroups * consumer_registers<VARLEN>) * WARPGROUP_THREADS <=
        launch_registers * n_threads;
    static_assert(!moves_registers || (registers_fit<false> && registers_fit<true>),
                  "the producer's and consumers' registers exceed what the block is launched with");
    // The producer warpgroup's warps after its first (whose first thread issues the loads), which
    // transpose V with e4m3 (transposes_V).
    static constexpr int transposer_warps = WARPGROUP_THREADS / WARP_SIZE - 1;

    // Shared memory, each tile at a 1024-byte boundary (TILE_ALIGNMENT_BYTES): Q (one 64-row block per
    // consumer warpgroup), a K and a V tile per stage (with transposes_V also a transposed V tile;
    // with V_transposed_copy the V tile is the transposed one, of the same size), then the
    // barriers. O goes out through Q's blocks, or, in a persistent block (whose next Q loads while
    // this O is stored), through O blocks of its own after the K and V tiles. With e4m3, whose O is
    // wider than Q, a single pass's O goes out through the stages' V tiles where they hold it (once
    // a consumer warpgroup has waited for its last transposed tile, the transposing warps have read
    // every V tile, and no more arrive), else through blocks of its own. A tile of R rows is column
    // blocks of R swizzled rows (R x 128, R x 64 or R x 32 bytes), one TMA box each.
    static constexpr int col_blocks = d_head / Swizzle::cols;
    static constexpr int O_col_blocks = d_head / O_Swizzle::cols;
    static constexpr int wg_Q_bytes = WGMMA_M * d_head * element_bytes;
    static constexpr int wg_O_bytes = WGMMA_M * d_head * ELEMENT_BYTES;
    static constexpr int Q_bytes = consumer_warpgroups * wg_Q_bytes;
    static constexpr int KV_tile_bytes = B_c * d_head * element_bytes;
    static constexpr int Q_col_block_bytes = WGMMA_M * Swizzle::bytes;
    static constexpr int O_col_block_bytes = WGMMA_M * O_Swizzle::bytes;
    static constexpr int KV_col_block_bytes = B_c * Swizzle::bytes;
    // A transposed V tile's column blocks: d_head rows of one swizzled row's keys each.
    static constexpr int Vt_col_block_bytes = d_head * Vt_Swizzle::bytes;
    static constexpr int Vt_tile_bytes = (B_c + Vt_Swizzle::cols - 1) / Vt_Swizzle::cols * Vt_col_block_bytes;
    // With a cluster, each block loads 1 / cluster_size of every KV tile's rows for all of them.
    static constexpr int KV_slice_rows = B_c / cluster_size;
    static constexpr int KV_slice_bytes = KV_slice_rows * Swizzle::bytes;
    static_assert(KV_slice_bytes % Swizzle::atom_bytes == 0 && KV_tile_bytes % TILE_ALIGNMENT_BYTES == 0,
                  "tiles and their slices must start on swizzle atoms");

    static constexpr bool O_in_V = transposes_V && !persistent && stages * KV_tile_bytes >= consumer_warpgroups * wg_O_bytes;
    static constexpr bool separate_O = persistent || (fp8 && !O_in_V);
    static constexpr int K_offset = Q_bytes;
    static constexpr int V_offset = K_offset + stages * KV_tile_bytes;
    static constexpr int Vt_offset = V_offset + stages * KV_tile_bytes;
    static constexpr int KV_tiles_end = Vt_offset + (transposes_V ? stages * Vt_tile_bytes : 0);
    static constexpr int O_offset = O_in_V ? V_offset : separate_O ? KV_tiles_end : 0;
    static constexpr int barriers_offset = KV_tiles_end + (separate_O ? consumer_warpgroups * wg_O_bytes : 0);
    // Per consumer warpgroup Q full and Q empty, then per stage K full, K empty, V full, V empty
    // (with transposes_V then per stage the transposed V's full and empty; in a persistent cluster then the
    // full and empty barriers of its ring of next work tiles); then, per consumer warpgroup, the slot
    // where the producer leaves its next work tile's index (one 8-byte word); with transposes_V an int per stage (in two
    // 8-byte words) where the producer marks the end of its V tiles for the transposing warps; in a
    // persistent cluster last the ring's two indices (one word).
    static constexpr int cluster_ring_entries = persistent && cluster_size > 1 ? 2 : 0;
    static constexpr int n_barriers = 2 * consumer_warpgroups + (transposes_V ? 6 : 4) * stages + 2 * cluster_ring_entries;
    static constexpr int work_slot_words = 1;
    static constexpr int stream_end_words = transposes_V ? 2 : 0;
    static constexpr int n_slots =
        n_barriers + work_slot_words * consumer_warpgroups + stream_end_words + cluster_ring_entries / 2;
    // The dynamic shared memory base is only 16-byte aligned: up to 1024 bytes go to aligning it.
    static constexpr int smem_bytes = barriers_offset + n_slots * static_cast<int>(sizeof(uint64_t)) + TILE_ALIGNMENT_BYTES;

    // Per consumer thread: S = Q K^T (64 x B_c), O (64 x d_head), and P = softmax(S) as the A
    // operand of P V, in the mma.sync layouts (one 16-row tile per warp).
    using S_accumulators = Accumulators<1, B_c / MMA_N>;
    using O_accumulators = Accumulators<1, d_head / MMA_N>;
    // Per k-slice four registers: of 16-bit pairs (m16n8k16's A layout) or e4m3 quadruples (m16n8k32's).
    using P_fragments = FragmentsA<1, B_c / wgmma_k>;
    // With Q_in_registers, this warp's 16 rows of Q as the A operand of S = Q K^T.
    using Q_fragments = FragmentsA<1, d_head / MMA_K>;
};

} // namespace flash::sm90
