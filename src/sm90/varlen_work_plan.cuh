// A varlen call's work plan: the list of its work tiles, longest sequences first, written by a
// one-block kernel launched ahead of the attention kernel. Without it the work tiles would be
// numbered over the longest sequence's query blocks for every sequence, and a block would pass over
// those past a shorter sequence's rows one by one (an atomic and a read of the sequence each);
// and the sequences would run in batch order, so that a long one last leaves the GPU idle but for
// it. With the plan every listed tile has rows, and a sequence's tiles come before those of every
// shorter sequence (by keys, which is what a work tile's time grows with): the longest-processing-
// time-first order, so that the last wave is short tiles.
//
// The plan lies at the start of the call's scratch (ForwardParams::scratch): the number of tiles,
// then one PlannedTile each, then the planning kernel's own arrays.
#pragma once

#include <cstdint>

#include <cub/block/block_scan.cuh>

#include "common/common.h"
#include "common/forward_params.h"
#include "common/problem_variant.h"
#include "common/sequence.cuh"

namespace flash::sm90 {

// One work tile: B_r query rows (cluster blocks of them) of one (sequence, head).
struct alignas(16) PlannedTile {
    int batch;
    int head;
    int first_Q_block; // the cluster's first
    int Q_blocks;      // of the sequence
};

// Where the plan's parts lie in the scratch, for a call of `batch` sequences: at most `capacity`
// tiles (host and device agree on it through the launcher, which sizes the scratch).
struct VarlenPlanLayout {
    static constexpr int64_t header_bytes = sizeof(PlannedTile); // the count, padded to a tile
    int64_t capacity;
    int batch;

    __host__ __device__ int64_t tiles_offset() const { return header_bytes; }
    // Per sequence: its key count (the sort key), then its position in the order, then the tiles
    // before each position (batch + 1 prefix sums).
    __host__ __device__ int64_t keys_offset() const { return tiles_offset() + capacity * sizeof(PlannedTile); }
    __host__ __device__ int64_t order_offset() const { return keys_offset() + batch * sizeof(int); }
    __host__ __device__ int64_t prefix_offset() const { return order_offset() + batch * sizeof(int); }
    __host__ __device__ int64_t bytes() const { return prefix_offset() + (batch + 1) * sizeof(int); }
};

// The plan's count and tiles, as the attention kernel reads them.
__device__ __forceinline__ int planned_tile_count(const void *scratch) { return *static_cast<const int *>(scratch); }
__device__ __forceinline__ const PlannedTile *planned_tiles(const void *scratch) {
    return reinterpret_cast<const PlannedTile *>(static_cast<const uint8_t *>(scratch) + VarlenPlanLayout::header_bytes);
}

constexpr int PLAN_THREADS = 1024;
// Sequences sorted by their keys up to this many (a comparison of every pair); a larger batch
// keeps its own order.
constexpr int PLAN_SORTED_SEQUENCES = 4096;

// The planning kernel, one block of PLAN_THREADS. Work tiles of one (sequence, head) are listed
// with the query block fastest and, under a mask, the last query blocks (which see the most keys)
// first, as the dense numbering does (WorkTile).
template <int B_r, int cluster, MaskKind MASK>
__global__ void __launch_bounds__(PLAN_THREADS) varlen_plan_forward_kernel(const ForwardParams params, VarlenPlanLayout layout) {
    using Scan = cub::BlockScan<int, PLAN_THREADS>;
    __shared__ typename Scan::TempStorage scan_storage;
    __shared__ int sorted_keys[PLAN_SORTED_SEQUENCES];
    uint8_t *const scratch = static_cast<uint8_t *>(params.scratch);
    int *const keys = reinterpret_cast<int *>(scratch + layout.keys_offset());
    int *const order = reinterpret_cast<int *>(scratch + layout.order_offset());
    int *const prefix = reinterpret_cast<int *>(scratch + layout.prefix_offset());
    PlannedTile *const tiles = reinterpret_cast<PlannedTile *>(scratch + layout.tiles_offset());
    const int batch = layout.batch;
    const bool sorts = batch <= PLAN_SORTED_SEQUENCES;
    const auto Q_blocks_of = [&](int b) { return (Sequence<true>(params, b).q_rows.length + B_r - 1) / B_r; };
    const auto Q_groups_of = [](int Q_blocks) { return (Q_blocks + cluster - 1) / cluster; };

    for (int b = threadIdx.x; b < batch; b += PLAN_THREADS) {
        keys[b] = Sequence<true>(params, b).k_rows.length;
        if (sorts)
            sorted_keys[b] = keys[b];
    }
    __syncthreads();
    // The position of sequence b: after every sequence with more keys, and those with as many
    // that come before it.
    for (int b = threadIdx.x; b < batch; b += PLAN_THREADS) {
        int position = b;
        if (sorts) {
            position = 0;
            const int key = sorted_keys[b];
            for (int j = 0; j < batch; ++j)
                position += sorted_keys[j] > key || (sorted_keys[j] == key && j < b);
        }
        order[position] = b;
    }
    __syncthreads();
    // The tiles before each position.
    int carry = 0;
    for (int first = 0; first < batch; first += PLAN_THREADS) {
        const int position = first + static_cast<int>(threadIdx.x);
        const int count = position < batch ? Q_groups_of(Q_blocks_of(order[position])) * params.heads_q : 0;
        int before = 0;
        int chunk_total = 0;
        Scan(scan_storage).ExclusiveSum(count, before, chunk_total);
        if (position < batch)
            prefix[position] = carry + before;
        carry += chunk_total;
        __syncthreads(); // the scan's storage is reused
    }
    if (threadIdx.x == 0) {
        prefix[batch] = carry;
        *reinterpret_cast<int *>(scratch) = carry;
    }
    __syncthreads();
    // Each tile finds its position: the last whose prefix is at most its index.
    for (int index = threadIdx.x; index < carry; index += PLAN_THREADS) {
        int low = 0;
        int high = batch - 1;
        while (low < high) {
            const int middle = (low + high + 1) / 2;
            if (prefix[middle] <= index)
                low = middle;
            else
                high = middle - 1;
        }
        const int b = order[low];
        const int Q_blocks = Q_blocks_of(b);
        const int Q_groups = Q_groups_of(Q_blocks);
        const int local = index - prefix[low];
        const int group = local % Q_groups;
        const int first_group = MASK == MaskKind::NONE ? group : Q_groups - 1 - group;
        tiles[index] = {b, local / Q_groups, first_group * cluster, Q_blocks};
    }
}

} // namespace flash::sm90
