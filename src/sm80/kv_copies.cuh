// The SM80 family's K and V tiles in shared memory (per stage, after Q) and the copies that fill
// them from one (batch, kv_head)'s rows, or with VARLEN from a paged cache's pages.
#pragma once

#include <cstdint>

#include "common/forward_params.h"
#include "sm80/load_store.cuh"

namespace flash::sm80 {

template <typename Kernel, bool MASKED_TAILS, bool VARLEN>
struct KVTileCopies {
    using value_t = typename Kernel::value_t;
    using KV_tile = typename Kernel::KV_tile;

    const ForwardParams &params;
    value_t *KV_smem; // the first stage's K tile
    const value_t *K; // the first key's row (paged: row 0 of page 0, at the head)
    const value_t *V;
    int64_t K_tile_stride;
    int64_t V_tile_stride;
    // VARLEN: the sequence's row of a paged cache's block table (PagedKV), or null for keys in
    // rows K_tile_stride / B_c apart.
    const int *page_table;

    // Where key `key` of a paged cache is, in elements from row 0 of page 0. The table's column and
    // the page are clamped, so keys past the sequence (which the copies do not read) and entries
    // past the pool have an address inside the tensors.
    __device__ __forceinline__ int64_t paged_offset(int key, int64_t page_stride, int64_t row_stride) const {
        const PagedKV &paged = params.sequences.paged;
        const int slot = min(key / paged.page_size, paged.pages_per_sequence - 1);
        const int page = min(max(page_table[slot], 0), paged.num_pages - 1);
        return page * page_stride + (key % paged.page_size) * row_stride;
    }

    __device__ __forceinline__ KV_tile K_smem(int stage) const { return KV_tile{KV_smem + stage * Kernel::KV_stage_elems}; }
    __device__ __forceinline__ KV_tile V_smem(int stage) const {
        return KV_tile{KV_smem + stage * Kernel::KV_stage_elems + KV_tile::size};
    }

    // Issues the copies of KV tile KV_block into a stage: K's as one cp.async group, then V's. With
    // masked tails, columns past the call's d_head arrive as zeros (a smaller head size runs in
    // place), and a tile that may be the partial last one is copied with row predicates too: rows
    // past the last key arrive as zeros, so they add nothing to P V.
    template <typename Whole>
    __device__ __forceinline__ void copy(int KV_block, int stage, Whole) const {
        constexpr bool async_copy = Kernel::async_copy;
        constexpr int n_threads = Kernel::n_threads;
        const value_t *K_tile = K + KV_block * K_tile_stride;
        const value_t *V_tile = V + KV_block * V_tile_stride;
        if constexpr (MASKED_TAILS) {
            constexpr bool partial_rows = !Whole::value;
            const int rows = params.seqlen_k - KV_block * Kernel::B_c;
            if (VARLEN && page_table != nullptr) {
                // A tile's rows may lie on several pages: each row's address is looked up.
                const int first_key = KV_block * Kernel::B_c;
                const TensorStrides &k_strides = params.k_strides, &v_strides = params.v_strides;
                copy_rows_global_to_shared<async_copy, n_threads, partial_rows, true>(
                    K_smem(stage), [&](int row) { return K + paged_offset(first_key + row, k_strides.batch, k_strides.seq); },
                    rows, params.d_head);
                copy_rows_global_to_shared<async_copy, n_threads, partial_rows, true>(
                    V_smem(stage), [&](int row) { return V + paged_offset(first_key + row, v_strides.batch, v_strides.seq); },
                    rows, params.d_head);
                return;
            }
            copy_global_to_shared<async_copy, n_threads, partial_rows, true>(K_smem(stage), K_tile, params.k_strides.seq,
                                                                             rows, params.d_head);
            copy_global_to_shared<async_copy, n_threads, partial_rows, true>(V_smem(stage), V_tile, params.v_strides.seq,
                                                                             rows, params.d_head);
        } else {
            copy_global_to_shared<async_copy, n_threads>(K_smem(stage), K_tile, params.k_strides.seq);
            copy_global_to_shared<async_copy, n_threads>(V_smem(stage), V_tile, params.v_strides.seq);
        }
    }
};

} // namespace flash::sm80
