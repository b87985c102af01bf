// The producer: the TMA loads of Q, K and V with their barriers (TileLoader), and the producer
// warpgroup's loop over the work tiles the scheduler gives its block (produce).
#pragma once

#include <cstdint>

#include "common/forward_params.h"
#include "common/ptx.cuh"
#include "common/sequence.cuh"
#include "sm90/box_coordinates.cuh"
#include "sm90/kernel_params.h"
#include "sm90/sequence_tensor_maps.cuh"
#include "sm90/shared_tiles.cuh"
#include "sm90/tile_scheduler.cuh"
#include "sm90/tma.cuh"
#include "sm90/wgmma.cuh"

namespace flash::sm90 {

// Issues one work tile's TMA loads; run by a single thread. The KV tile at position n of the
// block's stream of KV tiles goes to stage n % stages, in round n / stages, once the consumers
// have released that stage's previous round; a warpgroup's Q block for the block's n-th work tile,
// once that warpgroup has released the last one.
template <typename Kernel, typename Scheduler, bool VARLEN>
struct TileLoader {
    const KernelParams &kp;
    const SharedTiles<Kernel> &smem;
    int head;
    int kv_head;
    BoxCoordinates q_boxes; // of the work tile's sequence
    BoxCoordinates kv_boxes;
    KVPages pages; // of a paged sequence
    KVTensorMaps kv_maps;
    uint32_t rank; // in the cluster

    // Q of the n-th work tile, numbered `index`; a persistent block's producer also tells each
    // warpgroup that index. A work tile whose rows attend no key loads no Q.
    __device__ __forceinline__ void load_Q(int first_row, int n, int index, bool loads) const {
#pragma unroll
        for (int wg = 0; wg < Kernel::consumer_warpgroups; ++wg) {
            mbarrier_wait(smem.Q_empty(wg), (n & 1) ^ 1);
            Scheduler::hand_off(smem.work_slot(wg), index); // the arrival below releases it to the waiters
            if (!loads) {
                mbarrier_arrive(smem.Q_full(wg));
                continue;
            }
            mbarrier_arrive_expect_bytes(smem.Q_full(wg), Kernel::wg_Q_bytes);
#pragma unroll
            for (int c = 0; c < Kernel::col_blocks; ++c)
                q_boxes.load(smem.Q(wg) + c * Kernel::Q_col_block_bytes, &kp.q, smem.Q_full(wg), c * Kernel::Swizzle::cols,
                             first_row + wg * WGMMA_M, head);
        }
    }

    __device__ __forceinline__ void load_KV(int tile, int n) const {
        const int round = n / Kernel::stages;
        const int stage = n % Kernel::stages;
        const uint32_t released_parity = (round & 1) ^ 1;
        if (VARLEN && pages.table != nullptr) {
            load_paged_tile(kv_maps.k(), &kp.k, smem.K(stage), smem.K_empty(stage), smem.K_full(stage), released_parity, tile);
            load_paged_tile(kv_maps.v(), &kp.v, smem.V(stage), smem.V_empty(stage), smem.V_full(stage), released_parity, tile);
            prefetch_page_entries(tile + 1);
            return;
        }
        load_tile(kv_maps.k(), smem.K(stage), smem.K_empty(stage), smem.K_full(stage), released_parity, tile);
        if constexpr (Kernel::V_transposed_copy) {
            // The kernel may have started while the copy's last blocks ran (launcher.cuh).
            if (n == 0)
                ptx::wait_for_prerequisite_grids();
            load_transposed_V_tile(kv_maps.v(), smem.V(stage), smem.V_empty(stage), smem.V_full(stage), released_parity, tile);
        } else
            load_tile(kv_maps.v(), smem.V(stage), smem.V_empty(stage), smem.V_full(stage), released_parity, tile);
    }

