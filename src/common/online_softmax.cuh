// Online softmax over the KV tiles (FlashAttention-2): running row maxima and row sums in
// float32, the output accumulators rescaled when a row's maximum grows, and the division by the
// row sum left to the very end.
#pragma once

#include <cmath>

#include "common/common.h"
#include "common/ptx.cuh"
#include "common/fragments.cuh"

namespace flash {

// Row statistics of one warp's M_tiles x 16 query rows. Each lane holds two rows per 16-row tile
// (lane/4 and lane/4 + 8: index h), shared with the three other lanes of its quad.
//
// optimized = false, the textbook update: scale every score, take the row maximum, expf(s - max).
// optimized = true: the maxima stay in raw-score units and the scale is folded into the exponent,
// exp(scale * (s - max)) = 2^(s * c - max * c) with c = scale * log2(e): one FFMA and one MUFU.EX2
// per score. The first KV tile only sets the maxima. After it, a warp keeps its rows' reference
// maxima while they are stale by at most MAX_STALE_LOG2 (the probabilities then stay at most
// 2^MAX_STALE_LOG2, far inside the 16-bit and float32 ranges, and the final division cancels the
// reference whatever it is), and moves them, rescaling its outputs, only on the tiles where some
// row's maximum grows by more than that: usually just the first few. On every other tile the
// outputs' rescaling multiplications and their place on the path to the P V product are gone.
// What it costs is accuracy where a few keys carry most of a row's weight: against a fresh maximum
// a tile's largest probability is exactly 1 and loses nothing to the 16-bit P, against a stale one
// it is rounded like the others. With steep ALiBi slopes and 32-key tiles (which rescale less
// often than wider ones) the output's error grows by about half on average.
//
// P_LOG2_BIAS (optimized only): every probability is 2^P_LOG2_BIAS times larger, which the final
// division cancels and the log-sum-exp takes back out. An 8-bit P (e4m3: 3 mantissa bits, normal
// down to 2^-6) keeps more of the small probabilities when a fresh maximum's is 2^8 rather than 1;
// the stale maxima then allow 8 - P_LOG2_BIAS, so that no probability exceeds 2^8 either way.
//
// rows_may_be_empty: under a mask, a row may have seen only masked (-infinity) scores so far, or
// may attend no key at all. Its maximum is then -infinity, which the exponents and the rescaling
// use as 0 (so the masked scores give 0, and a rescale the warp does for another row gives 0, not
// NaN), and an empty row's output is 0 and its log-sum-exp +infinity.
template <int M_tiles_, bool optimized, bool rows_may_be_empty, int P_LOG2_BIAS = 0>
struct OnlineSoftmax {
    static constexpr int M_tiles = M_tiles_;
    static_assert(optimized || P_LOG2_BIAS == 0, "only the optimized softmax biases the probabilities");
    static_assert(P_LOG2_BIAS >= 0 && P_LOG2_BIAS <= 8, "no probability may exceed 2^8");
    // How far, in log2 units of probability, a row's true maximum may exceed its reference maximum.
    static constexpr float MAX_STALE_LOG2 = 8.0f - P_LOG2_BIAS;

    float row_max[M_tiles][2]; // reference maxima of the scores (scaled unless optimized); quad-uniform
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
    // exp(scale * (S - max)) in place, max being the rows' reference maxima, and when those move
    // rescales the output accumulators o by exp(scale * (old_max - new_max)) so they stay relative
    // to them. first_tile marks the first KV tile; only the optimized update uses it.
    template <bool first_tile, int N_tiles, int D_tiles>
    __device__ __forceinline__ void update(Accumulators<M_tiles, N_tiles> &s, Accumulators<M_tiles, D_tiles> &o,
                                           float scale) {
        exponentiate<first_tile>(s, scale, [&](int m, int h, float rescale) { rescale_row(o.r[m], h, rescale); });
    }

