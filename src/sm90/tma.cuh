// The tensor memory accelerator (cp.async.bulk.tensor) and the mbarriers its copies complete on:
// one thread issues a tile copy and states how many bytes it brings (expect_tx); waiters spin on
// the barrier's phase parity. Each wrapper is one instruction.
#pragma once

#include <cstdint>

#include <cuda.h>

#include "common/ptx.cuh"

namespace flash::sm90 {

__device__ __forceinline__ void mbarrier_init(uint64_t *barrier, int arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(ptx::shared_address(barrier)), "r"(arrivals));
}

// Makes initialized barriers visible to the other threads and to the copy engine (then a block
// barrier).
__device__ __forceinline__ void mbarrier_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// This thread's arrival, which also announces `bytes` more bytes the phase must receive.
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(uint64_t *barrier, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(ptx::shared_address(barrier)),
                 "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t *barrier) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(ptx::shared_address(barrier)) : "memory");
}

// Waits until the phase of parity `parity` has completed. A fresh barrier is in phase 0, and the
// phase before it (parity 1) counts as complete, so the first wait for parity 1 returns at once.
__device__ __forceinline__ void mbarrier_wait(uint64_t *barrier, uint32_t parity) {
    const uint32_t address = ptx::shared_address(barrier);
    uint32_t done = 0;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(address), "r"(parity)
                     : "memory");
    } while (!done);
}

// Copies the box at coordinates (c0, c1, c2, c3) of a 4-dimensional tensor map into shared
// memory, completing `bytes` on the barrier. Elements outside the tensor arrive as zeros.
__device__ __forceinline__ void tma_load_4d(void *smem_dst, const CUtensorMap *map, uint64_t *barrier, int c0, int c1,
                                            int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
                 "%5}], [%6];\n" ::"r"(ptx::shared_address(smem_dst)),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
                 "r"(ptx::shared_address(barrier))
                 : "memory");
}

// tma_load_4d into the same shared-memory offset of every block of the cluster in cta_mask,
// completing the bytes on the barrier at the same offset in each.
__device__ __forceinline__ void tma_load_4d_multicast(void *smem_dst, const CUtensorMap *map, uint64_t *barrier,
                                                      uint16_t cta_mask, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
                 "[%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(ptx::shared_address(smem_dst)),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
                 "r"(ptx::shared_address(barrier)), "h"(cta_mask)
                 : "memory");
}

// An arrival on the barrier at the same offset in the cluster's block `cta_rank` (this one
// included). Release at the block's scope, as a local arrival: at cluster scope every arrival
// waited until the thread's earlier memory accesses were visible to the whole cluster, which cost
// a quarter of the throughput; the stages it releases have been read by products that are complete.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t *barrier, uint32_t cta_rank) {
    asm volatile("{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
                 "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(ptx::shared_address(barrier)),
                 "r"(cta_rank)
                 : "memory");
}

// The same arrival, released at the cluster's scope: the thread's earlier reads of its own shared
// memory are done before the block `cta_rank`, once it sees the phase complete, writes there again.
__device__ __forceinline__ void mbarrier_arrive_cluster_released(uint64_t *barrier, uint32_t cta_rank) {
    asm volatile("{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
                 "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n" ::"r"(
                     ptx::shared_address(barrier)),
                 "r"(cta_rank)
                 : "memory");
}

// Writes `value` to the word at `word`'s offset in the cluster's block `cta_rank` (this one
// included), completing its 4 bytes on the barrier at `barrier`'s offset there.
__device__ __forceinline__ void store_cluster_async(int *word, int value, uint64_t *barrier, uint32_t cta_rank) {
    asm volatile("{\n.reg .b32 remote_word, remote_barrier;\nmapa.shared::cluster.u32 remote_word, %0, %2;\n"
                 "mapa.shared::cluster.u32 remote_barrier, %1, %2;\n"
                 "st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [remote_word], %3, [remote_barrier];\n}\n" ::"r"(
                     ptx::shared_address(word)),
                 "r"(ptx::shared_address(barrier)), "r"(cta_rank), "r"(value)
                 : "memory");
}

// This block's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_cta_rank() {
    uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return rank;
}

// Every thread of every block of the cluster: a block barrier that spans the cluster.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// Copies a shared-memory box to coordinates (c0, c1, c2, c3) of a tensor map; elements outside
// the tensor are not written. Part of this thread's current bulk group.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap *map, const void *smem_src, int c0, int c1, int c2,
                                             int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
                     reinterpret_cast<uint64_t>(map)),
                 "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(ptx::shared_address(smem_src))
                 : "memory");
}

__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until this thread's committed stores have read their shared memory.
__device__ __forceinline__ void tma_store_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

// Sets the extent of dimension `dim` of a tensor map in global memory (a generic-proxy write; the
// map's users need tensor_map_release and tensor_map_acquire before the copy engine reads it).
template <int dim>
__device__ __forceinline__ void tensor_map_set_extent(CUtensorMap *map, int extent) {
    asm volatile("tensormap.replace.tile.global_dim.global.b1024.b32 [%0], %1, %2;\n" ::"l"(reinterpret_cast<uint64_t>(map)),
                 "n"(dim), "r"(extent)
                 : "memory");
}

// Makes this thread's writes to tensor maps in global memory visible to the copy engine's reads of
// tensor maps (the tensormap proxy), at the GPU's scope...
__device__ __forceinline__ void tensor_map_release() {
    asm volatile("fence.proxy.tensormap::generic.release.gpu;\n" ::: "memory");
}
// ... and has this thread's next copies through `map` read it as written, not a cached copy.
__device__ __forceinline__ void tensor_map_acquire(const CUtensorMap *map) {
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Orders this thread's ordinary shared-memory writes before later reads by the copy engine or
// the tensor cores (the async proxy).
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

} // namespace flash::sm90
