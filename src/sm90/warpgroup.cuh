// Warpgroup roles: moving registers between warpgroups (setmaxnreg) and the named barriers that
// synchronize some warpgroups of a block without the others.
#pragma once

#include <cstdint>

namespace flash::sm90 {

// Gives back registers: this warpgroup keeps `count` per thread.
template <int count>
__device__ __forceinline__ void release_registers() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(count));
}

// Takes registers freed by another warpgroup: this warpgroup may use `count` per thread.
template <int count>
__device__ __forceinline__ void claim_registers() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(count));
}

// Named barriers: `threads` threads in all take part, some waiting (sync), some only signalling
// (arrive). Barrier 0 is __syncthreads()'s.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// named_barrier_sync that also tells every taking part whether any of them has `predicate` set.
__device__ __forceinline__ bool named_barrier_any(int id, int threads, bool predicate) {
    uint32_t any;
    asm volatile("{\n.reg .pred p, q;\nsetp.ne.u32 q, %1, 0;\nbarrier.cta.red.or.pred p, %2, %3, q;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(any)
                 : "r"(static_cast<uint32_t>(predicate)), "r"(id), "r"(threads)
                 : "memory");
    return any != 0;
}

} // namespace flash::sm90
