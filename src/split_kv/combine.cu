// The combine kernel of a split over the keys: one warp per (batch, row, head) of o.
#include <cmath>

#include "common/common.h"
#include "common/cuda_utils.cuh"
#include "common/type_utils.cuh"
#include "split_kv/combine.h"

namespace flash {
namespace {

constexpr int WARPS_PER_BLOCK = 4;
// Columns a lane owns: pairs 2 * lane + 64 * j, for head sizes up to 256.
constexpr int MAX_PAIRS_PER_LANE = 4;

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2)
        v += __shfl_xor_sync(0xffffffff, v, offset);
    return v;
}

template <typename value_t>
__global__ void __launch_bounds__(WARPS_PER_BLOCK * WARP_SIZE)
    combine_splits_kernel(const __grid_constant__ ForwardParams params, int batch_entries, int rows) {
    const int lane = threadIdx.x % WARP_SIZE;
    const int64_t index = static_cast<int64_t>(blockIdx.x) * WARPS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    const int head = static_cast<int>(index % params.heads_q);
    const int row = static_cast<int>(index / params.heads_q % rows);
    const int batch = static_cast<int>(index / params.heads_q / rows);
    if (batch >= batch_entries)
        return;
    const SplitKV &split = params.split;
    const float *lse_partial = split.lse_partial + batch * params.lse_batch_stride + head * params.lse_head_stride + row;
    const int64_t element = batch * params.o_strides.batch + row * params.o_strides.seq + head * params.o_strides.head;

    // The merged log-sum-exp: log of the sum over splits of exp(lse_s), splits without a key
    // (+infinity, or -infinity) left out.
    float max_lse = -INFINITY;
    for (int s = lane; s < split.num_splits; s += WARP_SIZE) {
        const float lse = lse_partial[s * split.lse_split_stride];
        if (isfinite(lse))
            max_lse = fmaxf(max_lse, lse);
    }
    max_lse = warp_max(max_lse);
    float sum = 0.0f;
    if (max_lse != -INFINITY)
        for (int s = lane; s < split.num_splits; s += WARP_SIZE) {
            const float lse = lse_partial[s * split.lse_split_stride];
            if (isfinite(lse))
                sum += expf(lse - max_lse);
        }
    sum = warp_sum(sum);
    const bool attends = max_lse != -INFINITY;
    const float merged_lse = attends ? max_lse + logf(sum) : INFINITY;

    float2 acc[MAX_PAIRS_PER_LANE];
#pragma unroll
    for (int j = 0; j < MAX_PAIRS_PER_LANE; ++j)
        acc[j] = make_float2(0.0f, 0.0f);
    if (attends)
        for (int s = 0; s < split.num_splits; ++s) {
            const float lse = lse_partial[s * split.lse_split_stride];
            if (!isfinite(lse))
                continue;
            const float weight = expf(lse - merged_lse);
            const float *o_partial = split.o_partial + s * split.o_split_stride + element;
#pragma unroll
            for (int j = 0; j < MAX_PAIRS_PER_LANE; ++j) {
                const int col = 2 * lane + 2 * WARP_SIZE * j;
                if (col < params.d_head) {
                    const float2 part = *reinterpret_cast<const float2 *>(o_partial + col);
                    acc[j].x += weight * part.x;
                    acc[j].y += weight * part.y;
                }
            }
        }
    value_t *o = static_cast<value_t *>(params.o) + element;
#pragma unroll
    for (int j = 0; j < MAX_PAIRS_PER_LANE; ++j) {
        const int col = 2 * lane + 2 * WARP_SIZE * j;
        if (col < params.d_head)
            *reinterpret_cast<uint32_t *>(o + col) = pack_pair<value_t>(acc[j].x, acc[j].y);
    }
    if (params.lse != nullptr && lane == 0)
        params.lse[batch * params.lse_batch_stride + head * params.lse_head_stride + row] = merged_lse;
}

} // namespace

void combine_splits(DType dtype, const ForwardParams &params, int batch_entries, int rows, cudaStream_t stream) {
    const int64_t warps = static_cast<int64_t>(batch_entries) * rows * params.heads_q;
    const unsigned blocks = static_cast<unsigned>((warps + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK);
    if (blocks == 0)
        return;
    if (dtype == DType::FP16)
        combine_splits_kernel<element_t<DType::FP16>><<<blocks, WARPS_PER_BLOCK * WARP_SIZE, 0, stream>>>(params, batch_entries, rows);
    else
        combine_splits_kernel<element_t<DType::BF16>><<<blocks, WARPS_PER_BLOCK * WARP_SIZE, 0, stream>>>(params, batch_entries, rows);
    check_cuda(cudaGetLastError(), "split-KV combine launch");
}

} // namespace flash
