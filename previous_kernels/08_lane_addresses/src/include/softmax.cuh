// Online softmax over the KV tiles (FlashAttention-2): running row maxima and row sums in
// float32, the output accumulators rescaled whenever a row's maximum grows, and the division by
// the row sum left to the very end.
#pragma once

#include <cmath>

#include "common.h"
#include "layout.cuh"
#include "ptx.cuh"

namespace flash {

// Row statistics of one warp's M_tiles x 16 query rows. Each lane holds two rows per 16-row tile
// (lane/4 and lane/4 + 8: index h), shared with the three other lanes of its quad.
//
// optimized = false, the textbook update: scale every score, take the row maximum, expf(s - max).
// optimized = true: the maxima stay in raw-score units and the scale is folded into the exponent,
// exp(scale * (s - max)) = 2^(s * c - max * c) with c = scale * log2(e): one FFMA and one MUFU.EX2
// per score; the first KV tile skips the rescaling, which cannot matter there.
template <int M_tiles, bool optimized>
struct OnlineSoftmax {
    float row_max[M_tiles][2]; // of the scores seen so far (scaled unless optimized); quad-uniform
    float row_sum[M_tiles][2]; // of the probabilities over this lane's columns only

    __device__ __forceinline__ void init() {
#pragma unroll
        for (int m = 0; m < M_tiles; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                row_max[m][h] = -INFINITY;
                row_sum[m][h] = 0.0f;
            }
    }

    // Turns the raw scores S = Q K^T of one KV tile into unnormalised probabilities
    // exp(scale * (S - max)) in place, and rescales the output accumulators o by
    // exp(scale * (old_max - new_max)) so they stay relative to the new maxima. first_tile marks
    // the first KV tile; only the optimized update uses it.
    template <bool first_tile, int N_tiles, int D_tiles>
    __device__ __forceinline__ void update(Accumulators<M_tiles, N_tiles> &s, Accumulators<M_tiles, D_tiles> &o,
                                           float scale) {
        static_assert(optimized || !first_tile, "only the optimized softmax specializes the first tile");
#pragma unroll
        for (int m = 0; m < M_tiles; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if constexpr (optimized)
                    update_row_folded<first_tile>(s.r[m], o.r[m], h, row_max[m][h], row_sum[m][h], scale);
                else
                    update_row_textbook(s.r[m], o.r[m], h, row_max[m][h], row_sum[m][h], scale);
            }
    }

    // Divides each output row by its full row sum (this lane's partial sums added over the quad).
    template <int D_tiles>
    __device__ __forceinline__ void normalize(Accumulators<M_tiles, D_tiles> &o) const {
#pragma unroll
        for (int m = 0; m < M_tiles; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float inv_sum = 1.0f / quad_sum(row_sum[m][h]);
#pragma unroll
                for (int d = 0; d < D_tiles; ++d) {
                    o.r[m][d][2 * h] *= inv_sum;
                    o.r[m][d][2 * h + 1] *= inv_sum;
                }
            }
    }

  private:
    // One lane's row h of one 16-row tile: s[n][2h], s[n][2h + 1] over the N_tiles column tiles.
    template <int N_tiles, int D_tiles>
    static __device__ __forceinline__ void update_row_textbook(float (&s)[N_tiles][4], float (&o)[D_tiles][4], int h,
                                                               float &row_max, float &row_sum, float scale) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int n = 0; n < N_tiles; ++n) {
            s[n][2 * h] *= scale;
            s[n][2 * h + 1] *= scale;
            tile_max = fmaxf(tile_max, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
        }
        const float new_max = fmaxf(row_max, quad_max(tile_max));
        const float rescale = expf(row_max - new_max); // 0 on the first tile: exp(-inf)
        row_max = new_max;

        float tile_sum = 0.0f;
#pragma unroll
        for (int n = 0; n < N_tiles; ++n)
#pragma unroll
            for (int i = 2 * h; i < 2 * h + 2; ++i) {
                s[n][i] = expf(s[n][i] - new_max);
                tile_sum += s[n][i];
            }
        row_sum = row_sum * rescale + tile_sum;
        rescale_row(o, h, rescale);
    }

    template <bool first_tile, int N_tiles, int D_tiles>
    static __device__ __forceinline__ void update_row_folded(float (&s)[N_tiles][4], float (&o)[D_tiles][4], int h,
                                                             float &row_max, float &row_sum, float scale) {
        const float scale_log2 = scale * LOG2_E;
        float tile_max = -INFINITY;
#pragma unroll
        for (int n = 0; n < N_tiles; ++n)
            tile_max = fmaxf(tile_max, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
        tile_max = quad_max(tile_max);

        float new_max = tile_max;
        if constexpr (!first_tile) {
            new_max = fmaxf(row_max, tile_max);
            const float rescale = ptx::exp2((row_max - new_max) * scale_log2);
            row_sum *= rescale;
            rescale_row(o, h, rescale);
        }
        row_max = new_max;

        const float exponent_offset = -new_max * scale_log2;
        float tile_sum = 0.0f;
#pragma unroll
        for (int n = 0; n < N_tiles; ++n)
#pragma unroll
            for (int i = 2 * h; i < 2 * h + 2; ++i) {
                s[n][i] = ptx::exp2(fmaf(s[n][i], scale_log2, exponent_offset));
                tile_sum += s[n][i];
            }
        row_sum += tile_sum;
    }

    template <int D_tiles>
    static __device__ __forceinline__ void rescale_row(float (&o)[D_tiles][4], int h, float rescale) {
#pragma unroll
        for (int d = 0; d < D_tiles; ++d) {
            o[d][2 * h] *= rescale;
            o[d][2 * h + 1] *= rescale;
        }
    }

    static __device__ __forceinline__ float quad_max(float x) {
#pragma unroll
        for (int offset = 1; offset < QUAD_SIZE; offset *= 2)
            x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
        return x;
    }

    static __device__ __forceinline__ float quad_sum(float x) {
#pragma unroll
        for (int offset = 1; offset < QUAD_SIZE; offset *= 2)
            x += __shfl_xor_sync(0xffffffffu, x, offset);
        return x;
    }
};

} // namespace flash
