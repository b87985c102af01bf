// The tile schedulers: which work tile (B_r query rows of one (batch, head)) a block computes, and
// in a persistent block which one next. The traits pick one type per configuration (TileScheduler);
// each offers the same interface:
// - first(): the block's first work tile's index; end(): the index past the last. Callers compare
//   with it themselves (index >= end()): inside a member function the comparison reaches ptxas with
//   its operands swapped, and the schedule of the whole kernel changes with it;
// - ask(index) and agree(asked, n, smem): the producer's next work tile after `index`, its n-th
//   (from 0): asked for (from the work counter) as it starts loading `index`, and known once it has
//   issued that work tile's loads, the same in every block of a cluster;
// - work_tile(index) (dense numbering) or located(index) (a varlen plan, whose entry holds the
//   sequence's rows too): the work tile an index describes; locate_work calls whichever it has;
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
#include "sm90/tma.cuh"
#include "sm90/varlen_work_plan.cuh"
#include "sm90/work_order.cuh"

namespace flash::sm90 {

// Whether the blocks of a cluster take one query block of `cluster` consecutive heads, which share
// a key/value head when the query heads per key/value head are a multiple of `cluster`: they visit
// the same KV tiles under any mask. Otherwise they take `cluster` consecutive query blocks of one
// head, which under a mask visit nearly the same (the pair loads the tiles either visits). A varlen
// call's plan lists query blocks only.
__host__ __device__ __forceinline__ bool cluster_spans_heads(int cluster, int heads_q, int heads_kv) {
    return cluster > 1 && heads_q / heads_kv % cluster == 0;
}

// A block's work: B_r query rows of one (batch, head). The blocks of a cluster take one work tile,
// numbered once: `cluster` consecutive heads' query block (cluster_spans_heads), or `cluster`
// consecutive query blocks of one (batch, head), where in the last such group a block may have no
// query block (Q_block >= Q_blocks): it only loads its share of K and V for the others. So a work
// tile is a position (a query block, or a cluster's group of them) of a unit (a head, or a
// cluster's heads, of one batch entry), in the order of work_order.cuh (under a mask, in chunks of
// `chunk_units` units). A varlen call's work tiles are its plan's (PlannedWorkTiles), each with its
// own sequence's query blocks.
struct WorkTile {
    int Q_block;
    int first_Q_block; // the cluster's first and last existing query blocks
    int last_Q_block;
    int Q_blocks; // of the work tile's sequence
    int head;
    int batch;