  private:
    __device__ __forceinline__ void load_tile(const CUtensorMap *map, uint8_t *dst, uint64_t *empty, uint64_t *full,
                                              uint32_t released_parity, int tile) const {
        // With multicast this block's slice goes to both blocks of the cluster, so the empty
        // barrier counts both blocks' consumers, and each block's full barrier both slices' bytes.
        mbarrier_wait(empty, released_parity);
        mbarrier_arrive_expect_bytes(full, Kernel::KV_tile_bytes);
#pragma unroll
        for (int c = 0; c < Kernel::col_blocks; ++c) {
            uint8_t *const slice = dst + c * Kernel::KV_col_block_bytes + rank * Kernel::KV_slice_bytes;
            const int first_row = tile * Kernel::B_c + rank * Kernel::KV_slice_rows;
            if constexpr (Kernel::multicast)
                kv_boxes.load_multicast(slice, map, full, CLUSTER_MASK, c * Kernel::Swizzle::cols, first_row, kv_head);
            else
                kv_boxes.load(slice, map, full, c * Kernel::Swizzle::cols, first_row, kv_head);
        }
    }

    // With V_transposed_copy, a tile of V's transposed copy (whose map's columns are keys and rows
    // d_head: tensor_maps.h), as P V's operand: column blocks of one swizzled row's keys by d_head.
    __device__ __forceinline__ void load_transposed_V_tile(const CUtensorMap *map, uint8_t *dst, uint64_t *empty,
                                                           uint64_t *full, uint32_t released_parity, int tile) const {
        using Vt_Swizzle = typename Kernel::Vt_Swizzle;
        mbarrier_wait(empty, released_parity);
        mbarrier_arrive_expect_bytes(full, Kernel::KV_tile_bytes);
#pragma unroll
        for (int c = 0; c < Kernel::B_c / Vt_Swizzle::cols; ++c)
            kv_boxes.load(dst + c * Kernel::Vt_col_block_bytes, map, full, tile * Kernel::B_c + c * Vt_Swizzle::cols, 0,
                          kv_head);
    }

    // The page of the box of a paged sequence's keys that starts at `key`.
    __device__ __forceinline__ int page_of(int key) const {
        const PagedKV &paged = kp.params.sequences.paged;
        return page_at(paged, pages.table, key / paged.page_size);
    }

    // Brings the table's entries of a tile's keys (consecutive ints, at most two lines) into L1 ahead
    // of that tile's loads, which then wait for an L1 hit per box rather than for global memory: the
    // loading thread's KV tiles are only `stages` ahead of the consumers.
    __device__ __forceinline__ void prefetch_page_entries(int tile) const {
        const PagedKV &paged = kp.params.sequences.paged;
        const int first_key = tile * Kernel::B_c + rank * Kernel::KV_slice_rows;
        const int last_key = min(first_key + Kernel::KV_slice_rows, pages.keys) - 1;
        if (first_key > last_key)
            return;
        ptx::prefetch_l1(pages.table + first_key / paged.page_size);
        ptx::prefetch_l1(pages.table + last_key / paged.page_size);
    }

    // This block's slice of a paged sequence's KV tile, in boxes of kp.page_box_rows rows, each
    // from its page. The box that reaches past the sequence's last key loads through the sequence's
    // bound map (its rows past that key read as zeros), the others through the call's; a box wholly
    // past the last key asks for rows past the page's end, which read as zeros too, so every box
    // brings its bytes.
    __device__ __forceinline__ void load_paged_tile(const CUtensorMap *bound_map, const CUtensorMap *call_map, uint8_t *dst,
                                                    uint64_t *empty, uint64_t *full, uint32_t released_parity,
                                                    int tile) const {
        const int page_size = kp.params.sequences.paged.page_size;
        const int box_rows = kp.page_box_rows;
        const int first_key = tile * Kernel::B_c + rank * Kernel::KV_slice_rows;
        mbarrier_wait(empty, released_parity);
        mbarrier_arrive_expect_bytes(full, Kernel::KV_tile_bytes);
#pragma unroll 1
        for (int first = 0; first < Kernel::KV_slice_rows; first += box_rows) {
            const int key = first_key + first;
            const bool past_end = key >= pages.keys;
            const CUtensorMap *const map = !past_end && key + box_rows > pages.keys ? bound_map : call_map;
            const int page = past_end ? 0 : page_of(key);
            const int row = past_end ? page_size : key % page_size;
#pragma unroll
            for (int c = 0; c < Kernel::col_blocks; ++c) {
                uint8_t *const box_dst =
                    dst + c * Kernel::KV_col_block_bytes + rank * Kernel::KV_slice_bytes + first * Kernel::Swizzle::bytes;
                if constexpr (Kernel::multicast)
                    tma_load_4d_multicast(box_dst, map, full, CLUSTER_MASK, c * Kernel::Swizzle::cols, row, kv_head, page);
                else
                    tma_load_4d(box_dst, map, full, c * Kernel::Swizzle::cols, row, kv_head, page);
            }
        }
    }

