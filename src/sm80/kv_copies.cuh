// The SM80 family's K and V tiles in shared memory (per stage, after Q) and the copies that fill
// them from one (batch, kv_head)'s rows.
#pragma once

#include <cstdint>

#include "common/forward_params.h"
#include "sm80/load_store.cuh"

namespace flash::sm80 {

template <typename Kernel, bool MASKED_TAILS>
struct KVTileCopies {
    using value_t = typename Kernel::value_t;
    using KV_tile = typename Kernel::KV_tile;

    const ForwardParams &params;
    value_t *KV_smem; // the first stage's K tile
    const value_t *K; // the first key's row
    const value_t *V;
    int64_t K_tile_stride;
    int64_t V_tile_stride;

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
