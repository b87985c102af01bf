// The tile schedulers: which work tile (B_r query rows of one (batch, head)) a block computes, and
// in a persistent block which one next. The traits pick one type per configuration (TileScheduler);
// each offers the same interface:
// - first(): the block's first work tile's index; end(): the index past the last. Callers compare
//   with it themselves (index >= end()): inside a member function the comparison reaches ptxas with
//   its operands swapped, and the schedule of the whole kernel changes with it;
// - next(index): the producer's next work tile after `index`, asked for as it starts loading `index`;
// - work_tile(index): the WorkTile an index describes;
// - hand_off(slot, index) and handed_off(slot): how a persistent block's producer tells a consumer
//   warpgroup its next work tile's index, through that warpgroup's work slot (SharedTiles::work_slot).
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/common.h"
#include "common/forward_params.h"
#include "common/problem_variant.h"
#include "common/sequence.cuh"
#include "sm90/varlen_work_plan.cuh"

namespace flash::sm90 {

// A block's work: B_r query rows of one (batch, head). Work tiles are numbered with the query
// block fastest, so the blocks running at once share their heads' K and V in L2; under a mask the
// last query blocks, whose rows see the most keys, come first, so a persistent block, which takes
// whichever work tile is next when it is free, ends on short ones. The blocks of a cluster take
// `cluster` consecutive query blocks of one (batch, head) together, as one work tile numbered once;
// in the last such group a block may have no query block (Q_block >= Q_blocks): it only loads its
// share of K and V for the others. A varlen call's work tiles are its plan's (PlannedWorkTiles),
// each with its own sequence's query blocks.
struct WorkTile {
    int Q_block;
    int first_Q_block; // the cluster's first and last existing query blocks
    int last_Q_block;
    int Q_blocks; // of the work tile's sequence
    int head;
    int batch;

    template <MaskKind MASK, int cluster>
    __device__ __forceinline__ static WorkTile of(int index, int Q_blocks, int heads, int rank) {
        const int Q_groups = (Q_blocks + cluster - 1) / cluster;
        const int group = index % Q_groups;
        const int head_index = index / Q_groups;
        const int first = (MASK == MaskKind::NONE ? group : Q_groups - 1 - group) * cluster;
        return {first + rank, first, min(first + cluster - 1, Q_blocks - 1), Q_blocks, head_index % heads, head_index / heads};
    }

};

// A work tile with its sequence (common/sequence.cuh): the lengths the tile's blocks compute with.
template <bool VARLEN>
struct LocatedWork {
    WorkTile work;
    Sequence<VARLEN> sequence;
};

// The work tile numbered `index`, with its sequence's lengths: read from the sequence layout, or
// (with VARLEN) handed off with the index.
template <bool VARLEN, typename Scheduler, typename... HandedOffRows>
__device__ __forceinline__ LocatedWork<VARLEN> locate_work(const ForwardParams &params, const Scheduler &scheduler,
                                                           int index, HandedOffRows... rows) {
    const WorkTile work = scheduler.work_tile(index);
    return {work, Sequence<VARLEN>(params, work.batch, rows...)};
}

// The KV tiles a work tile's cluster loads, [begin, end): every tile some block of it visits. A
// block's own tiles (KVTileRange) lie within; a block that has none, or no query block, passes them all.
template <typename Tiles>
struct ClusterTileRange {
    int begin = INT_MAX;
    int end = 0;

    __device__ __forceinline__ ClusterTileRange(const ForwardParams &params, const WorkTile &work, int B_r) {
        for (int Q_block = work.first_Q_block; Q_block <= work.last_Q_block; ++Q_block) {
            const Tiles tiles(params, Q_block * B_r);
            if (tiles.begin < tiles.end) {
                begin = min(begin, tiles.begin);
                end = max(end, tiles.end);
            }
        }
        begin = min(begin, end);
    }
};

// The KV tiles this block loads (its share of them, in a cluster): its own, or its cluster's.
template <int cluster, typename Tiles>
__device__ __forceinline__ std::pair<int, int> loaded_tiles(const ForwardParams &params, const WorkTile &work,
                                                            const Tiles &tiles, int B_r) {
    if constexpr (cluster > 1) {
        const ClusterTileRange<Tiles> range(params, work, B_r);
        return std::pair<int, int>{range.begin, range.end};
    } else {
        return std::pair<int, int>{tiles.begin, tiles.end};
    }
}

// The grid's work tiles, numbered as WorkTile describes, for blocks in clusters of `cluster`
// (consecutive blocks).
template <int B_r, int cluster, MaskKind MASK>
struct WorkTileNumbering {
    static constexpr int cluster_blocks = cluster;
    const ForwardParams &params;
    int Q_blocks;
    int n_work_tiles;
    uint32_t rank; // in the cluster

    __device__ __forceinline__ WorkTileNumbering(const ForwardParams &params_, uint32_t rank_)
        : params(params_), Q_blocks((params_.seqlen_q + B_r - 1) / B_r),
          n_work_tiles((Q_blocks + cluster - 1) / cluster * params_.heads_q * params_.batch), rank(rank_) {}

