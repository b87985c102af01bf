// The combine kernel of a split over the keys (combine_forward_kernel: its name ends as the forward
// kernels' do, which tools/sanitize.sh selects by): one block per (row, head, sequence), as the forward
// kernel's grid lays them out. A decode step has few rows and many splits, so the work of a row is
// spread over the block: every thread loads one split's log-sum-exp, and each thread then sums four
// columns over its share of the splits. The loads of a thread's first PREFETCHED_SPLITS partial
// outputs are issued with the log-sum-exps', before the weights are known, so that a decode step's
// combine waits for memory once. It is launched as a dependent grid of the forward kernel where the
// GPU allows (programmatic stream serialization): its blocks take their places while the last
// forward blocks run, and wait for their writes before the first load.
#include <cmath>

#include "common/common.h"
#include "common/cuda_utils.cuh"
#include "common/ptx.cuh"
#include "common/sequence.cuh"
#include "common/type_utils.cuh"
#include "split_kv/combine.h"

namespace flash {
namespace {

constexpr int COMBINE_THREADS = 128;
constexpr int COMBINE_WARPS = COMBINE_THREADS / WARP_SIZE;
static_assert(MAX_SPLITS <= COMBINE_THREADS, "a thread loads each split's log-sum-exp");
// Columns a thread sums: one float4 of the partial outputs (a row of up to 512 columns fits the
// block, twice the largest head size compiled).
constexpr int COLUMNS_PER_THREAD = 4;
// Partial outputs a thread loads before the weights are known: 8 covers 32 splits at d_head 128
// (4 threads per column group), 64 at d_head 64; the rest are loaded after.
constexpr int PREFETCHED_SPLITS = 8;

template <typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2)
        v = op(v, __shfl_xor_sync(FULL_WARP_MASK, v, offset));
    return v;
}

// op over the block's values, in a fixed order (each warp's tree, then the warps in order), so the
// result does not depend on the schedule. `scratch` holds a value per warp.
template <typename Op>
__device__ __forceinline__ float block_reduce(float v, Op op, float *scratch) {
    v = warp_reduce(v, op);
    if (threadIdx.x % WARP_SIZE == 0)
        scratch[threadIdx.x / WARP_SIZE] = v;
    __syncthreads();
    float result = scratch[0];
#pragma unroll
    for (int w = 1; w < COMBINE_WARPS; ++w)
        result = op(result, scratch[w]);
    __syncthreads(); // scratch is free again
    return result;
}

template <typename value_t>
__global__ void __launch_bounds__(COMBINE_THREADS) combine_forward_kernel(const __grid_constant__ ForwardParams call) {
    const int row = blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const Sequence<true> sequence(call, batch);
    const ForwardParams &params = sequence.params;
    // Rows past a sequence's end: no split wrote them, and o keeps what it holds, as an unsplit
    // call leaves it.
    if (row >= params.seqlen_q)
        return;
    const SplitKV &split = params.split;
    const int t = threadIdx.x;

    __shared__ float scratch[COMBINE_WARPS];
    __shared__ float weights[MAX_SPLITS];
    __shared__ float4 sums[COMBINE_THREADS];

    // Thread t sums columns COLUMNS_PER_THREAD * (t % column_groups) .. + 3 over splits t /
    // column_groups, + split_groups, ...; then the split groups are summed in order.
    const int column_groups = params.d_head / COLUMNS_PER_THREAD;
    const int split_groups = COMBINE_THREADS / column_groups;
    const int column = COLUMNS_PER_THREAD * (t % column_groups);
    const int split_group = t / column_groups;
    const int64_t element = batch * params.o_strides.batch + head * params.o_strides.head +
                            row_offset(row, params.o_strides.seq, params.o_query_stride, params) + column;
    const float *o_partial = split.o_partial + element;
    const auto has_split = [&](int s) { return split_group < split_groups && s < split.num_splits; };
    const auto partial = [&](int s) { return *reinterpret_cast<const float4 *>(o_partial + s * split.o_split_stride); };
    ptx::wait_for_prerequisite_grids(); // the splits' partial results
    float4 prefetched[PREFETCHED_SPLITS];
#pragma unroll
    for (int k = 0; k < PREFETCHED_SPLITS; ++k) {
        const int s = split_group + k * split_groups;
        if (has_split(s))
            prefetched[k] = partial(s);
    }

    // The merged log-sum-exp: log of the sum over splits of exp(lse_s); a split without a key
    // (+infinity, or -infinity) counts as exp(lse_s) = 0.
    const int64_t lse_offset = batch * params.lse_batch_stride + head * params.lse_head_stride + row;
    float lse = -INFINITY;
    if (t < split.num_splits) {
        lse = split.lse_partial[lse_offset + t * split.lse_split_stride];
        if (!isfinite(lse))
            lse = -INFINITY;
    }
    const float max_lse = block_reduce(lse, [](float a, float b) { return fmaxf(a, b); }, scratch);
    const bool attends = max_lse != -INFINITY;
    const float sum = block_reduce(attends ? expf(lse - max_lse) : 0.0f, [](float a, float b) { return a + b; }, scratch);
    const float merged_lse = attends ? max_lse + logf(sum) : INFINITY;
    if (t < split.num_splits)
        weights[t] = attends ? expf(lse - merged_lse) : 0.0f;
    __syncthreads();

    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    // A split without a key has weight 0, and its partial output is not added to the sum.
    const auto add = [&](int s, const float4 &part) {
        const float weight = weights[s];
        if (weight != 0.0f) {
            acc.x += weight * part.x;
            acc.y += weight * part.y;
            acc.z += weight * part.z;
            acc.w += weight * part.w;
        }
    };
#pragma unroll
    for (int k = 0; k < PREFETCHED_SPLITS; ++k) {
        const int s = split_group + k * split_groups;
        if (has_split(s))
            add(s, prefetched[k]);
    }
#pragma unroll 4
    for (int s = split_group + PREFETCHED_SPLITS * split_groups; has_split(s); s += split_groups)
        add(s, partial(s));
    sums[t] = acc;
    __syncthreads();
    if (split_group == 0) {
        for (int g = 1; g < split_groups; ++g) {
            const float4 part = sums[t + g * column_groups];
            acc.x += part.x;
            acc.y += part.y;
            acc.z += part.z;
            acc.w += part.w;
        }
        uint2 packed{pack_pair<value_t>(acc.x, acc.y), pack_pair<value_t>(acc.z, acc.w)};
        *reinterpret_cast<uint2 *>(static_cast<value_t *>(params.o) + element) = packed;
    }
    if (params.lse != nullptr && t == 0)
        params.lse[lse_offset] = merged_lse;
}

} // namespace

void combine_splits(DType dtype, const ForwardParams &params, cudaStream_t stream) {
    cudaLaunchAttribute dependent = dependent_launch_attribute();
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(params.seqlen_q, params.heads_q, params.batch);
    config.blockDim = dim3(COMBINE_THREADS);
    config.stream = stream;
    config.attrs = &dependent;
    config.numAttrs = overlaps_dependent_launches() ? 1 : 0;
    const auto kernel = dtype == DType::FP16 ? combine_forward_kernel<element_t<DType::FP16>>
                                             : combine_forward_kernel<element_t<DType::BF16>>;
    check_cuda(cudaLaunchKernelEx(&config, kernel, params), "split-KV combine launch");
}

} // namespace flash
