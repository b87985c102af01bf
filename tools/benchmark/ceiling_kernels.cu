// The GPU's own ceilings, for ceiling_bench.py (compiled there at run time, sm_90a): the tensor pipe
// with nothing else to do (the Hopper family's wgmma wrappers, operands in shared memory, no global
// memory and no other instructions in the loop) and HBM read bandwidth (a stream of 16-byte loads).
// No attention kernel can beat the first: it issues the same matrix products and more besides.
#include <cstdint>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "sm90/wgmma.cuh"

namespace {

using namespace flash::sm90;

// Each operand row is one 128-byte swizzle row: four wgmma k-steps deep whatever the dtype.
using RowSwizzle = Swizzle<128>;
constexpr int ROW_BYTES = RowSwizzle::bytes;
constexpr int K_STEPS_PER_ROW = ROW_BYTES / WGMMA_K_BYTES;
constexpr int A_BYTES = WGMMA_M * ROW_BYTES;
// Products per commit and wait: two passes over the rows, so a wait drains the pipe rarely.
constexpr int PRODUCTS_PER_GROUP = 2 * K_STEPS_PER_ROW;
// Three warpgroups per multiprocessor: while one waits for its group, two keep the pipe fed.
constexpr int WARPGROUPS = 3;

template <int N>
constexpr int operand_bytes() {
    return A_BYTES + N * ROW_BYTES;
}

// Every warpgroup multiplies the same 64 x 128-byte A by the same N x 128-byte B, accumulating in
// its registers, `iterations` times PRODUCTS_PER_GROUP products; the operands are what the caller
// copied in (random values: the tensor pipe's power depends on the bits it multiplies).
template <typename value_t, int N>
__global__ void __launch_bounds__(WARPGROUPS *WARPGROUP_THREADS, 1)
    tensor_pipe_loop(const uint4 *__restrict__ operands, int iterations, float *__restrict__ sink) {
    extern __shared__ uint8_t dynamic_smem[];
    const uint32_t unaligned = static_cast<uint32_t>(__cvta_generic_to_shared(dynamic_smem));
    const uint32_t base = (unaligned + TILE_ALIGNMENT_BYTES - 1) & ~uint32_t(TILE_ALIGNMENT_BYTES - 1);
    uint4 *tiles = reinterpret_cast<uint4 *>(dynamic_smem + (base - unaligned));
    for (int i = threadIdx.x; i < operand_bytes<N>() / 16; i += blockDim.x)
        tiles[i] = operands[i];
    __syncthreads();

    float acc[N / 2] = {};
    for (int iteration = 0; iteration < iterations; ++iteration) {
        wgmma_fence();
#pragma unroll
        for (int product = 0; product < PRODUCTS_PER_GROUP; ++product) {
            const uint32_t k_offset = product % K_STEPS_PER_ROW * WGMMA_K_BYTES;
            Wgmma<N>::template ss<value_t>(acc, k_major_descriptor<RowSwizzle>(base + k_offset),
                                           k_major_descriptor<RowSwizzle>(base + A_BYTES + k_offset), 1);
        }
        wgmma_commit();
        wgmma_wait<0>();
    }
    float total = 0.f;
    for (float value : acc)
        total += value;
    if (total == 1.2345f) // never in practice; keeps the products from being thrown away
        sink[threadIdx.x] = total;
}

template <typename value_t, int N>
void launch_tensor_pipe_loop(const torch::Tensor &operands, int64_t iterations, torch::Tensor &sink) {
    const int smem_bytes = operand_bytes<N>() + TILE_ALIGNMENT_BYTES;
    auto kernel = tensor_pipe_loop<value_t, N>;
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    kernel<<<sms, WARPGROUPS * WARPGROUP_THREADS, smem_bytes, at::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const uint4 *>(operands.data_ptr()), static_cast<int>(iterations), sink.data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename value_t>
void launch_for_n(int64_t n, const torch::Tensor &operands, int64_t iterations, torch::Tensor &sink) {
    switch (n) {
    case 64: return launch_tensor_pipe_loop<value_t, 64>(operands, iterations, sink);
    case 128: return launch_tensor_pipe_loop<value_t, 128>(operands, iterations, sink);
    case 176: return launch_tensor_pipe_loop<value_t, 176>(operands, iterations, sink);
    case 256: return launch_tensor_pipe_loop<value_t, 256>(operands, iterations, sink);
    default: TORCH_CHECK(false, "n: the wgmma N must be 64, 128, 176 or 256, got ", n);
    }
}

// FLOP it does: the caller counts them from the same constants (products_per_iteration).
void tensor_pipe(const torch::Tensor &operands, int64_t n, int64_t iterations, torch::Tensor &sink) {
    TORCH_CHECK(operands.is_cuda() && operands.is_contiguous(), "operands: a contiguous CUDA tensor");
    TORCH_CHECK(operands.numel() * operands.element_size() >= A_BYTES + n * ROW_BYTES,
                "operands: needs the A and B rows, ", A_BYTES + n * ROW_BYTES, " bytes");
    TORCH_CHECK(sink.is_cuda() && sink.scalar_type() == torch::kFloat32 &&
                    sink.numel() >= WARPGROUPS * WARPGROUP_THREADS,
                "sink: a float32 CUDA tensor of a block's threads");
    TORCH_CHECK(iterations > 0 && iterations <= INT32_MAX, "iterations: a positive int32");
    const c10::cuda::CUDAGuard guard(operands.device());
    switch (operands.scalar_type()) {
    case torch::kBFloat16: return launch_for_n<__nv_bfloat16>(n, operands, iterations, sink);
    case torch::kHalf: return launch_for_n<half>(n, operands, iterations, sink);
    case torch::kFloat8_e4m3fn: return launch_for_n<__nv_fp8_e4m3>(n, operands, iterations, sink);
    default: TORCH_CHECK(false, "operands: bfloat16, float16 or float8_e4m3fn, got ", operands.scalar_type());
    }
}

// Loads in flight per thread: eight 16-byte loads issued before any is used.
constexpr int LOADS_PER_THREAD = 8;

__global__ void read_stream(const uint4 *__restrict__ data, int64_t count, uint32_t *__restrict__ sink) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    uint32_t folded = 0;
    for (; i + (LOADS_PER_THREAD - 1) * stride < count; i += LOADS_PER_THREAD * stride) {
        uint4 chunk[LOADS_PER_THREAD];
#pragma unroll
        for (int j = 0; j < LOADS_PER_THREAD; ++j)
            chunk[j] = __ldcs(data + i + j * stride);
#pragma unroll
        for (int j = 0; j < LOADS_PER_THREAD; ++j)
            folded ^= chunk[j].x ^ chunk[j].y ^ chunk[j].z ^ chunk[j].w;
    }
    for (; i < count; i += stride) {
        const uint4 chunk = __ldcs(data + i);
        folded ^= chunk.x ^ chunk.y ^ chunk.z ^ chunk.w;
    }
    if (folded == 0x9E3779B9u) // never in practice; keeps the loads
        sink[0] = folded;
}

// Reads every byte of `data` once (its size a multiple of 16 bytes).
void read_every_byte(const torch::Tensor &data, torch::Tensor &sink) {
    TORCH_CHECK(data.is_cuda() && data.is_contiguous(), "data: a contiguous CUDA tensor");
    const int64_t bytes = data.numel() * data.element_size();
    TORCH_CHECK(bytes % 16 == 0, "data: a multiple of 16 bytes, got ", bytes);
    TORCH_CHECK(sink.is_cuda() && sink.scalar_type() == torch::kInt32 && sink.numel() >= 1, "sink: an int32 CUDA tensor");
    const c10::cuda::CUDAGuard guard(data.device());
    constexpr int threads = 256;
    int blocks_per_sm = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, read_stream, threads, 0));
    const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
    read_stream<<<sms * blocks_per_sm, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        reinterpret_cast<const uint4 *>(data.data_ptr()), bytes / 16, reinterpret_cast<uint32_t *>(sink.data_ptr<int32_t>()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, extension) {
    extension.def("tensor_pipe", &tensor_pipe, "wgmma loop over shared-memory operands (operands, n, iterations, sink)");
    extension.def("read_every_byte", &read_every_byte, "reads every byte of data once (data, sink)");
    extension.attr("warpgroups_per_sm") = WARPGROUPS;
    extension.attr("products_per_iteration") = PRODUCTS_PER_GROUP;
    extension.attr("wgmma_m") = WGMMA_M;
    extension.attr("wgmma_k_bytes") = WGMMA_K_BYTES;
    extension.attr("operand_row_bytes") = ROW_BYTES;
}
