// The SM80 family's FlashAttention-2 forward kernel. One thread block computes O for B_r query
// rows of one (batch, head): it walks over all KV tiles, computing S = Q K^T, the online softmax
// and O += P V on tensor cores, and writes O once at the end.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/common.h"
#include "common/forward_params.h"
#include "common/problem_variant.h"
#include "common/ptx.cuh"
#include "common/sequence.cuh"
#include "sm80/gemm.cuh"
#include "sm80/layout.cuh"
#include "sm80/load_store.cuh"
#include "common/kv_tile_walk.cuh"
#include "common/masking.cuh"
#include "common/online_softmax.cuh"
#include "common/softmax_epilogue.cuh"
#include "sm80/e4m3_cache.cuh"
#include "sm80/epilogue.cuh"
#include "sm80/key_groups.cuh"
#include "sm80/kv_copies.cuh"
#include "sm80/traits.cuh"

namespace flash::sm80 {

// Element pointer to row `row` of one (batch, head) slice of a (batch, seq, heads, d_head) tensor.
template <typename value_t, typename Ptr>
__device__ __forceinline__ value_t *tensor_rows(Ptr base, const TensorStrides &strides, int batch, int head, int row) {
    return static_cast<value_t *>(base) + batch * strides.batch + head * strides.head + row * strides.seq;
}

// Makes the block's completed tile copies visible to every warp. With cp.async, waits first until
// at most n_pending of this thread's copy groups are still in flight.
template <typename Kernel, int n_pending>
__device__ __forceinline__ void wait_for_copies() {
    if constexpr (Kernel::async_copy)
        ptx::cp_async_wait<n_pending>();
    __syncthreads();
}

struct NoFragments {};

// The fragments of one k-chunk of S = Q K^T: K's, and Q's unless Q stays in registers.
template <typename Kernel>
struct QKChunkFragments {
    typename Kernel::K_fragments K;
    std::conditional_t<Kernel::Q_in_registers, NoFragments, typename Kernel::Q_chunk_fragments> Q;
};

// The copy schedule. Without eager_load_blocks there is one K and one V tile in shared memory:
// each iteration issues its K and V copies once every warp is done with the previous ones, and
// V's copy overlaps S = Q K^T when async. With it there are two stages: iteration j first waits
// for its own tiles (issued one iteration earlier), then issues the copies of tile j + 1 into the
// other stage, so they overlap all of iteration j's compute, with a single barrier per tile.
//
// The problem variant: MASK and MASKED_TAILS decide which tiles the block visits and which of them
// are masked element by element (KVTileRange); the unmasked tiles in between run exactly the code
// of an unmasked problem. SCORE_MODS applies softcap and ALiBi to every tile's scores. With
// VARLEN each sequence has lengths of its own (Sequence): the grid covers the longest, and the
// blocks past a shorter one's rows have nothing to do; it also splits the keys when the call asks
// (SplitKV): the grid's x then counts num_splits runs of query blocks, and each block walks its
// split's tiles and writes partial results. With KV_E4M3 (varlen only) K and V are an FP8 cache:
// the copies run two tiles ahead (KVTileCopies::stage_next; three slots, whatever eager says), the
// products read the e4m3 tiles and widen them in registers (E4M3CacheProducts), k's dequantisation
// factor multiplies the softmax scale and v's the output. A block of fewer than 16 query rows per
// warp splits each tile's keys over its warps' key groups (traits), whose softmaxes and outputs
// merge_key_groups adds up after the last tile. The variant's fields are
// separate template arguments: nvcc's host stubs cannot spell a class-type template argument whose
// fields are all zero.
template <typename Kernel, MaskKind MASK, bool MASKED_TAILS, bool SCORE_MODS, bool VARLEN, bool KV_E4M3>
__global__ void __launch_bounds__(Kernel::n_threads) flash_forward_kernel(const __grid_constant__ ForwardParams call) {
    static_assert(!KV_E4M3 || VARLEN, "an FP8 cache is read by the varlen variants");
    using value_t = typename Kernel::value_t;
    using KVCopies = KVTileCopies<Kernel, MASKED_TAILS, VARLEN, KV_E4M3>;
    using stored_t = typename KVCopies::stored_t;
    constexpr bool async_copy = Kernel::async_copy;
    constexpr bool eager = Kernel::eager_load_blocks;
    constexpr int n_threads = Kernel::n_threads;
    constexpr int B_r = Kernel::B_r;
    constexpr int B_c = Kernel::B_c;

    // Shared memory: Q, then per stage a K and a V tile. Aligned to a swizzle's pass over the banks
    // (SWIZZLE_CHUNKS chunks), so that the tiles keep their bank pattern even behind static shared
    // memory, which comes first.
    extern __shared__ __align__(SWIZZLE_CHUNKS * COPY_BYTES) unsigned char smem[];
    const typename Kernel::Q_tile Q_smem{reinterpret_cast<value_t *>(smem)};
    constexpr int KV_stage_bytes = Kernel::KV_stage_elems * static_cast<int>(sizeof(value_t));

    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    // A split's combine is launched after this kernel as a dependent grid (split_kv/combine.cu): its
    // blocks may take their places once every block here has started, and wait for its writes.
    if constexpr (VARLEN)
        ptx::allow_dependent_launch();
    // With a split over the keys, blockIdx.x = split * query blocks + query block.
    const int num_splits = VARLEN ? max(call.split.num_splits, 1) : 1;
    const int Q_blocks = gridDim.x / num_splits;
    const int split = VARLEN ? blockIdx.x / Q_blocks : 0;
    const int Q_block = VARLEN ? blockIdx.x % Q_blocks : blockIdx.x;
    const Sequence<VARLEN> sequence(call, batch);
    const ForwardParams &params = sequence.params;
    const int Q_first_row = Q_block * B_r;
    if (VARLEN && Q_first_row >= params.seqlen_q)
        return;
    const int kv_head = head / (params.heads_q / params.heads_kv);
    // A warp's rows, and where its share of each KV tile's keys starts (traits: all of them but in a
    // block of fewer than 16 rows per warp, whose key groups split them).
    const int warp = threadIdx.x / WARP_SIZE;
    const int warp_first_row = (warp % Kernel::row_warps) * Kernel::warp_rows;
    const int warp_first_key = (warp / Kernel::row_warps) * Kernel::warp_keys;
    // The warps that hold the block's results at the end (every warp unless keys split).
    const bool warp_holds_result = Kernel::key_groups == 1 || warp < Kernel::row_warps;
    // Rows of this block that exist (all of them unless the last block is partial).
    const int Q_rows = MASKED_TAILS ? min(B_r, params.seqlen_q - Q_first_row) : B_r;
    // A warp whose rows all lie past the block's (a decode step's few rows leave most warps so)
    // takes part in the copies and barriers only: its products would be of rows no one reads.
    const bool warp_has_rows = !VARLEN || warp_first_row < Q_rows;
    using Tiles = KVTileRange<B_r, B_c, MASK, MASKED_TAILS, VARLEN>;
    Tiles tiles(params, Q_first_row);
    if (num_splits > 1)
        tiles.keep_split(split, num_splits);

    // Q and O at the block's first row; the varlen variant's at row 0 of the (batch, head), whose
    // rows it finds query by query (row_offset: grouped heads packed as rows are read in place).
    const int first_addressed_row = VARLEN ? 0 : Q_first_row;
    const value_t *Q = tensor_rows<const value_t>(params.q, params.q_strides, batch, head, first_addressed_row);
    value_t *O = tensor_rows<value_t>(params.o, params.o_strides, batch, head, first_addressed_row);
    const int kv_batch = sequence.tensor_batch_k();
    const int *page_table = nullptr;
    if constexpr (VARLEN)
        if (const PagedKV &paged = params.sequences.paged; paged.block_table != nullptr)
            page_table = page_table_row(paged, batch);
    const KVCopies KV_copies{
        params,
        Q_smem.data + Kernel::Q_tile::size,
        tensor_rows<const stored_t>(params.k, params.k_strides, kv_batch, kv_head, 0),
        tensor_rows<const stored_t>(params.v, params.v_strides, kv_batch, kv_head, 0),
        B_c * params.k_strides.seq,
        B_c * params.v_strides.seq,
        page_table};

    // A key group's share of a tail tile may hold only keys past the sequence's end.
    OnlineSoftmax<Kernel::M_tiles, Kernel::optimized_softmax, Tiles::may_be_empty || (Kernel::key_groups > 1 && MASKED_TAILS)>
        softmax;
    softmax.init();
    typename Kernel::O_accumulators O_acc;
    O_acc.zero();
    const ScoreModsOf<SCORE_MODS> score_mods(
        params, batch, head, KV_E4M3 ? params.softmax_scale * descale_at(params.descales.k, batch, kv_head) : params.softmax_scale);
    // What the softmax multiplies the scores by: the softmax scale, or softcap once capped.
    const float score_scale = score_mods.post_scale;

    if (!tiles.empty()) {
        // Per-lane ldmatrix addresses, computed once: each fragment load adds a compile-time
        // offset. K's and V's move between the two stages in place, so no second set stays live
        // (an FP8 cache's between its three slots).
        const auto Q_addresses = A_addresses(Q_smem, warp_first_row);
        auto K_addresses = B_from_rows_n_addresses(KV_copies.K_arriving(0), warp_first_key);
        auto V_addresses = B_from_rows_k_addresses(KV_copies.V_arriving(0), warp_first_key);
        int next_stage_shift = KV_stage_bytes;
        std::conditional_t<KV_E4M3, E4M3CacheProducts<Kernel>, NoFragments> e4m3;
        // A paged copy looks up each row group's page before its copies can start, so when eager it
        // issues tile j + 1 before waiting for tile j (two tiles in flight, at a second barrier per
        // tile): paged decoding 1.5 to 2.5% faster; the dense copy measured ~1% slower that way
        // (H200, benchmarks/HISTORY.md #2026-11-27-paged-copy-ahead).
        const bool copy_before_wait = VARLEN && page_table != nullptr;

        if constexpr (VARLEN)
            // Rows past the block's are not read: their address is the last row's.
            copy_rows_global_to_shared<async_copy, n_threads, MASKED_TAILS, MASKED_TAILS>(
                Q_smem,
                [&](int, int row) {
                    return Q + row_offset(Q_first_row + min(row, Q_rows - 1), params.q_strides.seq, params.q_query_stride,
                                          params);
                },
                Q_rows, params.d_head);
        else if constexpr (MASKED_TAILS)
            copy_global_to_shared<async_copy, n_threads, true, true>(Q_smem, Q, params.q_strides.seq, Q_rows,
                                                                     params.d_head);
        else
            copy_global_to_shared<async_copy, n_threads>(Q_smem, Q, params.q_strides.seq);
        using Whole = std::true_type;
        using MayBePartial = std::false_type;
        if constexpr (KV_E4M3)
            KV_copies.stage_first(tiles.begin, tiles.end);
        else if constexpr (eager)
            KV_copies.copy(tiles.begin, 0, MayBePartial{});
        // The copies a thread may leave in flight once Q has landed: the KV tiles issued after it.
        constexpr int KV_groups_ahead = KV_E4M3 ? KVCopies::GROUPS_AHEAD : eager ? 2 : 0;
        typename Kernel::Q_fragments Q_frags;
        if constexpr (KV_E4M3) {
            wait_for_copies<Kernel, KV_groups_ahead>(); // Q has landed; the first KV tiles may be in flight
            if (warp_has_rows)
                e4m3.load_Q(Q_smem, warp_first_row);
        } else if constexpr (Kernel::Q_in_registers) {
            wait_for_copies<Kernel, KV_groups_ahead>();
            load_A(Q_frags, Q_addresses, 0);
        }

        // copies_whole: the tile this iteration copies (tile j + 1 when eager, else tile j) is known
        // to be whole, so the copies need no predicates.
        const auto process_KV_tile = [&](int KV_block, auto first_tile, auto masked, auto copies_whole) {
            if constexpr (KV_E4M3) {
                KV_copies.stage_next(KV_block, tiles.begin, tiles.end);
            } else if constexpr (eager) {
                const int stage = (KV_block - tiles.begin) % 2;
                const bool has_next = KV_block + 1 < tiles.end;
                if (copy_before_wait) {
                    // Every warp is done with the other stage (tile j - 1): tile j + 1's copies go
                    // there before tile j is waited for.
                    __syncthreads();
                    if (has_next) {
                        KV_copies.copy(KV_block + 1, 1 - stage, copies_whole);
                        wait_for_copies<Kernel, 2>(); // tile j (and Q) have landed
                    } else {
                        wait_for_copies<Kernel, 0>();
                    }
                } else {
                    // Tile j (and Q) have landed, and every warp is done with the other stage.
                    wait_for_copies<Kernel, 0>();
                    if (has_next)
                        KV_copies.copy(KV_block + 1, 1 - stage, copies_whole);
                }
            } else {
                __syncthreads(); // every warp is done with the previous K and V tiles
                KV_copies.copy(KV_block, 0, copies_whole);
                wait_for_copies<Kernel, 1>(); // K_j (and Q) have landed; V_j may still be in flight
            }

            typename Kernel::S_accumulators S_acc;
            typename Kernel::P_fragments P_frags;
            if (warp_has_rows) {
                S_acc.zero();
                using QK_fragments = QKChunkFragments<Kernel>;
                if constexpr (KV_E4M3) {
                    e4m3.scores(S_acc, K_addresses);
                } else {
                    chunked_product<Kernel::QK_chunks, Kernel::mma_double_buffer_loads, QK_fragments>(
                        [&](int chunk, QK_fragments &f) {
                            load_B_from_rows_n(f.K, K_addresses, chunk * Kernel::K_slices_per_load);
                            if constexpr (!Kernel::Q_in_registers)
                                load_A(f.Q, Q_addresses, chunk * Kernel::K_slices_per_load);
                        },
                        [&](int chunk, const QK_fragments &f) {
                            if constexpr (Kernel::Q_in_registers)
                                warp_gemm<value_t>(S_acc, Q_frags, chunk * Kernel::K_slices_per_load, f.K);
                            else
                                warp_gemm<value_t>(S_acc, f.Q, 0, f.K);
                        });
                }

                if constexpr (SCORE_MODS)
                    score_mods.apply(S_acc, params, Q_first_row + warp_first_row, KV_block * B_c + warp_first_key);
                if constexpr (decltype(masked)::value)
                    apply_mask<MASK, MASKED_TAILS>(S_acc, params, Q_first_row + warp_first_row,
                                                   KV_block * B_c + warp_first_key);
                softmax.template update<decltype(first_tile)::value>(S_acc, O_acc, score_scale);
                accumulators_to_A<std::conditional_t<KV_E4M3, half, value_t>>(P_frags, S_acc);
            }

            if constexpr (!eager && !KV_E4M3)
                wait_for_copies<Kernel, 0>(); // V_j has landed
            if (warp_has_rows) {
                using V_fragments = typename Kernel::V_fragments;
                if constexpr (KV_E4M3) {
                    e4m3.accumulate(O_acc, P_frags, V_addresses);
                } else {
                    chunked_product<Kernel::PV_chunks, Kernel::mma_double_buffer_loads, V_fragments>(
                        [&](int chunk, V_fragments &f) {
                            load_B_from_rows_k(f, V_addresses, chunk * Kernel::V_slices_per_load);
                        },
                        [&](int chunk, const V_fragments &f) {
                            warp_gemm<value_t>(O_acc, P_frags, chunk * Kernel::V_slices_per_load, f);
                        });
                }
            }

            if constexpr (KV_E4M3) {
                // Slots 0, 1, 2, 0, ...: from the last slot back to the first.
                constexpr int slots = KVCopies::STAGED_TILES;
                const bool last_slot = (KV_block - tiles.begin) % slots == slots - 1;
                const int shift = (last_slot ? 1 - slots : 1) * KVCopies::staged_slot_bytes;
                K_addresses.shift(shift);
                V_addresses.shift(shift);
            } else if constexpr (eager) {
                K_addresses.shift(next_stage_shift);
                V_addresses.shift(next_stage_shift);
                next_stage_shift = -next_stage_shift;
            }
        };
        const auto process_range = [&](int first, int last, auto masked, auto copies_whole) {
            for (int KV_block = first; KV_block < last; ++KV_block)
                process_KV_tile(KV_block, std::false_type{}, masked, copies_whole);
        };
        // The optimized softmax peels the first KV tile, whose update needs no rescaling.
        walk_kv_tiles<Kernel::optimized_softmax>(
            tiles, [&](int tile, auto masked) { process_KV_tile(tile, std::true_type{}, masked, MayBePartial{}); },
            [&](int first, int last, auto masked) {
                if constexpr (decltype(masked)::value) {
                    process_range(first, last, masked, MayBePartial{});
                } else if constexpr (eager && MASKED_TAILS) {
                    // Unmasked tiles are whole, so only the last unmasked iteration, which copies the
                    // first masked tile, needs predicated copies: it is peeled, keeping the loop's
                    // code that of an aligned problem.
                    process_range(first, last - 1, masked, Whole{});
                    process_range(max(first, last - 1), last, masked, MayBePartial{});
                } else {
                    process_range(first, last, masked, Whole{});
                }
            });
    }

    if constexpr (Kernel::key_groups > 1)
        merge_key_groups<Kernel, KVCopies::smem_bytes>(softmax, O_acc, reinterpret_cast<float *>(smem), score_scale);
    if constexpr (KV_E4M3) {
        E4M3CacheProducts<Kernel>::unpermute_O(O_acc);
        O_acc.scale(descale_at(params.descales.v, batch, kv_head));
    }
    if (num_splits > 1) {
        if (!warp_holds_result)
            return;
        float *lse = params.split.lse_partial + split * params.split.lse_split_stride;
        finish_softmax(softmax, O_acc, score_scale, lse, params, batch, head, Q_first_row, warp_first_row, Q_rows);
        float *O_partial = tensor_rows<float>(params.split.o_partial, params.o_strides, batch, head, 0) +
                           split * params.split.o_split_stride;
        store_partial_O(
            [&](int row) {
                return O_partial + row_offset(Q_first_row + row, params.o_strides.seq, params.o_query_stride, params);
            },
            O_acc, warp_first_row, Q_rows, params.d_head);
        return;
    }
    if (warp_holds_result)
        finish_softmax(softmax, O_acc, score_scale, params.lse, params, batch, head, Q_first_row, warp_first_row, Q_rows);
    store_O<Kernel>(Q_smem, O_acc, warp_first_row, warp_holds_result, [&](const typename Kernel::Q_tile &tile) {
        if constexpr (VARLEN)
            copy_shared_to_global_rows<n_threads, MASKED_TAILS, MASKED_TAILS>(
                [&](int row) {
                    return O + row_offset(Q_first_row + row, params.o_strides.seq, params.o_query_stride, params);
                },
                tile, Q_rows, params.d_head);
        else
            copy_shared_to_global<n_threads, MASKED_TAILS, MASKED_TAILS>(O, params.o_strides.seq, tile, Q_rows,
                                                                         params.d_head);
    });
}

} // namespace flash::sm80
