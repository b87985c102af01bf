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
#include <type_traits>

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

// Bytes of a (low) and b (high), 0 .. 7, picked by the selector's four nibbles.
__device__ __forceinline__ uint32_t byte_permute(uint32_t a, uint32_t b, uint32_t selector) {
    uint32_t picked;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(picked) : "r"(a), "r"(b), "r"(selector));
    return picked;
}

// One V tile transposed by rows (where Kernel::transposes_V_by_rows): a warp's unit is 16 keys of
// each of 32 / lanes_per_row key groups by one column block of V's tile. A lane reads 4 bytes (4
// columns) of each of its group's 16 keys, one row per load (so a warp's load reads whole rows: no
// bank conflicts at the 128-byte swizzle), and writes each column's 16 keys as one 16-byte chunk of
// that column's row of the transposed tile. Neighbouring lanes write their four rows in rotated
// orders, so that the 8 rows a quarter of the warp writes at once cover every chunk of the swizzle.
// A lane holds a unit's 16 words and their permutes: the transposing warps keep 56 registers.
template <typename Kernel>
struct TransposeByRows {
    using Swizzle = typename Kernel::Swizzle;
    using Vt_Swizzle = typename Kernel::Vt_Swizzle;
    static constexpr int lanes_per_row = Swizzle::bytes / 4; // of one column block
    static constexpr int groups_per_unit = WARP_SIZE / lanes_per_row;
    static_assert(Kernel::B_c / 16 % groups_per_unit == 0, "a unit's key groups are whole");
    static constexpr int unit_groups = Kernel::B_c / 16 / groups_per_unit;
    static constexpr int units = unit_groups * Kernel::col_blocks;
    // 16-key groups (one 16-byte chunk each) per row of a transposed tile's column block.
    static constexpr int groups_per_Vt_row = Vt_Swizzle::bytes / COPY_BYTES;

    int warp;
    int column;    // of the lane's four, in its column block
    int sub_group; // the lane's key group in a unit
    int rotation;
    // The lane's i-th store is of column (i + rotation) % 4. Two keys' words interleave into the
    // lane's first two columns' bytes and its last two's (pair_selector[0] and [1]: a column c0 of
    // both, then a column c1 of both), so that two such pairs give each column's word in one more
    // permute.
    uint32_t pair_selector[2];

    __device__ __forceinline__ TransposeByRows(int warp_, int lane)
        : warp(warp_), column(4 * (lane % lanes_per_row)), sub_group(lane / lanes_per_row), rotation(lane / 2 % 4) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const uint32_t c0 = (2 * half + rotation) % 4;
            const uint32_t c1 = (2 * half + 1 + rotation) % 4;
            pair_selector[half] = c0 | (c0 + 4) << 4 | c1 << 8 | (c1 + 4) << 12;
        }
    }

    __device__ __forceinline__ void operator()(const uint8_t *V, uint8_t *Vt) const {
        // One unit at a time: the producer warpgroup keeps few registers.
#pragma unroll 1
        for (int unit = warp; unit < units; unit += Kernel::transposer_warps) {
            const int group = unit % unit_groups * groups_per_unit + sub_group;
            const int block = unit / unit_groups;
            // The unit's rows start on a swizzle atom (8 rows), so its row 16 group + k is swizzled
            // as row k is: the per-row part of each address is the same in every unit.
            const uint8_t *const rows = V + block * Kernel::KV_col_block_bytes + 16 * group * Swizzle::bytes;
            uint32_t keys[16];
#pragma unroll
            for (int k = 0; k < 16; ++k)
                keys[k] = *reinterpret_cast<const uint32_t *>(rows + load_offset(k, column));
            // Slot word w holds keys 2w, 2w + 1, 2w + 8 and 2w + 9: pairs[w][half][0] the first two's
            // bytes of the half's two columns, pairs[w][half][1] the last two's.
            uint32_t pairs[4][2][2];
#pragma unroll
            for (int w = 0; w < 4; ++w)
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    pairs[w][half][0] = byte_permute(keys[2 * w], keys[2 * w + 1], pair_selector[half]);
                    pairs[w][half][1] = byte_permute(keys[2 * w + 8], keys[2 * w + 9], pair_selector[half]);
                }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                // Column i % 2 of the half's two: the pairs' low or high 16 bits.
                const uint32_t take = i % 2 == 0 ? 0x5410 : 0x7632;
                uint32_t chunk[4];
#pragma unroll
                for (int w = 0; w < 4; ++w)
                    chunk[w] = byte_permute(pairs[w][i / 2][0], pairs[w][i / 2][1], take);
                // The column block's rows start on a swizzle atom too.
                const int row = column + (i + rotation) % 4;
                const int Vt_block = group / groups_per_Vt_row;
                *reinterpret_cast<uint4 *>(Vt + Vt_block * Kernel::Vt_col_block_bytes +
                                           (block * Swizzle::cols + row) * Vt_Swizzle::bytes +
                                           Vt_Swizzle::chunk_in_row(row, group % groups_per_Vt_row) * COPY_BYTES) =
                    make_uint4(chunk[0], chunk[1], chunk[2], chunk[3]);
            }
        }
    }

  private:
    // Where the lane's 4 bytes at `column` of row k (0 .. 15) of a unit's rows lie.
    __device__ __forceinline__ static int load_offset(int k, int column) {
        return k * Swizzle::bytes + Swizzle::chunk_in_row(k, column / COPY_BYTES) * COPY_BYTES + column % COPY_BYTES;
    }
};

