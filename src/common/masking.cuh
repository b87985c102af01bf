// What a problem variant adds to the kernel: which key/value tiles a query block visits and which
// of them need masking (KVTileRange), the element masks of those tiles, and the score
// modifications (softcap, ALiBi). Interior tiles of a masked problem run the unmasked code.
#pragma once

#include <climits>
#include <cmath>
#include <type_traits>

#include "common/common.h"
#include "common/forward_params.h"
#include "common/problem_variant.h"
#include "common/ptx.cuh"
#include "common/fragments.cuh"

namespace flash {

// floor(a / b) for b > 0 and any a.
__device__ __forceinline__ int floor_div(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// The key on row `row`'s diagonal: its query's i + seqlen_k - (number of queries). A row is its own
// query unless the call packs several rows per query (ForwardParams::rows_per_query).
__device__ __forceinline__ int diagonal_key(const ForwardParams &params, int row) {
    if (params.rows_per_query == 1)
        return row + params.seqlen_k - params.seqlen_q;
    return row / params.rows_per_query + params.seqlen_k - params.seqlen_q / params.rows_per_query;
}

// The key/value tiles one query block visits, [begin, end), in three runs: a masked prefix
// [begin, unmasked_begin) where the window's left edge cuts tiles, unmasked tiles
// [unmasked_begin, unmasked_end), and a masked suffix [unmasked_end, end) where the diagonal (plus
// the window's right edge) or the end of the keys cuts tiles. Rows of the block are
// first_row .. first_row + B_r - 1, and their diagonals (diagonal_key) grow with the row. With
// VARLEN, a sequence may have no key at all.
template <int B_r, int B_c, MaskKind MASK, bool MASKED_TAILS, bool VARLEN = false>
struct KVTileRange {
    static constexpr bool has_masked_prefix = MASK == MaskKind::LOCAL;
    static constexpr bool has_masked_suffix = MASK != MaskKind::NONE || MASKED_TAILS;

    int begin;
    int unmasked_begin;
    int unmasked_end;
    int end;

    __device__ __forceinline__ KVTileRange(const ForwardParams &params, int first_row) {
        const int n_tiles = MASKED_TAILS ? (params.seqlen_k + B_c - 1) / B_c
                                         : static_cast<int>(static_cast<unsigned>(params.seqlen_k) / B_c);
        const int first_diagonal = diagonal_key(params, first_row);
        const int last_diagonal = diagonal_key(params, first_row + B_r - 1);
        begin = 0;
        end = n_tiles;
        unmasked_begin = 0;
        unmasked_end = n_tiles;
        if constexpr (MASKED_TAILS)
            unmasked_end = params.seqlen_k / B_c; // the partial last tile is masked
        if constexpr (MASK != MaskKind::NONE) {
            // The last row reaches key last_diagonal + right; tiles past the first row's reach
            // (first_diagonal + right) are cut.
            end = min(end, max(0, floor_div(last_diagonal + params.mask.window_right, B_c) + 1));
            unmasked_end = min(unmasked_end, max(0, floor_div(first_diagonal + params.mask.window_right + 1, B_c)));
        }
        if constexpr (MASK == MaskKind::LOCAL) {
            // The first row reaches back to key first_diagonal - left; tiles before the last row's
            // reach (last_diagonal - left) are cut.
            begin = max(0, floor_div(first_diagonal - params.mask.window_left, B_c));
            unmasked_begin = max(begin, floor_div(last_diagonal - params.mask.window_left + B_c - 1, B_c));
        }
        unmasked_begin = min(unmasked_begin, end);
        unmasked_end = max(unmasked_begin, min(unmasked_end, end));
    }

    // Keeps split `split` of num_splits contiguous runs of the tiles, of equal length but the last's
    // (some splits are empty where there are fewer tiles than splits).
    __device__ __forceinline__ void keep_split(int split, int num_splits) {
        const int per_split = (end - begin + num_splits - 1) / num_splits;
        begin = min(end, begin + split * per_split);
        end = min(end, begin + per_split);
        unmasked_begin = min(max(unmasked_begin, begin), end);
        unmasked_end = min(max(unmasked_end, unmasked_begin), end);
    }

    // Without a mask every block of a dense problem visits at least one tile (seqlen_k >= 1): saying
    // so at compile time lets the compiler fold the outputs' zeroing into the first tile's products.
    static constexpr bool may_be_empty = MASK != MaskKind::NONE || VARLEN;
    __device__ __forceinline__ bool empty() const { return may_be_empty && begin >= end; }
    __device__ __forceinline__ bool is_masked(int tile) const {
        return (has_masked_prefix && tile < unmasked_begin) || (has_masked_suffix && tile >= unmasked_end);
    }
};

// The keys each of a lane's accumulator rows may attend in one tile, as a column interval
// [lo, hi] in the tile's own column numbers, for M_tiles x 2 rows (index h: lane/4 and lane/4 + 8).
// Columns outside it are set to -infinity before the softmax. Only columns in [first_col, end_col)
// are compared: a caller that knows the others are already decided (attended, or -infinity) says so.
template <MaskKind MASK, bool MASKED_TAILS, int first_col = 0, int end_col = INT_MAX, int M_tiles, int N_tiles>
__device__ __forceinline__ void apply_mask(Accumulators<M_tiles, N_tiles> &s, const ForwardParams &params,
                                           int first_row, int first_key) {
    static_assert(first_col % MMA_N == 0, "the compared columns start at an accumulator column block");
    const int lane = threadIdx.x % WARP_SIZE;
    const int lane_col = 2 * (lane % QUAD_SIZE);
    const int lane_row = first_row + lane / QUAD_SIZE;
#pragma unroll
    for (int m = 0; m < M_tiles; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            // The row's diagonal, in the tile's column numbers.
            const int row_diagonal = diagonal_key(params, lane_row + m * MMA_M + h * 8) - first_key;
            int hi = MASKED_TAILS ? params.seqlen_k - first_key - 1 : N_tiles * MMA_N;
            int lo = 0;
            if constexpr (MASK != MaskKind::NONE)
                hi = min(hi, row_diagonal + params.mask.window_right);
            if constexpr (MASK == MaskKind::LOCAL)
                lo = row_diagonal - params.mask.window_left;
#pragma unroll
            for (int n = first_col / MMA_N; n < N_tiles && n * MMA_N < end_col; ++n)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int col = n * MMA_N + lane_col + e;
                    if (col > hi || col < lo)
                        s.r[m][n][2 * h + e] = -INFINITY;
                }
        }
}

// Softcap and ALiBi on one tile's raw scores S = Q K^T, in units the softmax then multiplies by
// score_scale(): with softcap, tanh(scale * s / softcap) (times softcap); the ALiBi bias is divided
// by that multiplier so it lands on the scaled score.
struct ScoreMods {
    float pre_scale;   // multiplies s before the tanh (scale / softcap), with softcap
    float post_scale;  // what the softmax multiplies the modified scores by
    float alibi_slope; // -slope / post_scale per unit of distance from the diagonal; 0 without ALiBi
    bool softcap;

