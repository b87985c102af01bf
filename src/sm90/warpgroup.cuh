// Warpgroup roles: moving registers between warpgroups (setmaxnreg) and the named barriers that
// synchronize some warpgroups of a block without the others.
#pragma once

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

} // namespace flash::sm90
