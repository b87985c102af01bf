// The SM80 family's K and V tiles in shared memory (per stage, after Q) and the copies that fill
// them from one (batch, kv_head)'s rows, or with VARLEN from a paged cache's pages. With KV_E4M3 the
// rows are an FP8 cache's e4m3 values, which stay e4m3 in shared memory: the products read them
// there and widen them in registers (e4m3_cache.cuh).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/forward_params.h"
#include "common/sequence.cuh"
#include "sm80/load_store.cuh"

namespace flash::sm80 {

template <typename Kernel, bool MASKED_TAILS, bool VARLEN, bool KV_E4M3>
struct KVTileCopies {
    using value_t = typename Kernel::value_t;
    using KV_tile = typename Kernel::KV_tile;
    // What global memory holds: K and V of q's type, or an FP8 cache's bytes.
    using stored_t = std::conditional_t<KV_E4M3, uint8_t, value_t>;
    // An e4m3 tile as it arrives: B_c rows of d_head bytes, moved as 16-bit words (the copies'
    // elements), laid out as a 16-bit tile of half the columns.
    using Staged_tile = SmemTile<uint16_t, Kernel::B_c, Kernel::d_head / 2, Kernel::swizzled>;
    using Arriving_tile = std::conditional_t<KV_E4M3, Staged_tile, KV_tile>;
    using copied_t = typename Arriving_tile::value_t;
    static constexpr int copied_per_stored = sizeof(copied_t) / sizeof(stored_t);

    // With KV_E4M3, tiles are copied STAGED_TILES - 1 ahead of the products, each into a slot of
    // its own: at tile j the block waits for tile j, meets one barrier (every warp is done with
    // tile j - 1's slot), copies tile j + STAGED_TILES - 1 there and multiplies tile j. An e4m3
    // tile is half a 16-bit tile's bytes, so two in flight keep as many bytes arriving as the
    // 16-bit schedule's one. Four slots, with tile j + 2's copies issued before the wait for tile
    // j (so that a paged copy's page lookups overlap the wait), measured no faster paged and 1 to
    // 3% slower dense (H200, benchmarks/HISTORY.md #2026-11-28-fp8-cache-registers).
    static constexpr int STAGED_TILES = 3;
    // The cp.async groups (a tile's K and V) a thread may leave in flight when its next tile must
    // have landed.
    static constexpr int GROUPS_AHEAD = 2 * (STAGED_TILES - 2);
    static constexpr int staged_slot_bytes = 2 * Staged_tile::size * static_cast<int>(sizeof(uint16_t));

    // The block's shared memory: the traits' (Q, then each stage's K and V), or with KV_E4M3 Q, then
    // the staged tiles' slots.
    static constexpr int smem_bytes =
        KV_E4M3 ? Kernel::Q_tile::size * static_cast<int>(sizeof(value_t)) + STAGED_TILES * staged_slot_bytes
                : Kernel::smem_bytes;

    const ForwardParams &params;
    value_t *KV_smem; // the first stage's K tile (with KV_E4M3, the first slot's)
    const stored_t *K; // the first key's row (paged: row 0 of page 0, at the head)
    const stored_t *V;
    int64_t K_tile_stride;
    int64_t V_tile_stride;
    // VARLEN: the sequence's row of a paged cache's block table (PagedKV), or null for keys in
    // rows K_tile_stride / B_c apart.
    const int *page_table;

    // The pages of this thread's rows of tile KV_block: a paged copy reads a page per group of
    // PagedKV::ROWS_MULTIPLE keys (which never straddles two pages), and a thread's consecutive
    // steps of fewer rows share their group's page. Per group: the page (page_at: clamped into the
    // pool) and the group's first row in it.
    using Plan = TileCopyPlan<Kernel::n_threads, Arriving_tile>;
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

    // Where a stage's K and V tiles arrive: the tiles themselves, or with KV_E4M3 that slot's staged
    // tiles.
    __device__ __forceinline__ Arriving_tile K_arriving(int stage) const {
        if constexpr (KV_E4M3)
            return Staged_tile{staging() + 2 * stage * Staged_tile::size};
        else
            return K_smem(stage);
    }
    __device__ __forceinline__ Arriving_tile V_arriving(int stage) const {
        if constexpr (KV_E4M3)
            return Staged_tile{staging() + (2 * stage + 1) * Staged_tile::size};
        else
            return V_smem(stage);
    }