    // softmax_scale: the call's, or times the FP8 inputs' dequantisation factors of q and k.
    __device__ __forceinline__ ScoreMods(const ForwardParams &params, int batch, int head)
        : ScoreMods(params, batch, head, params.softmax_scale) {}
    __device__ __forceinline__ ScoreMods(const ForwardParams &params, int batch, int head, float softmax_scale) {
        softcap = params.mask.softcap > 0.0f;
        pre_scale = softcap ? softmax_scale / params.mask.softcap : 1.0f;
        post_scale = softcap ? params.mask.softcap : softmax_scale;
        alibi_slope = params.mask.alibi_slopes == nullptr
                          ? 0.0f
                          : -params.mask.alibi_slopes[batch * params.mask.alibi_batch_stride + head] / post_scale;
    }

    // Over the tile's columns before end_col: a narrower product leaves the others at -infinity,
    // which the tanh would make finite.
    template <int end_col = INT_MAX, int M_tiles, int N_tiles>
    __device__ __forceinline__ void apply(Accumulators<M_tiles, N_tiles> &s, const ForwardParams &params,
                                          int first_row, int first_key) const {
        if (softcap)
#pragma unroll
            for (int m = 0; m < M_tiles; ++m)
#pragma unroll
                for (int n = 0; n < N_tiles && n * MMA_N < end_col; ++n)
#pragma unroll
                    for (int i = 0; i < 4; ++i)
                        s.r[m][n][i] = ptx::tanh(s.r[m][n][i] * pre_scale);
        if (alibi_slope != 0.0f) {
            const int lane = threadIdx.x % WARP_SIZE;
            const int lane_row = first_row + lane / QUAD_SIZE;
#pragma unroll
            for (int m = 0; m < M_tiles; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row_diagonal = diagonal_key(params, lane_row + m * MMA_M + h * 8) - first_key;
#pragma unroll
                    for (int n = 0; n < N_tiles && n * MMA_N < end_col; ++n)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int col = n * MMA_N + 2 * (lane % QUAD_SIZE) + e;
                            const int distance = abs(row_diagonal - col);
                            s.r[m][n][2 * h + e] += alibi_slope * static_cast<float>(distance);
                        }
                }
        }
    }
};

// A kernel without score modifications holds none of their state: the softmax multiplies the raw
// scores by the softmax scale.
struct NoScoreMods {
    float post_scale;

    __device__ __forceinline__ NoScoreMods(const ForwardParams &params, int, int) : post_scale(params.softmax_scale) {}
    __device__ __forceinline__ NoScoreMods(const ForwardParams &, int, int, float softmax_scale) : post_scale(softmax_scale) {}
};

template <bool score_mods>
using ScoreModsOf = std::conditional_t<score_mods, ScoreMods, NoScoreMods>;

} // namespace flash