    // update() without touching the outputs, for kernels whose output accumulators may still be
    // written by an asynchronous product while the probabilities are computed: moves the reference
    // maxima, exponentiates s in place and adjusts the row sums, and calls rescale(m, h, factor)
    // for each row whose outputs must be multiplied by factor. Returns whether it did (warp-uniform).
    template <bool first_tile, int N_tiles, typename Rescale>
    __device__ __forceinline__ bool exponentiate(Accumulators<M_tiles, N_tiles> &s, float scale, Rescale &&rescale) {
        static_assert(optimized || !first_tile, "only the optimized softmax specializes the first tile");
        bool rescaled = false;
        if constexpr (optimized) {
            const float scale_log2 = scale * LOG2_E;
            float tile_max[M_tiles][2];
#pragma unroll
            for (int m = 0; m < M_tiles; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    tile_max[m][h] = quad_max(lane_row_max(s.r[m], h));
            if constexpr (first_tile) {
#pragma unroll
                for (int m = 0; m < M_tiles; ++m)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        row_max[m][h] = tile_max[m][h];
            } else {
                bool too_stale = false;
#pragma unroll
                for (int m = 0; m < M_tiles; ++m)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        too_stale |= (tile_max[m][h] - row_max[m][h]) * scale_log2 > MAX_STALE_LOG2;
                // Warp-uniform, so the common path holds no rescaling code at all.
                rescaled = __any_sync(FULL_WARP_MASK, too_stale);
                if (rescaled)
#pragma unroll
                    for (int m = 0; m < M_tiles; ++m)
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
                            const float new_max = fmaxf(row_max[m][h], tile_max[m][h]);
                            const float factor = ptx::exp2((row_max[m][h] - exponent_max(new_max)) * scale_log2);
                            row_max[m][h] = new_max;
                            row_sum[m][h] *= factor;
                            rescale(m, h, factor);
                        }
            }
#pragma unroll
            for (int m = 0; m < M_tiles; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    row_sum[m][h] += exponentiate_row_folded(s.r[m], h, exponent_max(row_max[m][h]), scale_log2);
        } else {
            rescaled = true;
#pragma unroll
            for (int m = 0; m < M_tiles; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    rescale(m, h, update_row_textbook(s.r[m], h, row_max[m][h], row_sum[m][h], scale));
        }
        return rescaled;
    }

    // Moves the reference maxima to `reference` (row by row at least this softmax's own), rescaling
    // the row sums and o to match: partial softmaxes of the same rows over different keys, so
    // moved to the same maxima, add.
    template <int D_tiles>
    __device__ __forceinline__ void rebase(const float (&reference)[M_tiles][2], Accumulators<M_tiles, D_tiles> &o,
                                           float scale) {
#pragma unroll
        for (int m = 0; m < M_tiles; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float shift = row_max[m][h] - exponent_max(reference[m][h]);
                const float factor = optimized ? ptx::exp2(shift * scale * LOG2_E) : expf(shift);
                row_max[m][h] = reference[m][h];
                row_sum[m][h] *= factor;
                rescale_row(o.r[m], h, factor);
            }
    }

    // The natural log of each row's sum of exp(scale * score), for M_tiles x 2 rows; +infinity for
    // a row that attends no key. Call after the last update, with the scale given to it.
    __device__ __forceinline__ void log_sum_exp(float (&lse)[M_tiles][2], float scale) const {
#pragma unroll
        for (int m = 0; m < M_tiles; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float sum = quad_sum(row_sum[m][h]);
                // The textbook maxima are already scaled.
                const float max = exponent_max(row_max[m][h]) * (optimized ? scale : 1.0f);
                lse[m][h] = rows_may_be_empty && sum == 0.0f ? INFINITY : max + logf(sum) - P_LOG2_BIAS * LN_2;
            }
    }

    // Divides each output row by its full row sum (this lane's partial sums added over the quad).
    template <int D_tiles>
    __device__ __forceinline__ void normalize(Accumulators<M_tiles, D_tiles> &o) const {
#pragma unroll
        for (int m = 0; m < M_tiles; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float sum = quad_sum(row_sum[m][h]);
                const float inv_sum = rows_may_be_empty && sum == 0.0f ? 0.0f : 1.0f / sum;
#pragma unroll
                for (int d = 0; d < D_tiles; ++d) {
                    o.r[m][d][2 * h] *= inv_sum;
                    o.r[m][d][2 * h + 1] *= inv_sum;
                }
            }
    }

  private:
    // The maximum the exponents subtract: -infinity (a row with only masked scores so far) counts as 0.
    static __device__ __forceinline__ float exponent_max(float row_max) {
        return rows_may_be_empty && row_max == -INFINITY ? 0.0f : row_max;
    }

    // One lane's row h of one 16-row tile: s[n][2h], s[n][2h + 1] over the N_tiles column tiles.
    // Returns the factor the row's outputs must be multiplied by.
    template <int N_tiles>
    static __device__ __forceinline__ float update_row_textbook(float (&s)[N_tiles][4], int h, float &row_max,
                                                                float &row_sum, float scale) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int n = 0; n < N_tiles; ++n) {
            s[n][2 * h] *= scale;
            s[n][2 * h + 1] *= scale;
            tile_max = fmaxf(tile_max, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
        }
        const float new_max = fmaxf(row_max, quad_max(tile_max));
        const float rescale = expf(row_max - exponent_max(new_max)); // 0 on the first tile: exp(-inf)
        row_max = new_max;

        float tile_sum = 0.0f;
#pragma unroll
        for (int n = 0; n < N_tiles; ++n)
#pragma unroll
            for (int i = 2 * h; i < 2 * h + 2; ++i) {
                s[n][i] = expf(s[n][i] - exponent_max(new_max));
                tile_sum += s[n][i];
            }
        row_sum = row_sum * rescale + tile_sum;
        return rescale;
    }

    // The maximum of one lane's share of row h of one 16-row tile, as a tree of pairwise maxima: a
    // dependency chain log2(N_tiles) long rather than N_tiles long, ahead of every exponent.
    template <int N_tiles>
    static __device__ __forceinline__ float lane_row_max(const float (&s)[N_tiles][4], int h) {
        float partial[N_tiles];
#pragma unroll
        for (int n = 0; n < N_tiles; ++n)
            partial[n] = fmaxf(s[n][2 * h], s[n][2 * h + 1]);
#pragma unroll
        for (int width = 1; width < N_tiles; width *= 2)
#pragma unroll
            for (int n = 0; n + width < N_tiles; n += 2 * width)
                partial[n] = fmaxf(partial[n], partial[n + width]);
        return partial[0];
    }

    // Turns one lane's share of row h into 2^(s * c - reference_max * c + P_LOG2_BIAS) in place;
    // returns its sum.
    template <int N_tiles>
    static __device__ __forceinline__ float exponentiate_row_folded(float (&s)[N_tiles][4], int h, float reference_max,
                                                                    float scale_log2) {
        float exponent_offset = -reference_max * scale_log2;
        if constexpr (P_LOG2_BIAS != 0)
            exponent_offset += P_LOG2_BIAS;
        float lane_sum = 0.0f;
#pragma unroll
        for (int n = 0; n < N_tiles; ++n)
#pragma unroll
            for (int i = 2 * h; i < 2 * h + 2; ++i) {
                s[n][i] = ptx::exp2(fmaf(s[n][i], scale_log2, exponent_offset));
                lane_sum += s[n][i];
            }
        return lane_sum;
    }

  public:
    // Multiplies row h of one 16-row tile of outputs by rescale.
    template <int D_tiles>
    static __device__ __forceinline__ void rescale_row(float (&o)[D_tiles][4], int h, float rescale) {
#pragma unroll
        for (int d = 0; d < D_tiles; ++d) {
            o[d][2 * h] *= rescale;
            o[d][2 * h + 1] *= rescale;
        }
    }

  private:
    static __device__ __forceinline__ float quad_max(float x) {
#pragma unroll
        for (int offset = 1; offset < QUAD_SIZE; offset *= 2)
            x = fmaxf(x, __shfl_xor_sync(FULL_WARP_MASK, x, offset));
        return x;
    }

    static __device__ __forceinline__ float quad_sum(float x) {
#pragma unroll
        for (int offset = 1; offset < QUAD_SIZE; offset *= 2)
            x += __shfl_xor_sync(FULL_WARP_MASK, x, offset);
        return x;
    }
};

// Writes the log-sum-exp of a warp's rows first_row.. to lse (the block's first row's entry);
// rows at or past valid_rows do not exist. One lane of each quad writes its two rows per 16-row tile.
template <typename Softmax>
__device__ __forceinline__ void store_log_sum_exp(const Softmax &softmax, float scale, float *lse, int first_row,
                                                  int valid_rows) {
    constexpr int M_tiles = Softmax::M_tiles;
    float row_lse[M_tiles][2];
    softmax.log_sum_exp(row_lse, scale);
    const int lane = threadIdx.x % WARP_SIZE;
    if (lane % QUAD_SIZE != 0)
        return;
#pragma unroll
    for (int m = 0; m < M_tiles; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = first_row + m * MMA_M + h * 8 + lane / QUAD_SIZE;
            if (row < valid_rows)
                lse[row] = row_lse[m][h];
        }
}

} // namespace flash