    // Issues the copies of KV tile KV_block into a stage: K's as one cp.async group, then V's. With
    // masked tails, columns past the call's d_head arrive as zeros (a smaller head size runs in
    // place), and a tile that may be the partial last one is copied with row predicates too: rows
    // past the last key arrive as zeros, so they add nothing to P V.
    template <typename Whole>
    __device__ __forceinline__ void copy(int KV_block, int stage, Whole) const {
        constexpr bool async_copy = Kernel::async_copy;
        constexpr int n_threads = Kernel::n_threads;
        const copied_t *K_tile = copied(K + KV_block * K_tile_stride);
        const copied_t *V_tile = copied(V + KV_block * V_tile_stride);
        const int64_t K_row_stride = params.k_strides.seq / copied_per_stored;
        const int64_t V_row_stride = params.v_strides.seq / copied_per_stored;
        if constexpr (MASKED_TAILS) {
            constexpr bool partial_rows = !Whole::value;
            const int rows = params.seqlen_k - KV_block * Kernel::B_c;
            const int cols = params.d_head / copied_per_stored;
            if (VARLEN && page_table != nullptr) {
                const GroupPages pages = group_pages(KV_block);
                const auto paged_row = [&](const stored_t *base, const TensorStrides &strides) {
                    return [&, base](int i, int row) {
                        const int g = i / steps_per_group;
                        return copied(base + pages.page[g] * strides.batch +
                                      (pages.first_row[g] + (row & (KEY_GROUP - 1))) * strides.seq);
                    };
                };
                copy_rows_global_to_shared<async_copy, n_threads, partial_rows, true>(
                    K_arriving(stage), paged_row(K, params.k_strides), rows, cols);
                copy_rows_global_to_shared<async_copy, n_threads, partial_rows, true>(
                    V_arriving(stage), paged_row(V, params.v_strides), rows, cols);
                return;
            }
            copy_global_to_shared<async_copy, n_threads, partial_rows, true>(K_arriving(stage), K_tile, K_row_stride, rows, cols);
            copy_global_to_shared<async_copy, n_threads, partial_rows, true>(V_arriving(stage), V_tile, V_row_stride, rows, cols);
        } else {
            copy_global_to_shared<async_copy, n_threads>(K_arriving(stage), K_tile, K_row_stride);
            copy_global_to_shared<async_copy, n_threads>(V_arriving(stage), V_tile, V_row_stride);
        }
    }

    // KV_E4M3's schedule, before the walk over [begin, end): the copies of its first
    // STAGED_TILES - 1 tiles into the slots of those numbers.
    __device__ __forceinline__ void stage_first(int begin, int end) const {
#pragma unroll
        for (int slot = 0; slot < STAGED_TILES - 1; ++slot)
            stage(begin + slot, end, slot);
    }

    // KV_E4M3's schedule, at tile j (the i-th of the walk from `begin`), before its products read
    // slot i % STAGED_TILES: once tile j has landed and past one barrier (tile j visible to every
    // warp, and every warp done with tile j - 1's products), tile j + STAGED_TILES - 1's copies
    // into the slot tile j - 1 left.
    __device__ __forceinline__ void stage_next(int KV_block, int begin, int end) const {
        const int ahead = STAGED_TILES - 1;
        if constexpr (Kernel::async_copy)
            ptx::cp_async_wait<GROUPS_AHEAD>();
        __syncthreads();
        stage(KV_block + ahead, end, (KV_block - begin + ahead) % STAGED_TILES);
    }

  private:
    __device__ __forceinline__ uint16_t *staging() const { return reinterpret_cast<uint16_t *>(KV_smem); }

    // Tile `tile`'s copies into a slot, or past the walk's end two empty groups, so that every tile
    // of the walk is GROUPS_AHEAD groups behind the last.
    __device__ __forceinline__ void stage(int tile, int end, int slot) const {
        static_assert(KV_E4M3, "only an FP8 cache's tiles are staged");
        if (tile < end) {
            copy(tile, slot, std::false_type{});
        } else if constexpr (Kernel::async_copy) {
            ptx::cp_async_commit();
            ptx::cp_async_commit();
        }
    }

    static __device__ __forceinline__ const copied_t *copied(const stored_t *p) {
        return reinterpret_cast<const copied_t *>(p);
    }
};

} // namespace flash::sm80
