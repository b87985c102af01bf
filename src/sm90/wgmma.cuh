// Warpgroup matrix products (wgmma.mma_async, sm_90a): shared-memory matrix descriptors, the
// m64nNk16 instructions with A from shared memory or from registers, and the fences, commits and
// waits that order them. Each wrapper is one instruction; the kernel decides the layouts.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "common/common.h"
#include "common/dtype.h"
#include "common/fragments.cuh"

namespace flash::sm90 {

// A warpgroup: four consecutive warps, the first of them at a warp index divisible by four.
constexpr int WARPGROUP_THREADS = 128;
// One wgmma multiplies 64 rows of A (16 per warp) by a 32-byte deep slice of B: 16 elements of a
// 16-bit type, 32 of an 8-bit one.
constexpr int WGMMA_M = 64;
constexpr int WGMMA_K = 16;
constexpr int WGMMA_K_BYTES = 32;

// Shared-memory tiles are swizzled as TMA writes them (CU_TENSOR_MAP_SWIZZLE_128B, _64B or _32B):
// rows of BYTES (64, 32 or 16 16-bit elements; 128, 64 or 32 8-bit ones), whose 16-byte chunks are
// XOR-ed with address bits 7 and up (the row's index, or its half or quarter, modulo the chunks in
// a row). Eight rows form one swizzle atom; a tile's column blocks start on atom boundaries. A row
// takes the widest swizzle its bytes are a multiple of: 128 bytes for most head sizes, 64 for the
// other multiples of 64 bytes (16-bit head sizes 32, 96, 160, 224), 32 for the other multiples of 32
// (16-bit head sizes 48, 80, ...), rather than padding rows with columns of zeros.
template <int BYTES, int ELEMENT = ELEMENT_BYTES>
struct Swizzle {
    static_assert(BYTES == 128 || BYTES == 64 || BYTES == 32, "the family uses the 128-, 64- and 32-byte swizzles");
    static constexpr int bytes = BYTES;
    static constexpr int cols = BYTES / ELEMENT;
    static constexpr int atom_bytes = 8 * BYTES;
    // The descriptors' swizzle mode (PTX ISA, "Matrix Descriptor Format"): 1 is 128 bytes, 2 is 64,
    // 3 is 32.
    static constexpr uint64_t descriptor_mode = BYTES == 128 ? 1 : BYTES == 64 ? 2 : 3;

    // Where the 16-byte chunk `chunk` of row `row` of a column block lies in that row.
    __device__ __forceinline__ static int chunk_in_row(int row, int chunk) {
        return chunk ^ (row * BYTES / 128 % (BYTES / COPY_BYTES));
    }
};
// The swizzle of a tile whose rows are `cols` elements of ELEMENT bytes: the widest that divides them.
template <int cols, int ELEMENT = ELEMENT_BYTES>
using SwizzleFor = Swizzle<cols * ELEMENT % 128 == 0 ? 128 : cols * ELEMENT % 64 == 0 ? 64 : 32, ELEMENT>;
// Every tile starts on a multiple of the largest atom, the 128-byte swizzle's.
constexpr int TILE_ALIGNMENT_BYTES = Swizzle<128>::atom_bytes;

// A wgmma shared-memory matrix descriptor for a swizzled operand (PTX ISA, "Matrix Descriptor
// Format"): the start address, the leading and stride dimension byte offsets (all in 16-byte
// units) and the swizzle mode in bits 62-63. The base offset stays 0: the atoms are aligned.
template <typename Swizzle>
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t smem_address, uint32_t leading_bytes, uint32_t stride_bytes) {
    return static_cast<uint64_t>((smem_address & 0x3FFFF) >> 4) | static_cast<uint64_t>(leading_bytes >> 4) << 16 |
           static_cast<uint64_t>(stride_bytes >> 4) << 32 | Swizzle::descriptor_mode << 62;
}

