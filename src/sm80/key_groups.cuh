// The end of a block whose warps split each KV tile's keys (traits: key_groups > 1, a block of
// fewer than 16 query rows per warp): every warp holds a softmax and an output of its 16 rows over
// its share of the keys, and key group 0's warps take the others' in.
#pragma once

#include "common/common.h"

namespace flash::sm80 {

// Shared memory the merge writes, per lane (consecutive lanes on consecutive words, so every access
// is conflict-free): every warp's reference maxima of its rows, then the row sums and outputs of
// each warp outside key group 0.
template <typename Kernel>
struct KeyGroupExchange {
    static constexpr int max_words = Kernel::M_tiles * 2;
    static constexpr int partial_words = Kernel::M_tiles * 2 + Kernel::M_tiles * Kernel::O_tiles * 4;
    static constexpr int bytes = (Kernel::n_warps * max_words + (Kernel::n_warps - Kernel::row_warps) * partial_words) *
                                 WARP_SIZE * static_cast<int>(sizeof(float));
};

// After the last KV tile, with every warp of the block: moves each warp's softmax to the largest
// reference maxima of its rows over the key groups, then adds the row sums and outputs of groups 1
// onwards into group 0's warps, group by group in order, so the result does not depend on timing.
// exchange: the block's shared memory (smem_bytes of it), which no warp reads after its last tile.
template <typename Kernel, int smem_bytes, typename Softmax>
__device__ __forceinline__ void merge_key_groups(Softmax &softmax, typename Kernel::O_accumulators &O_acc,
                                                 float *exchange, float score_scale) {
    using Exchange = KeyGroupExchange<Kernel>;
    static_assert(Exchange::bytes <= smem_bytes, "the exchange overlays the block's Q, K and V tiles");
    constexpr int M_tiles = Kernel::M_tiles;
    const int warp = threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    const int row_group = warp % Kernel::row_warps;
    float *const maxima = exchange;
    float *const partials = exchange + Kernel::n_warps * Exchange::max_words * WARP_SIZE;
    const auto max_slot = [&](int of_warp, int m, int h) -> float & {
        return maxima[((of_warp * M_tiles + m) * 2 + h) * WARP_SIZE + lane];
    };
    const auto partial_slot = [&](int of_warp, int word) -> float & {
        return partials[((of_warp - Kernel::row_warps) * Exchange::partial_words + word) * WARP_SIZE + lane];
    };

    __syncthreads(); // every warp is done with the tiles the exchange overlays
#pragma unroll
    for (int m = 0; m < M_tiles; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            max_slot(warp, m, h) = softmax.row_max[m][h];
    __syncthreads();
    float reference[M_tiles][2];
#pragma unroll
    for (int m = 0; m < M_tiles; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            reference[m][h] = max_slot(row_group, m, h);
#pragma unroll
            for (int g = 1; g < Kernel::key_groups; ++g)
                reference[m][h] = fmaxf(reference[m][h], max_slot(row_group + g * Kernel::row_warps, m, h));
        }
    softmax.rebase(reference, O_acc, score_scale);

    // The row sums, then the outputs, as words of one warp's partial.
    const auto for_each_word = [&](auto &&visit) {
#pragma unroll
        for (int m = 0; m < M_tiles; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                visit(m * 2 + h, softmax.row_sum[m][h]);
        O_acc.for_each([&](int index, float &value) { visit(M_tiles * 2 + index, value); });
    };
    const bool leads = warp < Kernel::row_warps;
    if (!leads)
        for_each_word([&](int word, float value) { partial_slot(warp, word) = value; });
    __syncthreads();
    if (leads)
#pragma unroll
        for (int g = 1; g < Kernel::key_groups; ++g)
            for_each_word([&](int word, float &value) { value += partial_slot(row_group + g * Kernel::row_warps, word); });
}

} // namespace flash::sm80
