// The combine kernel of a split over the keys (combine_forward_kernel: its name ends as the forward
// kernels' do, which tools/sanitize.sh selects by): a warp per (row, head, sequence), COMBINE_WARPS heads
// of a row per block. The merge of a row is a chain of latencies after the forward kernel's last block
// (a decode step has few rows and many splits), so a warp keeps it in registers and shuffles, without
// shared memory or a block barrier: each lane loads the log-sum-exps of splits lane, lane + 32, ...,
// and every lane reduces them to the same weights; each lane then sums four columns (eight at d_head
// above 128) over the splits in order. Its first PREFETCHED_LOADS partial outputs are loaded with the
// log-sum-exps, before the weights are known, so that a decode step's combine waits for memory once.
// It is launched as a dependent grid of the forward kernel where the GPU allows (programmatic stream
// serialization): its blocks take their places while the last forward blocks run, and wait for their
// writes before the first load.
#include <cmath>
#include <stdexcept>
#include <string>

#include "common/common.h"
#include "common/cuda_utils.cuh"
#include "common/ptx.cuh"
#include "common/sequence.cuh"
#include "common/type_utils.cuh"
#include "split_kv/combine.h"

namespace flash {
namespace {

constexpr int COMBINE_WARPS = 4;
// Columns a lane loads at once: a float4 of a partial output.
constexpr int COLUMNS_PER_LOAD = 4;
// The most columns a row has (the largest head size compiled): a lane sums up to two float4s of them.
constexpr int MAX_COMBINED_COLUMNS = 2 * WARP_SIZE * COLUMNS_PER_LOAD;
// Each lane holds the log-sum-exps of MAX_SPLITS / WARP_SIZE splits.
constexpr int LSE_PER_LANE = MAX_SPLITS / WARP_SIZE;
static_assert(MAX_SPLITS % WARP_SIZE == 0, "a lane loads whole log-sum-exp slots");
// float4s of partial outputs a lane loads before the weights are known: 32 splits at d_head 128 and
// below (the heuristic's most for one query: 8 query blocks of a sequence and 32 splits fill the
// H200), 16 above; the rest are loaded after.
constexpr int PREFETCHED_LOADS = WARP_SIZE;

template <typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2)
        v = op(v, __shfl_xor_sync(FULL_WARP_MASK, v, offset));
    return v;
}

// A lane's float4 of row columns: acc += weight * part.
__device__ __forceinline__ void add_weighted(float4 &acc, float weight, const float4 &part) {
    acc.x += weight * part.x;
    acc.y += weight * part.y;
    acc.z += weight * part.z;
    acc.w += weight * part.w;
}

// CHUNKS: the float4s of columns a lane sums (1 up to d_head 128, 2 up to 256).
template <typename value_t, int CHUNKS>
__global__ void __launch_bounds__(COMBINE_WARPS *WARP_SIZE) combine_forward_kernel(const __grid_constant__ ForwardParams call) {
    const int row = blockIdx.x;
    const int head = blockIdx.y * COMBINE_WARPS + threadIdx.x / WARP_SIZE;
    const int batch = blockIdx.z;
    const int lane = threadIdx.x % WARP_SIZE;
    const Sequence<true> sequence(call, batch);
    const ForwardParams &params = sequence.params;
    // Rows past a sequence's end: no split wrote them, and o keeps what it holds, as an unsplit
    // call leaves it.
    if (row >= params.seqlen_q || head >= params.heads_q)
        return;
    const SplitKV &split = params.split;
    const int num_splits = split.num_splits;

    const int64_t row_element = batch * params.o_strides.batch + head * params.o_strides.head +
                                row_offset(row, params.o_strides.seq, params.o_query_stride, params);
    const float *o_partial = split.o_partial + row_element;
    const auto column = [&](int chunk) { return COLUMNS_PER_LOAD * (lane + WARP_SIZE * chunk); };
    const auto has_column = [&](int chunk) { return column(chunk) < params.d_head; };
    const auto partial = [&](int s, int chunk) {
        return *reinterpret_cast<const float4 *>(o_partial + s * split.o_split_stride + column(chunk));
    };
    const int64_t lse_offset = batch * params.lse_batch_stride + head * params.lse_head_stride + row;

    ptx::wait_for_prerequisite_grids(); // the splits' partial results
    // A split without a key (+infinity, or -infinity) counts as exp(lse_s) = 0.
    float lse[LSE_PER_LANE];
#pragma unroll
    for (int slot = 0; slot < LSE_PER_LANE; ++slot) {
        const int s = lane + slot * WARP_SIZE;
        lse[slot] = s < num_splits ? split.lse_partial[lse_offset + s * split.lse_split_stride] : -INFINITY;
        if (!isfinite(lse[slot]))
            lse[slot] = -INFINITY;
    }
    constexpr int PREFETCHED_SPLITS = PREFETCHED_LOADS / CHUNKS;
    static_assert(PREFETCHED_SPLITS <= WARP_SIZE, "the prefetched splits' weights are in the first slot");
    float4 prefetched[PREFETCHED_SPLITS][CHUNKS];
#pragma unroll
    for (int s = 0; s < PREFETCHED_SPLITS; ++s)
#pragma unroll
        for (int chunk = 0; chunk < CHUNKS; ++chunk)
            if (s < num_splits && has_column(chunk))
                prefetched[s][chunk] = partial(s, chunk);

    // The merged log-sum-exp: log of the sum over splits of exp(lse_s). The butterfly leaves every
    // lane the same bits, whatever the schedule.
    float max_lse = lse[0];
#pragma unroll
    for (int slot = 1; slot < LSE_PER_LANE; ++slot)
        max_lse = fmaxf(max_lse, lse[slot]);
    max_lse = warp_reduce(max_lse, [](float a, float b) { return fmaxf(a, b); });
    const bool attends = max_lse != -INFINITY;
    float sum = 0.0f;
#pragma unroll
    for (int slot = 0; slot < LSE_PER_LANE; ++slot)
        sum += attends ? expf(lse[slot] - max_lse) : 0.0f;
    sum = warp_reduce(sum, [](float a, float b) { return a + b; });
    const float merged_lse = attends ? max_lse + logf(sum) : INFINITY;
    float weight[LSE_PER_LANE];
#pragma unroll
    for (int slot = 0; slot < LSE_PER_LANE; ++slot)
        weight[slot] = attends ? expf(lse[slot] - merged_lse) : 0.0f;

    // The splits in order; split s's weight is lane s % 32's slot s / 32. A split without a key has
    // weight 0, and its partial output is not added to the sum.
    float4 acc[CHUNKS];
#pragma unroll
    for (int chunk = 0; chunk < CHUNKS; ++chunk)
        acc[chunk] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int s = 0; s < PREFETCHED_SPLITS; ++s) {
        const float w = __shfl_sync(FULL_WARP_MASK, weight[0], s);
        if (s < num_splits && w != 0.0f)
#pragma unroll
            for (int chunk = 0; chunk < CHUNKS; ++chunk)
                if (has_column(chunk))
                    add_weighted(acc[chunk], w, prefetched[s][chunk]);
    }
