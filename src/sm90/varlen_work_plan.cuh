// A varlen call's work plan: the list of its work tiles, longest sequences first, written by a
// planning kernel launched ahead of the attention kernel. Without it the work tiles would be
// numbered over the longest sequence's query blocks for every sequence, and a block would pass over
// those past a shorter sequence's rows one by one (an atomic and a read of the sequence each);
// and the sequences would run in batch order, so that a long one last leaves the GPU idle but for
// it. With the plan every listed tile has rows, and a sequence's tiles come before those of every
// shorter sequence (by keys, which is what a work tile's time grows with): the longest-processing-
// time-first order, so that the last wave is short tiles. Consecutive sequences of the same lengths
// (a run) are ordered as a dense problem of that many sequences is (work_order.cuh): under a mask
// in chunks whose K and V fit L2, every head's last query blocks first, so a packed batch of equal
// lengths runs in the dense call's order.
//
// The planning kernel is compiled once, in varlen_work_plan.cu, not in every configuration's unit.
//
// The plan lies at the start of the call's scratch (ForwardParams::scratch): the number of tiles,
// then one PlannedTile each, then room for the planning kernel's own arrays.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "common/common.h"
#include "common/forward_params.h"
#include "common/ptx.cuh"
#include "common/sequence.cuh"

namespace flash::sm90 {

// One work tile: B_r query rows (cluster blocks of them) of one (sequence, head), with the
// sequence's rows, so that a block locates its work tile with one load (two 16-byte words): reading
// the rows from the sequence layout would take another global memory latency after it, on the
// producer's way from one work tile's loads to the next's, which a short sequence's few KV tiles
// do not hide (benchmarks/HISTORY.md #2026-12-02-varlen-plan-rows).
struct alignas(16) PlannedTile {
    int batch;
    int head;
    int first_Q_block; // the cluster's first
    int Q_blocks;      // of the sequence
    SequenceRows rows;
};

// Where the plan's parts lie in the scratch, for a call of `batch` sequences: at most `capacity`
// tiles (host and device agree on it through the launcher, which sizes the scratch).
struct VarlenPlanLayout {
    static constexpr int64_t header_bytes = sizeof(PlannedTile); // the count, padded to a tile
    int64_t capacity;
    int batch;

    __host__ __device__ int64_t tiles_offset() const { return header_bytes; }
    // The planning kernel's arrays (PlanArrays in varlen_work_plan.cu), where a batch too large to
    // sort keeps them (a sorted one keeps them in shared memory): per sequence its query blocks and
    // keys, per position in the order its sequence, and per run of equal sequences (at most one per
    // position, and one entry past the last) its first position and the tiles before it.
    __host__ __device__ int64_t Q_blocks_offset() const { return tiles_offset() + capacity * sizeof(PlannedTile); }
    __host__ __device__ int64_t keys_offset() const { return Q_blocks_offset() + batch * sizeof(int); }
    __host__ __device__ int64_t order_offset() const { return keys_offset() + batch * sizeof(int); }
    __host__ __device__ int64_t run_first_offset() const { return order_offset() + batch * sizeof(int); }
    __host__ __device__ int64_t run_prefix_offset() const { return run_first_offset() + (batch + 1) * sizeof(int); }
    __host__ __device__ int64_t bytes() const { return run_prefix_offset() + (batch + 1) * sizeof(int); }
};

// The plan's count and tiles, as the attention kernel reads them.
__device__ __forceinline__ int planned_tile_count(const void *scratch) { return *static_cast<const int *>(scratch); }
__device__ __forceinline__ const PlannedTile *planned_tiles(const void *scratch) {
    return reinterpret_cast<const PlannedTile *>(static_cast<const uint8_t *>(scratch) + VarlenPlanLayout::header_bytes);
}

// Writes the plan of `params` (a varlen call) into its scratch, on `stream`: work tiles of B_r query
// rows in clusters of `cluster` blocks, in the order of work_order.cuh where `masked` (a key's K and
// V rows are KV_row_bytes; a sequence's last query blocks, which see the most keys, come first). The
// attention kernel that reads the plan may be launched at once after it with programmatic stream
// serialization: it waits for the plan with wait_for_planned_work.
void plan_varlen_work(const ForwardParams &params, const VarlenPlanLayout &layout, int B_r, int cluster, bool masked,
                      int KV_row_bytes, cudaStream_t stream);

// In a kernel launched after plan_varlen_work as above: waits until the plan is complete and
// visible. (A kernel launched without the attribute returns from it at once.)
__device__ __forceinline__ void wait_for_planned_work() { ptx::wait_for_prerequisite_grids(); }

} // namespace flash::sm90
