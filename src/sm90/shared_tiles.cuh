// The block's shared memory (SharedTiles: Q, the K/V stages, O, the barriers and the work slots)
// and where a consumer is in the K/V pipeline (PipelineState).
#pragma once

#include <cstdint>

#include "common/ptx.cuh"
#include "sm90/tma.cuh"
#include "sm90/wgmma.cuh"

namespace flash::sm90 {

// The block's shared memory (traits.cuh lays it out), from the dynamic allocation rounded up to
// TILE_ALIGNMENT_BYTES.
template <typename Kernel>
struct SharedTiles {
    uint8_t *base;

    __device__ __forceinline__ explicit SharedTiles(uint8_t *raw) {
        const uint32_t misalignment = ptx::shared_address(raw) % TILE_ALIGNMENT_BYTES;
        base = raw + (misalignment ? TILE_ALIGNMENT_BYTES - misalignment : 0);
    }

    __device__ __forceinline__ uint8_t *Q(int warpgroup) const { return base + warpgroup * Kernel::wg_Q_bytes; }
    // Where a warpgroup's O goes out: its own block in a persistent block, else its Q block.
    __device__ __forceinline__ uint8_t *O(int warpgroup) const {
        return base + (Kernel::persistent ? Kernel::O_offset : 0) + warpgroup * Kernel::wg_Q_bytes;
    }
    __device__ __forceinline__ uint8_t *K(int stage) const { return base + Kernel::K_offset + stage * Kernel::KV_tile_bytes; }
    __device__ __forceinline__ uint8_t *V(int stage) const { return base + Kernel::V_offset + stage * Kernel::KV_tile_bytes; }

    __device__ __forceinline__ uint64_t *barrier(int i) const {
        return reinterpret_cast<uint64_t *>(base + Kernel::barriers_offset) + i;
    }
    __device__ __forceinline__ uint64_t *Q_full(int warpgroup) const { return barrier(2 * warpgroup); }
    __device__ __forceinline__ uint64_t *Q_empty(int warpgroup) const { return barrier(2 * warpgroup + 1); }
    __device__ __forceinline__ uint64_t *K_full(int stage) const { return barrier(KV_barriers + 4 * stage); }
    __device__ __forceinline__ uint64_t *K_empty(int stage) const { return barrier(KV_barriers + 1 + 4 * stage); }
    __device__ __forceinline__ uint64_t *V_full(int stage) const { return barrier(KV_barriers + 2 + 4 * stage); }
    __device__ __forceinline__ uint64_t *V_empty(int stage) const { return barrier(KV_barriers + 3 + 4 * stage); }
    // Where a persistent block's producer leaves the index of a consumer warpgroup's next work tile,
    // and its sequence's rows (WorkSlotHandOff, tile_scheduler.cuh).
    __device__ __forceinline__ int *work_slot(int warpgroup) const {
        return reinterpret_cast<int *>(barrier(Kernel::n_barriers + Kernel::work_slot_words * warpgroup));
    }

    // One thread, before any other touches the barriers. A full barrier completes on its loader's
    // arrival plus the bytes; an empty one when every consumer warp of its readers has released it.
    __device__ __forceinline__ void init_barriers() const {
#pragma unroll
        for (int wg = 0; wg < Kernel::consumer_warpgroups; ++wg) {
            mbarrier_init(Q_full(wg), 1);
            mbarrier_init(Q_empty(wg), Kernel::consumer_warps / Kernel::consumer_warpgroups);
        }
#pragma unroll
        for (int stage = 0; stage < Kernel::stages; ++stage) {
            mbarrier_init(K_full(stage), 1);
            mbarrier_init(K_empty(stage), Kernel::consumer_warps * Kernel::cluster_size);
            mbarrier_init(V_full(stage), 1);
            mbarrier_init(V_empty(stage), Kernel::consumer_warps * Kernel::cluster_size);
        }
        mbarrier_init_fence();
    }

  private:
    static constexpr int KV_barriers = 2 * Kernel::consumer_warpgroups;
};

// Where a consumer is in the K/V pipeline: the stage of its current tile and the parity of that
// stage's current round.
template <int stages>
struct PipelineState {
    int stage = 0;
    uint32_t phase = 0;

    __device__ __forceinline__ void advance() {
        if (++stage == stages) {
            stage = 0;
            phase ^= 1;
        }
    }
};

} // namespace flash::sm90
