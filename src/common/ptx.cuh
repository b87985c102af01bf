// Thin wrappers over the SM80 PTX instructions the kernel is built from (cp.async, ldmatrix and
// mma.sync) and over what any kernel may use (a prefetch, programmatic dependent launch's
// controls). Each is one instruction; the callers decide the addresses and fragment layouts.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flash::ptx {

__device__ __forceinline__ uint32_t shared_address(const void *smem_ptr) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(smem_ptr));
}

// 16-byte global->shared copy that bypasses L1 (.cg) and the register file; smem_dst is a
// shared-window address (shared_address).
__device__ __forceinline__ void cp_async_16(uint32_t smem_dst, const void *gmem_src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_dst), "l"(gmem_src));
}

// As cp_async_16, but copies src_bytes (0 or 16) and fills the rest of the 16 bytes with zeros:
// with 0 the source is not read, so rows past the end of a tensor arrive as zeros.
__device__ __forceinline__ void cp_async_16_zfill(uint32_t smem_dst, const void *gmem_src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_dst), "l"(gmem_src), "r"(src_bytes));
}

// Starts bringing the line holding `address` into L1 (and L2), holding no register for it.
__device__ __forceinline__ void prefetch_l1(const void *address) {
    asm volatile("prefetch.global.L1 [%0];\n" ::"l"(address));
}

// Programmatic dependent launch (sm_90; no-ops where compiled for older GPUs, which launch the next
// kernel after this one ends anyway): a kernel launched after this one with programmatic stream
// serialization may start its blocks once every block of this grid has run
// allow_dependent_launch (or exited); it waits for this grid's completion and the visibility of its
// writes with wait_for_prerequisite_grids before reading them. The overlap hides the second
// launch's latency.
__device__ __forceinline__ void allow_dependent_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_prerequisite_grids() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Closes the group of cp.async copies issued by this thread since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most n_pending of this thread's committed groups are still in flight.
template <int n_pending>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(n_pending));
}

// Loads four 8x8 matrices of 16-bit elements; lane i supplies the shared-window address of row
// i % 8 of matrix i / 8, and receives in r[j] its two elements of matrix j.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_row));
}

// As ldmatrix_x4, but each 8x8 matrix arrives transposed.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_row));
}

// 2^x on the special-function unit (one MUFU.EX2); flushes denormal results to zero.
__device__ __forceinline__ float exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// tanh(x) on the special-function unit (one MUFU.TANH, sm_75+), relative error about 2^-11.
__device__ __forceinline__ float tanh(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// d += a * b for one 16x8x16 tile: a row-major (4 registers of 2 elements), b column-major
// (2 registers), d in float32 (4 registers).
template <typename value_t>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);

template <>
__device__ __forceinline__ void mma_m16n8k16<half>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma_m16n8k16<nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                          const uint32_t (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

} // namespace flash::ptx