// One V tile transposed by ldmatrix and stmatrix (elsewhere): a warp's unit is one 16-key group by
// two 16-byte column chunks of V (32 columns), one ldmatrix and one stmatrix of four 8x8 matrices
// of 16-bit elements, so that the transposing warps keep as few registers as the loading warp (24)
// and move 512 bytes per instruction; a warp takes two units at a time, whose addresses share
// their arithmetic. ldmatrix.trans hands lane (j = lane / 4, u = lane % 4) of each
// matrix (8 keys by 16 columns) the bytes of columns 2j, 2j + 1 of keys 2u, 2u + 1: with the matrix
// of the group's other 8 keys, one byte permute gives column 2j's slots 4u .. 4u + 3 (keys 2u,
// 2u + 1, 2u + 8, 2u + 9, P's order) and another column 2j + 1's, which stmatrix writes as the 4
// bytes of lane (j, u) in its matrix's row j. A matrix of even columns alone would put its 8 rows in
// 4 of the swizzle's 8 chunk positions (two rows each, a 2-way bank conflict): the lanes of rows
// 4 .. 7 swap their even and odd columns, so that each matrix holds 4 even and 4 odd columns of V,
// every chunk position once.
template <typename Kernel>
struct TransposeByMatrices {
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

    int warp;
    // What every unit's addresses share. The unit's rows of V and of the transposed tile start on
    // swizzle atoms (8 rows), so the lane's row in each is swizzled as its row in the unit is: the
    // swizzle XORs a unit's chunk with a constant of the lane's, which lies below the row's first
    // byte (a multiple of the swizzle's row bytes), so the lane's row offsets carry it, and a unit's
    // own chunk offset is XORed onto the sum. (A unit's chunks, 2 pair + chunk_in_pair, lie in one
    // column block of V.)
    uint32_t V_row, Vt_row;
    // The lane's first permute (the second takes the other parity).
    uint32_t selector;

    __device__ __forceinline__ TransposeByMatrices(int warp_, int lane) : warp(warp_) {
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
        selector = lane >= 16 ? ODD_COLUMN : EVEN_COLUMN;
        V_row = key_in_group * Swizzle::bytes + Swizzle::chunk_in_row(key_in_group, chunk_in_pair) * COPY_BYTES;
        Vt_row = Vt_row_in_pair * Vt_Swizzle::bytes + Vt_Swizzle::chunk_in_row(Vt_row_in_pair, 0) * COPY_BYTES;
    }