    static constexpr uint16_t CLUSTER_MASK = (1u << Kernel::cluster_size) - 1;
};

// The producer warpgroup's thread, with warp specialization: each work tile's Q and the KV tiles
// the block loads for it, running ahead of the consumers as far as the stages allow. A persistent
// block asks for its next work tile as it starts loading this one.
template <typename Kernel, typename Tiles, bool VARLEN, typename Scheduler>
__device__ __forceinline__ void produce(const KernelParams &kp, const SharedTiles<Kernel> &smem,
                                        const Scheduler &scheduler, int group_size, uint32_t rank) {
    using Loader = TileLoader<Kernel, Scheduler, VARLEN>;
    KVTensorMapBinder<Kernel, VARLEN> kv_maps{kp};
    int n = 0;        // work tiles loaded so far
    int KV_loads = 0; // KV tiles loaded so far: the position in the pipeline
    for (int index = scheduler.first(); index < scheduler.end();) {
        const int asked = scheduler.ask(index);
        const auto [work, sequence] = locate_work<VARLEN>(kp.params, scheduler, index);
        const ForwardParams &params = sequence.params;
        const Tiles tiles(params, work.Q_block * Kernel::B_r);
        const auto [first_tile, end_tile] = loaded_tiles<Kernel::cluster_size>(params, work, tiles, Kernel::B_r);
        const Loader loader{kp,
                            smem,
                            work.head,
                            work.head / group_size,
                            q_boxes(sequence),
                            kv_boxes(sequence),
                            kv_pages(sequence),
                            kv_maps.bind(sequence, first_tile, end_tile),
                            rank};
        loader.load_Q(work.Q_block * Kernel::B_r, n, index, !tiles.empty() && work.Q_block < work.Q_blocks);
        for (int tile = first_tile; tile < end_tile; ++tile)
            loader.load_KV(tile, KV_loads++);
        index = scheduler.agree(asked, n, smem);
        ++n;
    }
    // The end, as a work tile past the last that loads nothing.
    if constexpr (Kernel::persistent)
        Loader{kp, smem, 0, 0, {}, {}, {}, call_tensor_maps(kp), rank}.load_Q(0, n, scheduler.end(), false);
    // A block that loaded no V tile ends after V's transposed copy too, so that the kernel's end is the
    // copy's (the call frees the copy's memory once the kernel is done).
    if constexpr (Kernel::V_transposed_copy)
        ptx::wait_for_prerequisite_grids();
    // Where the producer warpgroup transposes V, the end of the V tiles for the warps that transpose
    // them: their count, and an arrival without bytes on the next stage's V barrier once that stage is free.
    if constexpr (Kernel::transposes_V) {
        const int stage = KV_loads % Kernel::stages;
        mbarrier_wait(smem.V_empty(stage), (KV_loads / Kernel::stages % 2) ^ 1);
        *smem.V_stream_end(stage) = KV_loads;
        mbarrier_arrive(smem.V_full(stage));
    }
}

} // namespace flash::sm90
