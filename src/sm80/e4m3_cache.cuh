// The products of a block that reads an FP8 (e4m3) KV cache (KV_E4M3): K and V fragments come
// straight from the e4m3 tiles the copies left in shared memory, and are widened in registers
// to float16, whose products the tensor cores then run (every e4m3 value is a float16 value, and
// the hardware converts a pair in one instruction). Nothing is widened through shared memory, so a
// tile costs about a 16-bit tile's instructions at half its bytes.
//
// An e4m3 tile is laid out as a 16-bit tile of half the columns (KVTileCopies::Staged_tile), so
// the 16-bit ldmatrix reads it; each lane's 32-bit word then holds four e4m3 values where a 16-bit
// fragment holds two:
// - K (no transpose): the word of an n-tile at 16-bit k-slice s holds d = 32s + 4(l%4) + 0..3 of
//   key l/4; its halves are the two registers of a float16 B fragment whose k index 2(l%4) + {0, 1}
//   stands for d 4(l%4) + {0, 1} and 2(l%4) + 8 + {0, 1} for d 4(l%4) + {2, 3}. S = Q K^T sums
//   over d in any order both operands agree on, so Q's A fragments are read in that order.
// - V (transposed): the word holds keys k, k + 1 (k = 2(l%4)) at d = 2c and 2c + 1 (c the lane's
//   16-bit column); a byte permute splits it into d = 2c's pair of keys and d = 2c + 1's, so each
//   16-bit n-tile j yields the float16 n-tiles of the even columns 16j + 2i and of the odd ones.
//   O's accumulators are held in that order during the walk and put back in the usual order
//   (unpermute_O) before anything reads their columns.
//
// Q of bfloat16 becomes float16 row by row, times a power of two that brings the row's largest
// magnitude into [2^14, 2^15) (float16's largest value is 65504), and each score row is divided by
// it again: both exact, so a row's scores are its bfloat16 products whatever its scale; values
// below 2^-28 of their row's largest lose bits to float16's subnormals, far below bfloat16's own
// rounding. P is float16 too (more precise than bfloat16 in [0, 1]).
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/common.h"
#include "common/e4m3.cuh"
#include "common/fragments.cuh"
#include "common/ptx.cuh"
#include "sm80/layout.cuh"
#include "sm80/load_store.cuh"

namespace flash::sm80 {

template <typename Kernel>
struct E4M3CacheProducts {
    using value_t = typename Kernel::value_t;
    static constexpr int M_tiles = Kernel::M_tiles;
    static constexpr int S_tiles = Kernel::S_tiles;
    static constexpr int O_tiles = Kernel::O_tiles;
    static constexpr int PV_slices = Kernel::PV_slices;
    // 16-bit k-slices of an e4m3 K tile's row (each holds two float16 k-slices), and 16-bit n-tiles
    // of an e4m3 V tile's row (each yields two float16 n-tiles of O).
    static constexpr int K_word_slices = Kernel::QK_slices / 2;
    static constexpr int V_word_tiles = O_tiles / 2;
    static_assert(Kernel::QK_slices % 2 == 0 && V_word_tiles % 2 == 0, "d_head must be a multiple of 32");
    static constexpr bool scales_rows = std::is_same_v<value_t, nv_bfloat16>;

    FragmentsA<M_tiles, Kernel::QK_slices> Q; // float16, k-slices in the order K's words give
    float row_unscale[M_tiles][2];            // per lane's rows l/4 and l/4 + 8 of each row tile

    // Q's fragments from the block's Q tile (which has landed and is visible to the warp).
    template <typename Tile>
    __device__ __forceinline__ void load_Q(const Tile &Q_tile, int warp_first_row) {
        const int lane = threadIdx.x % WARP_SIZE;
        const int quad = lane % QUAD_SIZE;
#pragma unroll
        for (int m = 0; m < M_tiles; ++m)
#pragma unroll
            for (int half_row = 0; half_row < 2; ++half_row) {
                const int row = warp_first_row + m * MMA_M + half_row * 8 + lane / QUAD_SIZE;
                // Four consecutive columns per k-slice: 4(l%4) .. 4(l%4) + 3.
                float values[Kernel::QK_slices][4];
                float largest = 0.0f;
#pragma unroll
                for (int s = 0; s < Kernel::QK_slices; ++s) {
                    const uint2 four = *reinterpret_cast<const uint2 *>(Q_tile.at(row, s * MMA_K + 4 * quad));
                    const float2 low = unpack_pair<value_t>(four.x), high = unpack_pair<value_t>(four.y);
                    values[s][0] = low.x, values[s][1] = low.y, values[s][2] = high.x, values[s][3] = high.y;
#pragma unroll
                    for (int i = 0; i < 4; ++i)
                        largest = fmaxf(largest, fabsf(values[s][i]));
                }
                float scale = 1.0f;
                row_unscale[m][half_row] = 1.0f;
                if constexpr (scales_rows) {
                    largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, 1));
                    largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, 2));
                    // 2^shift brings the largest into [2^14, 2^15); a zero row takes any scale.
                    const int exponent = (__float_as_int(largest) >> 23) & 0xff;
                    const int shift = min(max(127 + 14 - exponent, -126), 126);
                    scale = __int_as_float((127 + shift) << 23);
                    row_unscale[m][half_row] = __int_as_float((127 - shift) << 23);
                }
