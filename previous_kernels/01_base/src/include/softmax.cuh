// Online softmax over the KV tiles (FlashAttention-2): running row maxima and row sums in
// float32, the output accumulators rescaled whenever a row's maximum grows, and the division by
// the row sum left to the very end.
#pragma once

#include <cmath>

#include "common.h"
#include "layout.cuh"

namespace flash {

// Row statistics of one warp's M_tiles x 16 query rows. Each lane holds two rows per 16-row tile
// (lane/4 and lane/4 + 8: index half_row), shared with the three other lanes of its quad.
template <int M_tiles>
struct OnlineSoftmax {
    float row_max[M_tiles][2]; // of the scaled scores seen so far; identical across the quad
    float row_sum[M_tiles][2]; // of exp(score - row_max) over this lane's columns only

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
    // exp(scale * S - row_max) in place, and rescales the output accumulators o by
    // exp(old_max - new_max) so they stay relative to the new maxima.
    template <int N_tiles, int D_tiles>
    __device__ __forceinline__ void update(Accumulators<M_tiles, N_tiles> &s, Accumulators<M_tiles, D_tiles> &o,
                                           float scale) {
#pragma unroll
        for (int m = 0; m < M_tiles; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float tile_max = -INFINITY;
#pragma unroll
                for (int n = 0; n < N_tiles; ++n) {
                    s.r[m][n][2 * h] *= scale;
                    s.r[m][n][2 * h + 1] *= scale;
                    tile_max = fmaxf(tile_max, fmaxf(s.r[m][n][2 * h], s.r[m][n][2 * h + 1]));
                }
                tile_max = quad_max(tile_max);

                const float new_max = fmaxf(row_max[m][h], tile_max);
                const float rescale = expf(row_max[m][h] - new_max); // 0 on the first tile: exp(-inf)
                row_max[m][h] = new_max;

                float tile_sum = 0.0f;
#pragma unroll
                for (int n = 0; n < N_tiles; ++n)
#pragma unroll
                    for (int i = 2 * h; i < 2 * h + 2; ++i) {
                        s.r[m][n][i] = expf(s.r[m][n][i] - new_max);
                        tile_sum += s.r[m][n][i];
                    }
                row_sum[m][h] = row_sum[m][h] * rescale + tile_sum;

#pragma unroll
                for (int d = 0; d < D_tiles; ++d) {
                    o.r[m][d][2 * h] *= rescale;
                    o.r[m][d][2 * h + 1] *= rescale;
                }
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
