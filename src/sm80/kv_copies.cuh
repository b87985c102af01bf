// The SM80 family's K and V tiles in shared memory (per stage, after Q) and the copies that fill
// them from one (batch, kv_head)'s rows, or with VARLEN from a paged cache's pages.
#pragma once

#include <cstdint>

#include "common/forward_params.h"
#include "common/sequence.cuh"
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

    // The pages of this thread's rows of tile KV_block: a paged copy reads a page per group of
    // PagedKV::ROWS_MULTIPLE keys (which never straddles two pages), and a thread's consecutive
    // steps of fewer rows share their group's page. Per group: the page (page_at: clamped into the
    // pool) and the group's first row in it.
    using Plan = TileCopyPlan<Kernel::n_threads, KV_tile>;
    static constexpr int KEY_GROUP = PagedKV::ROWS_MULTIPLE;
    static_assert(Kernel::B_c % KEY_GROUP == 0, "a tile's first key starts a group");
    static constexpr int steps_per_group =
        Plan::regular && Plan::rows_per_step < KEY_GROUP ? KEY_GROUP / Plan::rows_per_step : 1;
    static constexpr int groups = (Plan::steps + steps_per_group - 1) / steps_per_group;
    struct GroupPages {
        int page[groups];
        int first_row[groups];
    };
    __device__ __forceinline__ GroupPages group_pages(int KV_block) const {
        const PagedKV &paged = params.sequences.paged;
        GroupPages pages;
#pragma unroll
        for (int g = 0; g < groups; ++g) {
            const int key = KV_block * Kernel::B_c + (Plan::row(g * steps_per_group) & ~(KEY_GROUP - 1));
            const int slot = key / paged.page_size;
            pages.page[g] = page_at(paged, page_table, slot);
            pages.first_row[g] = key - slot * paged.page_size;
        }
        return pages;
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
                const GroupPages pages = group_pages(KV_block);
                const auto paged_row = [&](const value_t *base, const TensorStrides &strides) {
                    return [&, base](int i, int row) {
                        const int g = i / steps_per_group;
                        return base + pages.page[g] * strides.batch +
                               (pages.first_row[g] + (row & (KEY_GROUP - 1))) * strides.seq;
                    };
                };
                copy_rows_global_to_shared<async_copy, n_threads, partial_rows, true>(
                    K_smem(stage), paged_row(K, params.k_strides), rows, params.d_head);
                copy_rows_global_to_shared<async_copy, n_threads, partial_rows, true>(
                    V_smem(stage), paged_row(V, params.v_strides), rows, params.d_head);
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