#pragma unroll
                for (int s = 0; s < Kernel::QK_slices; ++s) {
                    Q.r[m][s][half_row] = pack_pair<half>(values[s][0] * scale, values[s][1] * scale);
                    Q.r[m][s][2 + half_row] = pack_pair<half>(values[s][2] * scale, values[s][3] * scale);
                }
            }
    }

    // S = Q K^T over the warp's keys of the e4m3 K tile at K_addresses, in each row's own units.
    template <typename Addresses>
    __device__ __forceinline__ void scores(Accumulators<M_tiles, S_tiles> &S, const Addresses &K_addresses) const {
#pragma unroll
        for (int w = 0; w < K_word_slices; ++w) {
            FragmentsB<S_tiles, 1> words;
            load_B_from_rows_n(words, K_addresses, w);
#pragma unroll
            for (int n = 0; n < S_tiles; ++n)
#pragma unroll
                for (int half_slice = 0; half_slice < 2; ++half_slice) {
                    const uint2 pairs = e4m3x4_to_half2x2(words.r[n][0][half_slice]);
                    const uint32_t K[2] = {pairs.x, pairs.y};
#pragma unroll
                    for (int m = 0; m < M_tiles; ++m)
                        ptx::mma_m16n8k16<half>(S.r[m][n], Q.r[m][2 * w + half_slice], K);
                }
        }
        if constexpr (scales_rows)
#pragma unroll
            for (int m = 0; m < M_tiles; ++m)
#pragma unroll
                for (int n = 0; n < S_tiles; ++n)
#pragma unroll
                    for (int i = 0; i < 4; ++i)
                        S.r[m][n][i] *= row_unscale[m][i / 2];
    }

    // O += P V over the warp's keys of the e4m3 V tile at V_addresses, O's columns in the walk's
    // order (unpermute_O).
    template <typename Addresses>
    __device__ __forceinline__ void accumulate(Accumulators<M_tiles, O_tiles> &O,
                                               const FragmentsA<M_tiles, PV_slices> &P,
                                               const Addresses &V_addresses) const {
#pragma unroll
        for (int s = 0; s < PV_slices; ++s) {
            FragmentsB<V_word_tiles, 1> words;
            load_B_from_rows_k(words, V_addresses, s);
#pragma unroll
            for (int j = 0; j < V_word_tiles; ++j) {
                const uint32_t low_keys = words.r[j][0][0], high_keys = words.r[j][0][1];
#pragma unroll
                for (int odd = 0; odd < 2; ++odd) {
                    // Bytes 0 and 2 (even columns) or 1 and 3 (odd) of each word: keys k, k + 1 in
                    // the low half, k + 8, k + 9 in the high half.
                    const uint32_t pairs = __byte_perm(low_keys, high_keys, odd ? 0x7531 : 0x6420);
                    const uint2 widened = e4m3x4_to_half2x2(pairs);
                    const uint32_t V[2] = {widened.x, widened.y};
#pragma unroll
                    for (int m = 0; m < M_tiles; ++m)
                        ptx::mma_m16n8k16<half>(O.r[m][2 * j + odd], P.r[m][s], V);
                }
            }
        }
    }

    // O's accumulators from the walk's column order to the usual one (common/fragments.cuh), within
    // each quad of lanes: in the walk's order lane l holds d = 16j + 4(l%4) + 0..3 of 16-column
    // group j as tiles 2j and 2j + 1's registers (0: +0, 1: +2 of tile 2j; 0: +1, 1: +3 of 2j + 1;
    // registers 2 and 3 the same for row l/4 + 8). Called by every lane of the warp.
    static __device__ __forceinline__ void unpermute_O(Accumulators<M_tiles, O_tiles> &O) {
        const int lane = threadIdx.x % WARP_SIZE;
        const int quad = lane % QUAD_SIZE;
        const int quad_base = lane - quad;
        const bool odd = quad % 2;
        // Columns 2q, 2q + 1 of a 16-column group are lane q/2's d + 0/+1 (even q) or +2/+3 (odd q),
        // columns 8 + 2q, 8 + 2q + 1 lane 2 + q/2's.
        const int low_source = quad_base + quad / 2, high_source = quad_base + 2 + quad / 2;
#pragma unroll
        for (int m = 0; m < M_tiles; ++m)
#pragma unroll
            for (int j = 0; j < V_word_tiles; ++j)
#pragma unroll
                for (int half_row = 0; half_row < 2; ++half_row) {
                    float(&even)[4] = O.r[m][2 * j];
                    float(&odd_tile)[4] = O.r[m][2 * j + 1];
                    const int r = 2 * half_row;
                    float result[4];
#pragma unroll
                    for (int side = 0; side < 2; ++side) {
                        const int source = side ? high_source : low_source;
                        const float d0 = __shfl_sync(0xffffffffu, even[r], source);
                        const float d1 = __shfl_sync(0xffffffffu, odd_tile[r], source);
                        const float d2 = __shfl_sync(0xffffffffu, even[r + 1], source);
                        const float d3 = __shfl_sync(0xffffffffu, odd_tile[r + 1], source);
                        result[2 * side] = odd ? d2 : d0;
                        result[2 * side + 1] = odd ? d3 : d1;
                    }
                    even[r] = result[0], even[r + 1] = result[1];
                    odd_tile[r] = result[2], odd_tile[r + 1] = result[3];
                }
    }
};

} // namespace flash::sm80