    __device__ __forceinline__ void operator()(const uint8_t *V_tile, uint8_t *Vt_tile) const {
        const uint32_t V = ptx::shared_address(V_tile) + V_row;
        const uint32_t Vt = ptx::shared_address(Vt_tile) + Vt_row;
        // Two units per pass, a key group's chunk pairs 2p and 2p + 1, so that the second's
        // addresses cost an instruction each (at 24 registers ptxas still issues its load after the
        // first's permutes): its chunks lie 32 bytes further along V's rows in the same column block
        // (the first's chunk offset a multiple of 64 bytes, so the swizzle flips the address's bit
        // 5), and 32 rows further down the transposed tile.
#pragma unroll 1
        for (uint32_t pair = warp; pair < units / 2; pair += Kernel::transposer_warps) {
            const uint32_t group = pair % key_groups;
            const uint32_t chunk = 4 * (pair / key_groups); // the first unit's first, of V's row
            const uint32_t V_first = (V + chunk / chunks_per_V_row * Kernel::KV_col_block_bytes + group * 16 * Swizzle::bytes) ^
                                     chunk % chunks_per_V_row * COPY_BYTES;
            const uint32_t Vt_first = (Vt ^ group % groups_per_Vt_row * COPY_BYTES) +
                                      group / groups_per_Vt_row * Kernel::Vt_col_block_bytes +
                                      chunk * COPY_BYTES * Vt_Swizzle::bytes;
            uint32_t slots[2][4];
            ptx::ldmatrix_x4_trans(slots[0], V_first);
            ptx::ldmatrix_x4_trans(slots[1], V_first ^ 2 * COPY_BYTES);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint32_t columns[4] = {slots[h][0], slots[h][1], slots[h][2], slots[h][3]};
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    slots[h][i] = byte_permute(columns[i / 2 * 2], columns[i / 2 * 2 + 1],
                                               i % 2 == 0 ? selector : selector ^ (EVEN_COLUMN ^ ODD_COLUMN));
            }
            // A chunk is 16 one-byte columns: 16 rows of the transposed tile.
            stmatrix_x4(Vt_first, slots[0]);
            stmatrix_x4(Vt_first + 2 * COPY_BYTES * Vt_Swizzle::bytes, slots[1]);
        }
    }

  private:
    static_assert(chunk_pairs % 2 == 0 && chunks_per_V_row % 4 == 0, "a unit pair's chunks lie in one column block");

    // Stores four 8x8 matrices of 16-bit elements (sm_90): lane i supplies the shared-window address
    // of row i % 8 of matrix i / 8, and r[j] its two elements of matrix j (row lane / 4).
    __device__ __forceinline__ static void stmatrix_x4(uint32_t smem_row, const uint32_t (&r)[4]) {
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_row), "r"(r[0]),
                     "r"(r[1]), "r"(r[2]), "r"(r[3])
                     : "memory");
    }
};

// The warps of the producer warpgroup after its first: each V tile the producer loads, in the order
// it loads them, once it has landed and its stage's transposed tile has been released, goes into
// that tile as d_head rows of B_c keys (each 16 keys in P's register order), swizzled as the wgmma's
// K-major B operand: column blocks of one swizzled row's keys (Kernel::Vt_col_block_bytes apart),
// by rows or by matrices as the traits choose (Kernel::transposes_V_by_rows).
// The producer ends the stream by arriving on the next stage's V barrier without bytes, having
// written how many tiles it loaded in that stage's word (SharedTiles::V_stream_end).
template <typename Kernel>
struct VTransposer {
    using Transpose = std::conditional_t<Kernel::transposes_V_by_rows, TransposeByRows<Kernel>, TransposeByMatrices<Kernel>>;

    const SharedTiles<Kernel> &smem;

    __device__ __forceinline__ void run() const {
        const int lane = threadIdx.x % WARP_SIZE;
        const Transpose transpose(threadIdx.x / WARP_SIZE - 1, lane);
        for (int n = 0;; ++n) {
            const int stage = n % Kernel::stages;
            const uint32_t parity = n / Kernel::stages % 2;
            mbarrier_wait(smem.V_full(stage), parity);
            // Read by the lane that releases the stage, so that the read precedes the release in
            // its own program order.
            if (__shfl_sync(FULL_WARP_MASK, lane == 0 ? *smem.V_stream_end(stage) : 0, 0) == n)
                return;
            mbarrier_wait(smem.Vt_empty(stage), parity ^ 1);
            transpose(smem.V(stage), smem.Vt(stage));
            fence_async_shared(); // the wgmma reads the tile through the async proxy
            __syncwarp();
            if (lane == 0) {
                mbarrier_arrive(smem.Vt_full(stage));
                mbarrier_arrive(smem.V_empty(stage));
            }
        }
    }
};

} // namespace flash::sm90