#pragma unroll
    for (int slot = 0; slot < LSE_PER_LANE; ++slot) {
#pragma unroll 4
        for (int s = slot == 0 ? PREFETCHED_SPLITS : slot * WARP_SIZE; s < (slot + 1) * WARP_SIZE && s < num_splits; ++s) {
            const float w = __shfl_sync(FULL_WARP_MASK, weight[slot], s % WARP_SIZE);
            if (w != 0.0f)
#pragma unroll
                for (int chunk = 0; chunk < CHUNKS; ++chunk)
                    if (has_column(chunk))
                        add_weighted(acc[chunk], w, partial(s, chunk));
        }
    }
#pragma unroll
    for (int chunk = 0; chunk < CHUNKS; ++chunk)
        if (has_column(chunk)) {
            const uint2 packed{pack_pair<value_t>(acc[chunk].x, acc[chunk].y), pack_pair<value_t>(acc[chunk].z, acc[chunk].w)};
            *reinterpret_cast<uint2 *>(static_cast<value_t *>(params.o) + row_element + column(chunk)) = packed;
        }
    if (params.lse != nullptr && lane == 0)
        params.lse[lse_offset] = merged_lse;
}

template <int CHUNKS>
void launch_combine(DType dtype, const ForwardParams &params, cudaStream_t stream) {
    cudaLaunchAttribute dependent = dependent_launch_attribute();
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(params.seqlen_q, (params.heads_q + COMBINE_WARPS - 1) / COMBINE_WARPS, params.batch);
    config.blockDim = dim3(COMBINE_WARPS * WARP_SIZE);
    config.stream = stream;
    config.attrs = &dependent;
    config.numAttrs = overlaps_dependent_launches() ? 1 : 0;
    const auto kernel = dtype == DType::FP16 ? combine_forward_kernel<element_t<DType::FP16>, CHUNKS>
                                             : combine_forward_kernel<element_t<DType::BF16>, CHUNKS>;
    check_cuda(cudaLaunchKernelEx(&config, kernel, params), "split-KV combine launch");
}

} // namespace

void combine_splits(DType dtype, const ForwardParams &params, cudaStream_t stream) {
    // The splitting family's head sizes end at 256 (sm80/traits.cuh).
    if (params.d_head > MAX_COMBINED_COLUMNS)
        throw std::logic_error("split-KV combine: d_head " + std::to_string(params.d_head) + " above " +
                               std::to_string(MAX_COMBINED_COLUMNS));
    if (params.d_head <= WARP_SIZE * COLUMNS_PER_LOAD)
        launch_combine<1>(dtype, params, stream);
    else
        launch_combine<2>(dtype, params, stream);
}

} // namespace flash