// An operand stored K-major (each row's K elements contiguous, as Q and K are): 8-row atoms one
// after another (the stride offset); the leading offset is unused with these swizzles (1 by
// convention): a 16-deep slice never crosses a row. Moving along K inside a row adds the byte
// offset to the start address.
template <typename Swizzle>
__device__ __forceinline__ uint64_t k_major_descriptor(uint32_t smem_address) {
    return smem_descriptor<Swizzle>(smem_address, 16, Swizzle::atom_bytes);
}

// An operand stored MN-major (each row's N elements contiguous, as V is for O += P V): column
// blocks of the N dimension lie block_bytes apart (the leading offset), 8-row groups along K one
// atom apart (the stride offset).
template <typename Swizzle>
__device__ __forceinline__ uint64_t mn_major_descriptor(uint32_t smem_address, uint32_t block_bytes) {
    return smem_descriptor<Swizzle>(smem_address, block_bytes, Swizzle::atom_bytes);
}

// Orders this warpgroup's register and shared-memory accesses before the wgmmas that follow.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

// Closes the group of wgmmas issued since the last commit.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// Waits until at most n_pending of this warpgroup's committed groups are still running.
template <int n_pending>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(n_pending) : "memory");
}

// Tells the compiler that registers an asynchronous wgmma reads or writes are used here, so it
// neither moves their other uses across the wgmma's wait nor reuses them while it runs.
template <int N>
__device__ __forceinline__ void fence_registers(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
        asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_registers(uint32_t (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
        asm volatile("" : "+r"(r[i])::"memory");
}

// The accumulators of a warpgroup's 64 x N product, per thread: N / 8 tiles of the m16n8
// accumulator layout (Accumulators<1, N / 8>), as the flat register list wgmma takes.
template <int N_tiles>
__device__ __forceinline__ float (&flat(Accumulators<1, N_tiles> &acc))[N_tiles * 4] {
    return reinterpret_cast<float(&)[N_tiles * 4]>(acc.r);
}

// The first n registers of a flat accumulator list: what a product narrower than the list writes.
template <int n, int N>
__device__ __forceinline__ float (&leading(float (&r)[N]))[n] {
    static_assert(n <= N, "a narrower product writes a prefix of the accumulators");
    return reinterpret_cast<float(&)[n]>(r);
}

// A warp's A fragments (one 16-row tile) as one register list, for fence_registers.
template <int K_slices>
__device__ __forceinline__ uint32_t (&flat(FragmentsA<1, K_slices> &a))[K_slices * 4] {
    return reinterpret_cast<uint32_t(&)[K_slices * 4]>(a.r);
}

// The operand lists of the accumulators: "%0, ..., %(n - 1)" and "+f"(d[0]), ..., "+f"(d[n - 1]).
#define FLASH_WGMMA_REGS_G0 "%0, %1, %2, %3, %4, %5, %6, %7"
#define FLASH_WGMMA_REGS_G1 "%8, %9, %10, %11, %12, %13, %14, %15"
#define FLASH_WGMMA_REGS_G2 "%16, %17, %18, %19, %20, %21, %22, %23"
#define FLASH_WGMMA_REGS_G3 "%24, %25, %26, %27, %28, %29, %30, %31"
#define FLASH_WGMMA_REGS_G4 "%32, %33, %34, %35, %36, %37, %38, %39"
#define FLASH_WGMMA_REGS_G5 "%40, %41, %42, %43, %44, %45, %46, %47"
#define FLASH_WGMMA_REGS_G6 "%48, %49, %50, %51, %52, %53, %54, %55"
#define FLASH_WGMMA_REGS_G7 "%56, %57, %58, %59, %60, %61, %62, %63"
#define FLASH_WGMMA_REGS_G8 "%64, %65, %66, %67, %68, %69, %70, %71"
#define FLASH_WGMMA_REGS_G9 "%72, %73, %74, %75, %76, %77, %78, %79"
#define FLASH_WGMMA_REGS_G10 "%80, %81, %82, %83, %84, %85, %86, %87"
#define FLASH_WGMMA_REGS_G11 "%88, %89, %90, %91, %92, %93, %94, %95"
#define FLASH_WGMMA_REGS_G12 "%96, %97, %98, %99, %100, %101, %102, %103"
#define FLASH_WGMMA_REGS_G13 "%104, %105, %106, %107, %108, %109, %110, %111"
#define FLASH_WGMMA_REGS_G14 "%112, %113, %114, %115, %116, %117, %118, %119"
#define FLASH_WGMMA_REGS_G15 "%120, %121, %122, %123, %124, %125, %126, %127"
#define FLASH_WGMMA_REGS_8 FLASH_WGMMA_REGS_G0
#define FLASH_WGMMA_REGS_16 FLASH_WGMMA_REGS_8 ", " FLASH_WGMMA_REGS_G1
#define FLASH_WGMMA_REGS_24 FLASH_WGMMA_REGS_16 ", " FLASH_WGMMA_REGS_G2
#define FLASH_WGMMA_REGS_32 FLASH_WGMMA_REGS_24 ", " FLASH_WGMMA_REGS_G3
#define FLASH_WGMMA_REGS_40 FLASH_WGMMA_REGS_32 ", " FLASH_WGMMA_REGS_G4
#define FLASH_WGMMA_REGS_48 FLASH_WGMMA_REGS_40 ", " FLASH_WGMMA_REGS_G5
#define FLASH_WGMMA_REGS_56 FLASH_WGMMA_REGS_48 ", " FLASH_WGMMA_REGS_G6
#define FLASH_WGMMA_REGS_64 FLASH_WGMMA_REGS_56 ", " FLASH_WGMMA_REGS_G7
#define FLASH_WGMMA_REGS_72 FLASH_WGMMA_REGS_64 ", " FLASH_WGMMA_REGS_G8
#define FLASH_WGMMA_REGS_80 FLASH_WGMMA_REGS_72 ", " FLASH_WGMMA_REGS_G9
#define FLASH_WGMMA_REGS_88 FLASH_WGMMA_REGS_80 ", " FLASH_WGMMA_REGS_G10
#define FLASH_WGMMA_REGS_96 FLASH_WGMMA_REGS_88 ", " FLASH_WGMMA_REGS_G11
#define FLASH_WGMMA_REGS_104 FLASH_WGMMA_REGS_96 ", " FLASH_WGMMA_REGS_G12
#define FLASH_WGMMA_REGS_112 FLASH_WGMMA_REGS_104 ", " FLASH_WGMMA_REGS_G13
#define FLASH_WGMMA_REGS_120 FLASH_WGMMA_REGS_112 ", " FLASH_WGMMA_REGS_G14
#define FLASH_WGMMA_REGS_128 FLASH_WGMMA_REGS_120 ", " FLASH_WGMMA_REGS_G15
#define FLASH_WGMMA_ACC_G(d, i)                                                                          \
    "+f"(d[i + 0]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]),       \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define FLASH_WGMMA_ACC_8(d) FLASH_WGMMA_ACC_G(d, 0)
#define FLASH_WGMMA_ACC_16(d) FLASH_WGMMA_ACC_8(d), FLASH_WGMMA_ACC_G(d, 8)
#define FLASH_WGMMA_ACC_24(d) FLASH_WGMMA_ACC_16(d), FLASH_WGMMA_ACC_G(d, 16)
#define FLASH_WGMMA_ACC_32(d) FLASH_WGMMA_ACC_24(d), FLASH_WGMMA_ACC_G(d, 24)
#define FLASH_WGMMA_ACC_40(d) FLASH_WGMMA_ACC_32(d), FLASH_WGMMA_ACC_G(d, 32)
#define FLASH_WGMMA_ACC_48(d) FLASH_WGMMA_ACC_40(d), FLASH_WGMMA_ACC_G(d, 40)
#define FLASH_WGMMA_ACC_56(d) FLASH_WGMMA_ACC_48(d), FLASH_WGMMA_ACC_G(d, 48)
#define FLASH_WGMMA_ACC_64(d) FLASH_WGMMA_ACC_56(d), FLASH_WGMMA_ACC_G(d, 56)
#define FLASH_WGMMA_ACC_72(d) FLASH_WGMMA_ACC_64(d), FLASH_WGMMA_ACC_G(d, 64)
#define FLASH_WGMMA_ACC_80(d) FLASH_WGMMA_ACC_72(d), FLASH_WGMMA_ACC_G(d, 72)
#define FLASH_WGMMA_ACC_88(d) FLASH_WGMMA_ACC_80(d), FLASH_WGMMA_ACC_G(d, 80)
#define FLASH_WGMMA_ACC_96(d) FLASH_WGMMA_ACC_88(d), FLASH_WGMMA_ACC_G(d, 88)
#define FLASH_WGMMA_ACC_104(d) FLASH_WGMMA_ACC_96(d), FLASH_WGMMA_ACC_G(d, 96)
#define FLASH_WGMMA_ACC_112(d) FLASH_WGMMA_ACC_104(d), FLASH_WGMMA_ACC_G(d, 104)
#define FLASH_WGMMA_ACC_120(d) FLASH_WGMMA_ACC_112(d), FLASH_WGMMA_ACC_G(d, 112)
#define FLASH_WGMMA_ACC_128(d) FLASH_WGMMA_ACC_120(d), FLASH_WGMMA_ACC_G(d, 120)

// d (64 x N, float32) = A * B + (accumulate ? d : 0) for one 32-byte deep slice (k16 of a 16-bit
// type, k32 of e4m3), per element type.
// ss: A from shared memory (K-major, descriptor a), B K-major. rs: A from registers (the m16n8k16
// A layout, one 16 x 16 tile per warp), B MN-major ("transposed", imm-trans-b = 1) as V is, or
// K-major as K is. Operands after the n = N / 2 accumulators are numbered n, n + 1, ...: the C*
// arguments.
#define FLASH_WGMMA_SS_ASM(N, C, C1, C2, TYPE)                                                          \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %" #C2 ", 0;\n"                                                     \
    "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " {" FLASH_WGMMA_REGS_##C "}, %" #C ", %" #C1 \
    ", p, 1, 1, 0, 0;\n}\n"