    __device__ __forceinline__ int first() const { return blockIdx.x / cluster; } // a cluster's blocks are consecutive
    // The index past the last work tile: what a persistent producer hands out at the end.
    __device__ __forceinline__ int end() const { return n_work_tiles; }
    __device__ __forceinline__ WorkTile work_tile(int index) const {
        return WorkTile::of<MASK, cluster>(index, Q_blocks, params.heads_q, rank);
    }
};

// A varlen call's work tiles, as its plan lists them (varlen_work_plan.cuh): every one has rows, and
// the longest sequences' come first.
template <int cluster>
struct PlannedWorkTiles {
    static constexpr int cluster_blocks = cluster;
    const ForwardParams &params;
    const PlannedTile *tiles;
    int n_work_tiles;
    uint32_t rank; // in the cluster

    __device__ __forceinline__ PlannedWorkTiles(const ForwardParams &params_, uint32_t rank_)
        : params(params_), tiles(planned_tiles(params_.scratch)), n_work_tiles(planned_tile_count(params_.scratch)),
          rank(rank_) {}

    __device__ __forceinline__ int first() const { return blockIdx.x / cluster; }
    __device__ __forceinline__ int end() const { return n_work_tiles; }
    __device__ __forceinline__ WorkTile work_tile(int index) const {
        const PlannedTile tile = tiles[index];
        return {tile.first_Q_block + static_cast<int>(rank), tile.first_Q_block,
                min(tile.first_Q_block + cluster - 1, tile.Q_blocks - 1), tile.Q_blocks, tile.head, tile.batch};
    }
};

// How a kernel's work tiles are numbered: densely, or (varlen) as the call's plan lists them.
template <int B_r, int cluster, MaskKind MASK, bool VARLEN>
using WorkTilesOf = std::conditional_t<VARLEN, PlannedWorkTiles<cluster>, WorkTileNumbering<B_r, cluster, MASK>>;

// A block computes one work tile and knows it from its index: nothing is handed off.
struct NoHandOff {
    __device__ __forceinline__ static void hand_off(int *, int) {}
    __device__ __forceinline__ static void hand_off_rows(int *, SequenceRows) {}
};

// The producer leaves the index in the work slot before its arrival on the warpgroup's Q full
// barrier, whose waiters then read it: the mbarrier orders the write and the reads. Both sides use
// shared-memory atomics, which compute-sanitizer's racecheck (which does not model mbarriers) does
// not count as hazards.
struct WorkSlotHandOff {
    __device__ __forceinline__ static void hand_off(int *slot, int index) { atomicExch(slot, index); }
    // Read once per warp, after the warpgroup's Q full barrier has completed.
    __device__ __forceinline__ static int handed_off(int *slot) {
        const int lane = threadIdx.x % WARP_SIZE;
        return __shfl_sync(FULL_WARP_MASK, lane == 0 ? atomicOr(slot, 0) : 0, 0);
    }
    // With per-sequence lengths the producer, which has read the work tile's sequence from global
    // memory already, leaves its rows after the index: a consumer reading them there starts the
    // work tile a global memory latency sooner, which a short sequence's few KV tiles feel.
    __device__ __forceinline__ static void hand_off_rows(int *slot, SequenceRows rows) {
        atomicExch(slot + 1, rows.q.start);
        atomicExch(slot + 2, rows.q.length);
        atomicExch(slot + 3, rows.k.start);
        atomicExch(slot + 4, rows.k.length);
    }
    __device__ __forceinline__ static SequenceRows handed_off_rows(int *slot) {
        return {{handed_off(slot + 1), handed_off(slot + 2)}, {handed_off(slot + 3), handed_off(slot + 4)}};
    }
};

// One block (or cluster) per work tile: the grid is as large as the work (with a plan, as large as
// it may be: the blocks past its tiles exit).
template <typename WorkTiles>
struct SinglePassScheduler : WorkTiles, NoHandOff {
    using WorkTiles::WorkTiles;
    // Read where the block starts, not where the producer starts: a read of blockIdx.x inside the
    // producer's branch changes how ptxas schedules the consumers' main loop.
    int first_index = blockIdx.x / WorkTiles::cluster_blocks;
    __device__ __forceinline__ int first() const { return first_index; }
    __device__ __forceinline__ int next(int) const { return this->n_work_tiles; }
};

// A persistent block's first work tile is its own; it asks the work counter for each next one as
// it starts loading this one, so the tiles go to the blocks that are free first (under a mask, the
// longest first).
template <typename WorkTiles>
struct AtomicCounterScheduler : WorkTiles, WorkSlotHandOff {
    using WorkTiles::WorkTiles;
    __device__ __forceinline__ int next(int) const { return gridDim.x + atomicAdd(this->params.work_counter, 1); }
};

// The blocks of a cluster must take the same work tiles, so a persistent cluster takes every
// (gridDim.x / cluster)-th in turn rather than asking the counter.
template <typename WorkTiles>
struct ClusterRotationScheduler : WorkTiles, WorkSlotHandOff {
    using WorkTiles::WorkTiles;
    __device__ __forceinline__ int next(int index) const { return index + gridDim.x / WorkTiles::cluster_blocks; }
};

} // namespace flash::sm90