    template <MaskKind MASK, int cluster>
    __device__ __forceinline__ static WorkTile of(int index, int Q_blocks, int heads, int units, int chunk_units,
                                                  int rank, bool spans_heads) {
        const int positions = spans_heads ? Q_blocks : (Q_blocks + cluster - 1) / cluster;
        const auto [unit, position] = ordered_work(index, units, positions, chunk_units, MASK != MaskKind::NONE);
        if (spans_heads) {
            const int head_index = unit * cluster + rank; // heads is a multiple of cluster
            return {position, position, position, Q_blocks, head_index % heads, head_index / heads};
        }
        const int first = position * cluster;
        return {first + rank, first, min(first + cluster - 1, Q_blocks - 1), Q_blocks, unit % heads, unit / heads};
    }
};

// How many work tiles a dense call has, as WorkTile numbers them.
__host__ __device__ __forceinline__ int64_t dense_work_tiles(int cluster, int64_t Q_blocks, int batch, int heads_q,
                                                             int heads_kv) {
    if (cluster_spans_heads(cluster, heads_q, heads_kv))
        return Q_blocks * batch * (heads_q / cluster);
    return (Q_blocks + cluster - 1) / cluster * batch * heads_q;
}

// A work tile with its sequence (common/sequence.cuh): the lengths the tile's blocks compute with.
template <bool VARLEN>
struct LocatedWork {
    WorkTile work;
    Sequence<VARLEN> sequence;
};

// The work tile numbered `index`, with its sequence's lengths (with VARLEN, as the plan lists them).
template <bool VARLEN, typename Scheduler>
__device__ __forceinline__ LocatedWork<VARLEN> locate_work(const ForwardParams &params, const Scheduler &scheduler,
                                                           int index) {
    if constexpr (VARLEN) {
        return scheduler.located(index);
    } else {
        const WorkTile work = scheduler.work_tile(index);
        return {work, Sequence<false>(params, work.batch)};
    }
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
// (consecutive blocks); KV_row_bytes is a key's K and V row together.
template <int B_r, int cluster, MaskKind MASK, int KV_row_bytes>
struct WorkTileNumbering {
    static constexpr int cluster_blocks = cluster;
    const ForwardParams &params;
    int Q_blocks;
    bool spans_heads;
    int units; // (batch, head) pairs, or with spans_heads (batch, cluster's heads) tuples
    int chunk_units;
    int n_work_tiles;
    uint32_t rank; // in the cluster

    __device__ __forceinline__ WorkTileNumbering(const ForwardParams &params_, uint32_t rank_)
        : params(params_), Q_blocks((params_.seqlen_q + B_r - 1) / B_r),
          spans_heads(cluster_spans_heads(cluster, params_.heads_q, params_.heads_kv)),
          units(params_.batch * (spans_heads ? params_.heads_q / cluster : params_.heads_q)),
          chunk_units(chunk_units_of(params_, spans_heads ? cluster : 1)),
          n_work_tiles(static_cast<int>(dense_work_tiles(cluster, Q_blocks, params_.batch, params_.heads_q, params_.heads_kv))),
          rank(rank_) {}

    __device__ __forceinline__ int first() const { return blockIdx.x / cluster; } // a cluster's blocks are consecutive
    // The index past the last work tile: what a persistent producer hands out at the end.
    __device__ __forceinline__ int end() const { return n_work_tiles; }
    __device__ __forceinline__ WorkTile work_tile(int index) const {
        return WorkTile::of<MASK, cluster>(index, Q_blocks, params.heads_q, units, chunk_units, rank, spans_heads);
    }

  private:
    // How many units' K and V fit a chunk (work_order.cuh).
    __device__ __forceinline__ static int chunk_units_of(const ForwardParams &params, int heads_per_unit) {
        if constexpr (MASK == MaskKind::NONE)
            return 1; // not used
        return units_sharing_kv(params.seqlen_k, KV_row_bytes, heads_per_unit, params.heads_q / params.heads_kv);
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
    // The work tile numbered `index` with its sequence, from one plan entry.
    __device__ __forceinline__ LocatedWork<true> located(int index) const {
        const PlannedTile tile = tiles[index];
        const WorkTile work{tile.first_Q_block + static_cast<int>(rank), tile.first_Q_block,
                            min(tile.first_Q_block + cluster - 1, tile.Q_blocks - 1), tile.Q_blocks, tile.head, tile.batch};
        return {work, Sequence<true>(params, tile.batch, tile.rows)};
    }
};

// How a kernel's work tiles are numbered: densely, or (varlen) as the call's plan lists them.
template <int B_r, int cluster, MaskKind MASK, bool VARLEN, int KV_row_bytes>
using WorkTilesOf =
    std::conditional_t<VARLEN, PlannedWorkTiles<cluster>, WorkTileNumbering<B_r, cluster, MASK, KV_row_bytes>>;

// A block computes one work tile and knows it from its index: nothing is handed off.
struct NoHandOff {
    __device__ __forceinline__ static void hand_off(int *, int) {}
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
    __device__ __forceinline__ int ask(int) const { return this->n_work_tiles; }
    template <typename Smem>
    __device__ __forceinline__ int agree(int asked, int, const Smem &) const { return asked; }
};

// A persistent block's first work tile is its own; it asks the work counter for each next one as
// it starts loading this one, so the tiles go to the blocks that are free first (under a mask, the
// longest first). The counter's answer is only needed once the loads are issued: its latency hides
// behind them.
template <typename WorkTiles>
struct AtomicCounterScheduler : WorkTiles, WorkSlotHandOff {
    using WorkTiles::WorkTiles;
    __device__ __forceinline__ int ask(int) const { return gridDim.x + atomicAdd(this->params.work_counter, 1); }
    template <typename Smem>
    __device__ __forceinline__ int agree(int asked, int, const Smem &) const { return asked; }
};

// The blocks of a persistent cluster must take the same work tiles: its first block asks the
// counter, and writes each answer into every block's entry of a ring of two (SharedTiles'
// cluster_index), completing that block's full barrier there; each block's producer waits for it,
// reads it and releases the entry on the first block's empty barrier, which counts every block's
// release before the entry is written again. (A fixed rotation of the work tiles would need no
// exchange, but under a mask it leaves the pairs that drew long tiles running after the others.)
template <typename WorkTiles>
struct ClusterCounterScheduler : WorkTiles, WorkSlotHandOff {
    using WorkTiles::WorkTiles;
    __device__ __forceinline__ int ask(int) const {
        return this->rank == 0 ? gridDim.x / WorkTiles::cluster_blocks + atomicAdd(this->params.work_counter, 1) : 0;
    }
    template <typename Smem>
    __device__ __forceinline__ int agree(int asked, int n, const Smem &smem) const {
        const int entry = n % 2;
        const uint32_t parity = (n / 2) & 1;
        int *const slot = smem.cluster_index(entry);
        uint64_t *const full = smem.cluster_index_full(entry);
        uint64_t *const empty = smem.cluster_index_empty(entry);
        mbarrier_arrive_expect_bytes(full, sizeof(int));
        if (this->rank == 0) {
            mbarrier_wait(empty, parity ^ 1);
#pragma unroll
            for (uint32_t block = 0; block < WorkTiles::cluster_blocks; ++block)
                store_cluster_async(slot, asked, full, block);
        }
        mbarrier_wait(full, parity);
        const int index = *static_cast<volatile int *>(slot);
        mbarrier_arrive_cluster_released(empty, 0);
        return index;
    }
};

} // namespace flash::sm90
