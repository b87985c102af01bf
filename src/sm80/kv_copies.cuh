// The SM80 family's K and V tiles in shared memory (per stage, after Q) and the copies that fill
// them from one (batch, kv_head)'s rows, or with VARLEN from a paged cache's pages. With KV_E4M3 the
// rows are an FP8 cache's e4m3 values: each tile arrives in a staging tile of its own and is
// widened to q's type in shared memory (widen_next), so that the products read it as they read a
// 16-bit tile.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/e4m3.cuh"
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

    // With KV_E4M3, a three-step pipeline: at tile j the block copies tile j + 2 into a staged
    // tile, widens tile j + 1 into one of two widened stages and multiplies tile j from the other,
    // with one barrier per tile, so that a warp's widening (shared-memory loads and stores,
    // conversions) and its products overlap. Measured against the widening and the products in
    // turns between two barriers per tile (four staged tiles): 0 to +2% with one query, up to +7%
    // with four at 1 x 8k (H200, benchmarks/HISTORY.md #2026-11-27-widen-ahead).
    static constexpr int STAGED_TILES = 2;
    static constexpr int WIDENED_STAGES = 2;
    // The cp.async groups (a tile's K and V) a thread may leave in flight when its next tile must
    // have landed.
    static constexpr int GROUPS_AHEAD = 2 * (STAGED_TILES - 1);

    // The block's shared memory: the traits' (Q, then each stage's K and V), or with KV_E4M3 Q, two
    // stages' K and V (the widened tiles), then the staged tiles.
    static constexpr int smem_bytes =
        KV_E4M3 ? (Kernel::Q_tile::size + WIDENED_STAGES * Kernel::KV_stage_elems) * static_cast<int>(sizeof(value_t)) +
                      STAGED_TILES * 2 * Staged_tile::size * static_cast<int>(sizeof(uint16_t))
                : Kernel::smem_bytes;

    const ForwardParams &params;
    value_t *KV_smem; // the first stage's K tile
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

    // Where a stage's K and V tiles arrive: the tiles themselves, or with KV_E4M3 the staging tiles
    // of that slot.
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

    // KV_E4M3's schedule, before the walk over [begin, end): the copies of its first two tiles
    // into staged tiles 0 and 1, and the first one's widening into widened stage 0 once it has
    // landed. Each thread copies and widens the same chunks (one plan), so it waits for its own
    // copies alone, and a staged tile it widened is free for its next copy without a barrier.
    __device__ __forceinline__ void stage_first(int begin, int end) const {
        stage(begin, end, 0);
        stage(begin + 1, end, 1);
        if constexpr (Kernel::async_copy)
            ptx::cp_async_wait<GROUPS_AHEAD>();
        widen_into(0, 0);
    }

    // KV_E4M3's schedule, at tile j (the i-th of the walk from `begin`), before its products read
    // widened stage i % 2: tile j + 2's copies issued into the staged tile that tile j left, then,
    // once tile j + 1 has landed and every warp is done with tile j - 1's products (which read
    // widened stage (i + 1) % 2) and past one barrier, which also makes tile j's widened values
    // visible, tile j + 1 widened into that stage.
    __device__ __forceinline__ void widen_next(int KV_block, int begin, int end) const {
        const int i = KV_block - begin;
        stage(KV_block + 2, end, i % STAGED_TILES);
        if constexpr (Kernel::async_copy)
            ptx::cp_async_wait<GROUPS_AHEAD>();
        __syncthreads();
        if (KV_block + 1 < end)
            widen_into((i + 1) % STAGED_TILES, (i + 1) % WIDENED_STAGES);
    }

  private:
    __device__ __forceinline__ uint16_t *staging() const {
        return reinterpret_cast<uint16_t *>(KV_smem + WIDENED_STAGES * Kernel::KV_stage_elems);
    }

    __device__ __forceinline__ void widen_into(int staged, int widened) const {
        widen_tile(K_arriving(staged), K_smem(widened));
        widen_tile(V_arriving(staged), V_smem(widened));
    }

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

    // Each 16-byte chunk of 16 e4m3 values becomes the two 16-byte chunks of their 16-bit values, at
    // the same row and twice the column (zeros, the copies' fill past a tile's keys or d_head, widen
    // to zeros).
    static __device__ __forceinline__ void widen_tile(const Staged_tile &src, const KV_tile &dst) {
#pragma unroll
        for (int i = 0; i < Plan::steps; ++i) {
            if (!Plan::exists(i))
                continue;
            const int row = Plan::row(i), col = Plan::col(i);
            const uint4 bytes = *reinterpret_cast<const uint4 *>(src.at(row, col));
            *reinterpret_cast<uint4 *>(dst.at(row, 2 * col)) = widen_e4m3x8<value_t>(uint2{bytes.x, bytes.y});
            *reinterpret_cast<uint4 *>(dst.at(row, 2 * col + ELEMS_PER_COPY)) =
                widen_e4m3x8<value_t>(uint2{bytes.z, bytes.w});
        }
    }
};

} // namespace flash::sm80