#define FLASH_WGMMA_RS_ASM(N, C, C1, C2, C3, C4, C5, TYPE, TRANS_B)                                     \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %" #C5 ", 0;\n"                                                     \
    "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " {" FLASH_WGMMA_REGS_##C "}, {%" #C ", %" #C1 \
    ", %" #C2 ", %" #C3 "}, %" #C4 ", p, 1, 1, " #TRANS_B ";\n}\n"
// e4m3 has no transposed forms: both operands are K-major, and the A fragments hold four 8-bit
// elements per register (the m16n8k32 A layout).
#define FLASH_WGMMA_SS_E4M3_ASM(N, C, C1, C2)                                                            \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %" #C2 ", 0;\n"                                                     \
    "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 {" FLASH_WGMMA_REGS_##C "}, %" #C ", %" #C1  \
    ", p, 1, 1;\n}\n"
#define FLASH_WGMMA_RS_E4M3_ASM(N, C, C1, C2, C3, C4, C5)                                                \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %" #C5 ", 0;\n"                                                     \
    "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 {" FLASH_WGMMA_REGS_##C "}, {%" #C ", %" #C1 \
    ", %" #C2 ", %" #C3 "}, %" #C4 ", p, 1, 1;\n}\n"
#define FLASH_WGMMA_RS_CALL(N, C, C1, C2, C3, C4, C5, TYPE, TRANS_B)                                    \
    asm volatile(FLASH_WGMMA_RS_ASM(N, C, C1, C2, C3, C4, C5, TYPE, TRANS_B)                              \
                 : FLASH_WGMMA_ACC_##C(d)                                                                 \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate))

template <int N>
struct Wgmma;

#define FLASH_DEFINE_WGMMA(N, C, C1, C2, C3, C4, C5)                                                     \
    template <>                                                                                           \
    struct Wgmma<N> {                                                                                     \
        template <typename value_t>                                                                       \
        static __device__ __forceinline__ void ss(float (&d)[C], uint64_t a, uint64_t b, int accumulate) { \
            if constexpr (std::is_same_v<value_t, half>)                                                  \
                asm volatile(FLASH_WGMMA_SS_ASM(N, C, C1, C2, "f16")                                      \
                             : FLASH_WGMMA_ACC_##C(d)                                                     \
                             : "l"(a), "l"(b), "r"(accumulate));                                          \
            else if constexpr (std::is_same_v<value_t, __nv_fp8_e4m3>)                                    \
                asm volatile(FLASH_WGMMA_SS_E4M3_ASM(N, C, C1, C2)                                        \
                             : FLASH_WGMMA_ACC_##C(d)                                                     \
                             : "l"(a), "l"(b), "r"(accumulate));                                          \
            else                                                                                          \
                asm volatile(FLASH_WGMMA_SS_ASM(N, C, C1, C2, "bf16")                                     \
                             : FLASH_WGMMA_ACC_##C(d)                                                     \
                             : "l"(a), "l"(b), "r"(accumulate));                                          \
        }                                                                                                 \
        /* e4m3 takes B K-major alone (B_MN_MAJOR is ignored: its V operand is transposed already). */    \
        template <typename value_t, bool B_MN_MAJOR = true>                                               \
        static __device__ __forceinline__ void rs(float (&d)[C], const uint32_t (&a)[4], uint64_t b,     \
                                                  int accumulate) {                                       \
            constexpr bool fp16 = std::is_same_v<value_t, half>;                                          \
            if constexpr (std::is_same_v<value_t, __nv_fp8_e4m3>)                                         \
                asm volatile(FLASH_WGMMA_RS_E4M3_ASM(N, C, C1, C2, C3, C4, C5)                            \
                             : FLASH_WGMMA_ACC_##C(d)                                                     \
                             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(accumulate));      \
            else if constexpr (fp16 && B_MN_MAJOR)                                                        \
                FLASH_WGMMA_RS_CALL(N, C, C1, C2, C3, C4, C5, "f16", 1);                                  \
            else if constexpr (fp16)                                                                      \
                FLASH_WGMMA_RS_CALL(N, C, C1, C2, C3, C4, C5, "f16", 0);                                  \
            else if constexpr (B_MN_MAJOR)                                                                \
                FLASH_WGMMA_RS_CALL(N, C, C1, C2, C3, C4, C5, "bf16", 1);                                 \
            else                                                                                          \
                FLASH_WGMMA_RS_CALL(N, C, C1, C2, C3, C4, C5, "bf16", 0);                                 \
        }                                                                                                 \
    };

// The N this family uses: the key tile sizes (S = Q K^T), half of them rounded up to 16 (a masked
// tile's narrower S) and the head sizes (O += P V).
FLASH_DEFINE_WGMMA(32, 16, 17, 18, 19, 20, 21)
FLASH_DEFINE_WGMMA(48, 24, 25, 26, 27, 28, 29)
FLASH_DEFINE_WGMMA(64, 32, 33, 34, 35, 36, 37)
FLASH_DEFINE_WGMMA(80, 40, 41, 42, 43, 44, 45)
FLASH_DEFINE_WGMMA(96, 48, 49, 50, 51, 52, 53)
FLASH_DEFINE_WGMMA(112, 56, 57, 58, 59, 60, 61)
FLASH_DEFINE_WGMMA(128, 64, 65, 66, 67, 68, 69)
FLASH_DEFINE_WGMMA(144, 72, 73, 74, 75, 76, 77)
FLASH_DEFINE_WGMMA(160, 80, 81, 82, 83, 84, 85)
FLASH_DEFINE_WGMMA(176, 88, 89, 90, 91, 92, 93)
FLASH_DEFINE_WGMMA(192, 96, 97, 98, 99, 100, 101)
FLASH_DEFINE_WGMMA(224, 112, 113, 114, 115, 116, 117)
FLASH_DEFINE_WGMMA(256, 128, 129, 130, 131, 132, 133)

#undef FLASH_DEFINE_WGMMA

} // namespace flash::sm90
