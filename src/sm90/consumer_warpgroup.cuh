// A consumer warpgroup: its rows, its named barriers, where it is in the K/V pipeline, its
// releases of the buffers it has read, its ping-pong turns, and its passing over the KV tiles it
// does not compute on.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/common.h"
#include "sm90/shared_tiles.cuh"
#include "sm90/tma.cuh"
#include "sm90/warpgroup.cuh"
#include "sm90/wgmma.cuh"

namespace flash::sm90 {

using TakingTurns = std::true_type;
using WithoutTurns = std::false_type;

// Pingpong: warpgroup wg issues its products after warpgroup wg - 1 (round robin) and then lets
// warpgroup wg + 1 go, from a work tile's first S = Q K^T on. The turns run on across work
// tiles, so a warpgroup's first turn in the next work tile waits for the others' last products,
// not for their epilogues. The warpgroups of a block share its work tiles and take one turn per
// KV tile, so as many turns each: the last warpgroup's arrival before the first turn leaves one
// arrival over at the end, which the first warpgroup takes on its way out.
template <typename Kernel>
struct ConsumerWarpgroup {
    static constexpr int n_consumers = Kernel::consumer_warpgroups;
    static constexpr int pair_threads = 2 * WARPGROUP_THREADS;

    const SharedTiles<Kernel> smem;
    // This thread as a consumer: warpgroup wg's 64 rows, warp warp_in_wg's 16 of them.
    int wg;
    int lane;
    int warp_first_row;
    // Named barriers of this warpgroup's threads alone (ping-pong's turns take 1 .. n_consumers): one
    // for the epilogue, one for the vote on rescaling (a reduction may not share a barrier with
    // plain synchronization).
    int warpgroup_barrier;
    int vote_barrier;
    int my_turn;
    int next_turn;
    // Where this warpgroup's O goes out (SharedTiles::O), for a persistent block's epilogue: computed
    // here, once per block (computed in the epilogue, its address arithmetic comes out otherwise and
    // the main loop's schedule with it).
    uint8_t *O_smem;
    PipelineState<Kernel::stages> current; // of the next KV tile, carried from one work tile to the next

    __device__ __forceinline__ ConsumerWarpgroup(const SharedTiles<Kernel> &smem_, int warpgroup)
        : smem(smem_), wg(Kernel::warp_specialized ? warpgroup - 1 : warpgroup), lane(threadIdx.x % WARP_SIZE),
          warp_first_row(wg * WGMMA_M + (threadIdx.x % WARPGROUP_THREADS) / WARP_SIZE * MMA_M),
          warpgroup_barrier(1 + n_consumers + wg), vote_barrier(1 + 2 * n_consumers + wg), my_turn(1 + wg),
          next_turn(1 + (wg + 1) % n_consumers), O_smem(smem_.O(wg)) {}

    __device__ __forceinline__ void start_turns() const {
        if constexpr (Kernel::pingpong)
            if (wg == n_consumers - 1)
                named_barrier_arrive(1, pair_threads);
    }
    __device__ __forceinline__ void finish_turns() const {
        if constexpr (Kernel::pingpong)
            if (wg == 0)
                named_barrier_sync(1, pair_threads);
    }
    // Issues a KV tile's products on this warpgroup's turn.
    template <typename Issue>
    __device__ __forceinline__ void in_turn(Issue &&issue) const {
        if constexpr (Kernel::pingpong)
            named_barrier_sync(my_turn, pair_threads);
        issue();
        if constexpr (Kernel::pingpong)
            named_barrier_arrive(next_turn, pair_threads);
    }

    // A warp's release of a buffer it has read.
    __device__ __forceinline__ void release(uint64_t *empty) const {
        if (lane == 0)
            mbarrier_arrive(empty);
    }
    // A K or V stage goes back to every block of the cluster, whose loads write into this one's.
    __device__ __forceinline__ void release_KV(uint64_t *empty) const {
        if constexpr (Kernel::cluster_size > 1) {
            if (lane == 0)
#pragma unroll
                for (int r = 0; r < Kernel::cluster_size; ++r)
                    mbarrier_arrive_cluster(empty, r);
        } else {
            release(empty);
        }
    }

    // Waits for the next `count` KV tiles, which this warpgroup does not compute on, and releases
    // them once each has landed, so that its arrivals count towards that stage's round: tiles its
    // cluster loads for the other block, or (taking its turns, as if it issued products) those of
    // a work tile whose rows all lie past seqlen_q.
    template <typename TakeTurns>
    __device__ __forceinline__ void pass_tiles(int count, TakeTurns) {
        for (int i = 0; i < count; ++i) {
            mbarrier_wait(smem.K_full(current.stage), current.phase);
            mbarrier_wait(smem.PV_full(current.stage), current.phase);
            if constexpr (TakeTurns::value)
                in_turn([] {});
            release_KV(smem.K_empty(current.stage));
            release_KV(smem.PV_empty(current.stage));
            current.advance();
        }
    }
};

} // namespace flash::sm90
