// The operands of P V with e4m3 inputs. The 8-bit wgmma takes B K-major only, but V arrives with
// its keys as rows (each key's d_head values contiguous): the producer warpgroup's other warps
// transpose each V tile in shared memory (VTransposer) into d_head rows of B_c keys. P comes from
// the S accumulators in registers, where a thread holds keys 2t, 2t + 1 of each 8-key column tile
// (t = lane % 4), while the m16n8k32 A layout wants keys 4t .. 4t + 3 of each 16: rather than
// exchange values between lanes, the transposed tile stores the keys of each 16 in the order the
// registers hold them, and P packs its registers as they are (probabilities_to_e4m3): in a
// register of P's A fragment the four slots 4t .. 4t + 3 of a 16-key group hold keys 2t, 2t + 1
// (the left accumulator tile's pair) and 2t + 8, 2t + 9 (the right one's).
#pragma once

#include <cstdint>

#include "common/common.h"
#include "common/e4m3.cuh"
#include "common/forward_params.h"
#include "common/fragments.cuh"
#include "sm90/shared_tiles.cuh"
#include "sm90/tma.cuh"

namespace flash::sm90 {

// Four floats as e4m3 (round to nearest, saturated at 448) in one register, a in the lowest byte.
__device__ __forceinline__ uint32_t pack_e4m3x4(float a, float b, float c, float d) {
    uint32_t packed;
    // cvt puts its first source in the upper byte of each 16-bit half.
    asm("{\n.reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        "mov.b32 %0, {lo, hi};\n}\n"
        : "=r"(packed)
        : "f"(a), "f"(b), "f"(c), "f"(d));
    return packed;
}

// P (one warp's 16 rows of probabilities, as S's accumulators) as the A fragments of P V, 32 keys
// per k-slice: registers 0 and 1 rows lane / 4 and lane / 4 + 8 of the slice's first 16 keys,
// registers 2 and 3 of its last 16, each the thread's pairs of two neighbouring 8-key tiles.
template <int N_tiles>
__device__ __forceinline__ void probabilities_to_e4m3(FragmentsA<1, N_tiles / 4> &P, const Accumulators<1, N_tiles> &S) {
#pragma unroll
    for (int kk = 0; kk < N_tiles / 4; ++kk)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float(&left)[4] = S.r[0][4 * kk + 2 * half];
            const float(&right)[4] = S.r[0][4 * kk + 2 * half + 1];
            P.r[0][kk][2 * half] = pack_e4m3x4(left[0], left[1], right[0], right[1]);
            P.r[0][kk][2 * half + 1] = pack_e4m3x4(left[2], left[3], right[2], right[3]);
        }
}

// The warps of the producer warpgroup after its first: each V tile the producer loads, in the order
// it loads them, once it has landed and its stage's transposed tile has been released, goes into
// that tile as d_head rows of B_c keys (each 16 keys in P's register order), swizzled as the wgmma's
// K-major B operand: column blocks of one swizzled row's keys (Kernel::Vt_col_block_bytes apart).
// The producer ends the stream by arriving on the next stage's V barrier without bytes, having
// written how many tiles it loaded in that stage's word (SharedTiles::V_stream_end).
//
// A warp's unit is one 16-key group by two 16-byte column chunks of V (32 columns): one ldmatrix
// and one stmatrix of four 8x8 matrices of 16-bit elements, so that the warps keep few registers
// (the producer warpgroup gives the consumers all but 24) and move 512 bytes per instruction.
// ldmatrix.trans hands lane (j = lane / 4, u = lane % 4) of each matrix (8 keys by 16 columns) the
// bytes of columns 2j, 2j + 1 of keys 2u, 2u + 1: with the matrix of the group's other 8 keys, one
// byte permute gives column 2j's slots 4u .. 4u + 3 (keys 2u, 2u + 1, 2u + 8, 2u + 9, P's order)
// and another column 2j + 1's, which stmatrix writes as the 4 bytes of lane (j, u) in its matrix's
// row j. A matrix of even columns alone would put its 8 rows in 4 of the swizzle's 8 chunk
// positions (two rows each, a 2-way bank conflict): the lanes of rows 4 .. 7 swap their even and
// odd columns, so that each matrix holds 4 even and 4 odd columns of V, every chunk position once.
template <typename Kernel>
struct VTransposer {
    using Swizzle = typename Kernel::Swizzle;
    using Vt_Swizzle = typename Kernel::Vt_Swizzle;
    static constexpr int key_groups = Kernel::B_c / 16;
    static constexpr int chunk_pairs = Kernel::d_head / (2 * COPY_BYTES);
    static constexpr int units = key_groups * chunk_pairs;
    static constexpr int chunks_per_V_row = Swizzle::bytes / COPY_BYTES; // of one column block
    // 16-key groups (one 16-byte chunk each) per row of a transposed tile's column block.
    static constexpr int groups_per_Vt_row = Vt_Swizzle::bytes / COPY_BYTES;
    // Byte permutes of a matrix of keys 0 .. 7 (low) and one of keys 8 .. 15: even, odd columns.
    static constexpr uint32_t EVEN_COLUMN = 0x6420;
    static constexpr uint32_t ODD_COLUMN = 0x7531;

