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
    // Where a warpgroup's O goes out: its own block (persistent, or e4m3 where the V tiles cannot
    // hold it), the V tiles (other e4m3), else its Q block (of 16-bit elements, as O is).
    __device__ __forceinline__ uint8_t *O(int warpgroup) const {
        return base + Kernel::O_offset + warpgroup * Kernel::wg_O_bytes;
    }
    __device__ __forceinline__ uint8_t *K(int stage) const { return base + Kernel::K_offset + stage * Kernel::KV_tile_bytes; }
    __device__ __forceinline__ uint8_t *V(int stage) const { return base + Kernel::V_offset + stage * Kernel::KV_tile_bytes; }
    // With e4m3 transposed in shared memory (Kernel::transposes_V), V's tile transposed (fp8_operands.cuh).
    __device__ __forceinline__ uint8_t *Vt(int stage) const { return base + Kernel::Vt_offset + stage * Kernel::Vt_tile_bytes; }
    // The V operand of P V: V's tile (with V_transposed_copy already transposed), or its transposed tile.
    __device__ __forceinline__ uint8_t *PV_operand(int stage) const { return Kernel::transposes_V ? Vt(stage) : V(stage); }

    __device__ __forceinline__ uint64_t *barrier(int i) const {
        return reinterpret_cast<uint64_t *>(base + Kernel::barriers_offset) + i;
    }
    __device__ __forceinline__ uint64_t *Q_full(int warpgroup) const { return barrier(2 * warpgroup); }
    __device__ __forceinline__ uint64_t *Q_empty(int warpgroup) const { return barrier(2 * warpgroup + 1); }
    __device__ __forceinline__ uint64_t *K_full(int stage) const { return barrier(KV_barriers + 4 * stage); }
    __device__ __forceinline__ uint64_t *K_empty(int stage) const { return barrier(KV_barriers + 1 + 4 * stage); }
    __device__ __forceinline__ uint64_t *V_full(int stage) const { return barrier(KV_barriers + 2 + 4 * stage); }
    __device__ __forceinline__ uint64_t *V_empty(int stage) const { return barrier(KV_barriers + 3 + 4 * stage); }
    __device__ __forceinline__ uint64_t *Vt_full(int stage) const { return barrier(Vt_barriers + 2 * stage); }
    __device__ __forceinline__ uint64_t *Vt_empty(int stage) const { return barrier(Vt_barriers + 1 + 2 * stage); }
    // What the consumers wait for before P V and release after it: V's barriers, or where the
    // producer warpgroup transposes V its transposed tile's.
    __device__ __forceinline__ uint64_t *PV_full(int stage) const { return Kernel::transposes_V ? Vt_full(stage) : V_full(stage); }
    __device__ __forceinline__ uint64_t *PV_empty(int stage) const { return Kernel::transposes_V ? Vt_empty(stage) : V_empty(stage); }
    // Where a persistent block's producer leaves the index of a consumer warpgroup's next work tile
    // (WorkSlotHandOff, tile_scheduler.cuh).
    __device__ __forceinline__ int *work_slot(int warpgroup) const {
        return reinterpret_cast<int *>(barrier(Kernel::n_barriers + Kernel::work_slot_words * warpgroup));
    }
    // Where the producer warpgroup transposes V, per stage, where the producer writes how many KV
    // tiles it loaded, once it has loaded them all, in the stage the next would have gone to (-1
    // until then), for the warps that transpose V. They read a stage's word only between its V
    // barrier's completion and their release of that stage, which the producer waits for before it
    // writes there.
    __device__ __forceinline__ volatile int *V_stream_end(int stage) const {
        return reinterpret_cast<volatile int *>(barrier(Kernel::n_barriers + Kernel::work_slot_words * Kernel::consumer_warpgroups)) +
               stage;
    }

    // A persistent cluster's ring of the work tiles it takes next (ClusterCounterScheduler,
    // tile_scheduler.cuh): two entries of an index, each with a full and an empty barrier.
    __device__ __forceinline__ int *cluster_index(int entry) const {
        return reinterpret_cast<int *>(barrier(Kernel::n_barriers + Kernel::work_slot_words * Kernel::consumer_warpgroups +
                                               Kernel::stream_end_words)) +
               entry;
    }
    __device__ __forceinline__ uint64_t *cluster_index_full(int entry) const { return barrier(ring_barriers + 2 * entry); }
    __device__ __forceinline__ uint64_t *cluster_index_empty(int entry) const { return barrier(ring_barriers + 1 + 2 * entry); }

    // One thread, before any other touches the barriers. A full barrier completes on its loader's
    // arrival plus the bytes; an empty one when every consumer warp of its readers has released it.
    // Where the producer warpgroup transposes V, V's tile is read by the transposing warps, and its
    // transposed tile is written by them and read by the consumers.
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
            mbarrier_init(V_empty(stage), Kernel::transposes_V ? Kernel::transposer_warps : Kernel::consumer_warps * Kernel::cluster_size);
            if constexpr (Kernel::transposes_V) {
                mbarrier_init(Vt_full(stage), Kernel::transposer_warps);
                mbarrier_init(Vt_empty(stage), Kernel::consumer_warps);
            }
        }
        if constexpr (Kernel::transposes_V)
#pragma unroll
            for (int stage = 0; stage < Kernel::stages; ++stage)
                *V_stream_end(stage) = -1;
#pragma unroll
        for (int entry = 0; entry < Kernel::cluster_ring_entries; ++entry) {
            mbarrier_init(cluster_index_full(entry), 1);
            mbarrier_init(cluster_index_empty(entry), Kernel::cluster_size);
        }
        mbarrier_init_fence();
    }

  private:
    static constexpr int KV_barriers = 2 * Kernel::consumer_warpgroups;
    static constexpr int Vt_barriers = KV_barriers + 4 * Kernel::stages;
    static constexpr int ring_barriers = Vt_barriers + (Kernel::transposes_V ? 2 * Kernel::stages : 0);
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