    const SharedTiles<Kernel> &smem;

    __device__ __forceinline__ void run() const {
        const int warp = threadIdx.x / WARP_SIZE - 1;
        const int lane = threadIdx.x % WARP_SIZE;
        // The lane supplies the address of row `row` of matrix `matrix`, for the load and the store.
        const int matrix = lane / 8;
        const int row = lane % 8;
        // The load's matrices: keys 0 .. 7 and 8 .. 15 of the unit's first chunk, then of its second.
        const int key_in_group = 8 * (matrix % 2) + row;
        const int chunk_in_pair = matrix / 2;
        // The store's matrices: per chunk, the lanes' first permute, then their second; rows 4 .. 7
        // of each hold the other parity of columns (the selectors of lanes 16 .. 31 swap).
        const bool swapped_row = row >= 4;
        const int Vt_row_in_pair = COPY_BYTES * chunk_in_pair + 2 * row + (swapped_row != (matrix % 2 == 1) ? 1 : 0);
        const bool swapped_lane = lane >= 16;
        const uint32_t selector[2] = {swapped_lane ? ODD_COLUMN : EVEN_COLUMN, swapped_lane ? EVEN_COLUMN : ODD_COLUMN};
        // What every unit's addresses share. The unit's rows of V and of the transposed tile start
        // on swizzle atoms (8 rows), so the lane's row in each is swizzled as `row` or
        // Vt_row_in_pair is: the swizzle XORs a unit's chunk with a constant of the lane's. (A
        // unit's chunks, 2 pair + chunk_in_pair, lie in one column block of V.)
        const uint32_t V_lane = key_in_group * Swizzle::bytes;
        const uint32_t V_xor = Swizzle::chunk_in_row(key_in_group, chunk_in_pair) * COPY_BYTES;
        const uint32_t Vt_lane = Vt_row_in_pair * Vt_Swizzle::bytes;
        const uint32_t Vt_xor = Vt_Swizzle::chunk_in_row(Vt_row_in_pair, 0) * COPY_BYTES;
        for (int n = 0;; ++n) {
            const int stage = n % Kernel::stages;
            const uint32_t parity = n / Kernel::stages % 2;
            mbarrier_wait(smem.V_full(stage), parity);
            // Read by the lane that releases the stage, so that the read precedes the release in
            // its own program order.
            if (__shfl_sync(FULL_WARP_MASK, lane == 0 ? *smem.V_stream_end(stage) : 0, 0) == n)
                return;
            mbarrier_wait(smem.Vt_empty(stage), parity ^ 1);
            const uint32_t V = ptx::shared_address(smem.V(stage)) + V_lane;
            const uint32_t Vt = ptx::shared_address(smem.Vt(stage)) + Vt_lane;
#pragma unroll 1
            for (uint32_t unit = warp; unit < units; unit += Kernel::transposer_warps) {
                const uint32_t group = unit % key_groups;
                const uint32_t chunk = 2 * (unit / key_groups); // the unit's first, of V's row (d_head bytes)
                uint32_t columns[4];
                ptx::ldmatrix_x4_trans(columns, V + chunk / chunks_per_V_row * Kernel::KV_col_block_bytes +
                                                    group * 16 * Swizzle::bytes +
                                                    (chunk % chunks_per_V_row * COPY_BYTES ^ V_xor));
                uint32_t slots[4];
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    slots[i] = byte_permute(columns[i / 2 * 2], columns[i / 2 * 2 + 1], selector[i % 2]);
                // A chunk is 16 one-byte columns: 16 rows of the transposed tile.
                stmatrix_x4(Vt + group / groups_per_Vt_row * Kernel::Vt_col_block_bytes +
                                chunk * COPY_BYTES * Vt_Swizzle::bytes + (group % groups_per_Vt_row * COPY_BYTES ^ Vt_xor),
                            slots);
            }
            fence_async_shared(); // the wgmma reads the tile through the async proxy
            __syncwarp();
            if (lane == 0) {
                mbarrier_arrive(smem.Vt_full(stage));
                mbarrier_arrive(smem.V_empty(stage));
            }
        }
    }

  private:
    // Bytes of a (low) and b (high), 0 .. 7, picked by the selector's four nibbles.
    __device__ __forceinline__ static uint32_t byte_permute(uint32_t a, uint32_t b, uint32_t selector) {
        uint32_t picked;
        asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(picked) : "r"(a), "r"(b), "r"(selector));
        return picked;
    }
    // Stores four 8x8 matrices of 16-bit elements (sm_90): lane i supplies the shared-window address
    // of row i % 8 of matrix i / 8, and r[j] its two elements of matrix j (row lane / 4).
    __device__ __forceinline__ static void stmatrix_x4(uint32_t smem_row, const uint32_t (&r)[4]) {
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_row), "r"(r[0]),
                     "r"(r[1]), "r"(r[2]), "r"(r[3])
                     : "memory");
    }
};

} // namespace flash::sm90
