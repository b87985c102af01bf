// The Hopper family's launcher: the call's tensor maps, then the traits' threads and dynamic shared
// memory per thread block, one block per work tile (B_r query rows of one (batch, head)), or, when
// persistent, one per SM at most.
#pragma once

#include <algorithm>
#include <cstdint>

#include <cuda_runtime.h>

#include "common/cuda_utils.cuh"
#include "sm90/forward_kernel.cuh"
#include "sm90/kernel_params.h"
#include "sm90/launcher.h"
#include "sm90/tensor_maps.h"
#include "sm90/traits.cuh"

namespace flash::sm90 {

template <typename Kernel, ProblemVariant VARIANT>
constexpr auto kernel_of = &hopper_forward_kernel<Kernel, VARIANT.mask, VARIANT.masked_tails, VARIANT.score_mods>;

template <typename Kernel, ProblemVariant VARIANT>
void launch(const ForwardParams &params, cudaStream_t stream) {
    const auto kernel = kernel_of<Kernel, VARIANT>;
    ensure_dynamic_smem_limit(reinterpret_cast<const void *>(kernel), Kernel::smem_bytes);
    constexpr DType dtype = Kernel::config.dtype;
    const KernelParams kp{
        params,
        make_tensor_map(dtype, params.q, params.q_strides, params.d_head, params.seqlen_q, params.heads_q, params.batch,
                        WGMMA_M, Kernel::Swizzle::bytes),
        make_tensor_map(dtype, params.k, params.k_strides, params.d_head, params.seqlen_k, params.heads_kv, params.batch,
                        Kernel::B_c, Kernel::Swizzle::bytes),
        make_tensor_map(dtype, params.v, params.v_strides, params.d_head, params.seqlen_k, params.heads_kv, params.batch,
                        Kernel::B_c, Kernel::Swizzle::bytes),
        make_tensor_map(dtype, params.o, params.o_strides, params.d_head, params.seqlen_q, params.heads_q, params.batch,
                        WGMMA_M, Kernel::Swizzle::bytes),
    };
    const int64_t work_tiles =
        static_cast<int64_t>((params.seqlen_q + Kernel::B_r - 1) / Kernel::B_r) * params.heads_q * params.batch;
    const int64_t blocks = Kernel::persistent ? std::min<int64_t>(work_tiles, multiprocessor_count()) : work_tiles;
    kernel<<<static_cast<unsigned>(blocks), Kernel::n_threads, Kernel::smem_bytes, stream>>>(kp);
    check_cuda(cudaGetLastError(), "kernel launch");
}

template <HopperForwardKernelConfig CFG, ProblemVariant VARIANT>
ForwardLauncher launcher() {
    using Kernel = StaticHopperKernelConfig<CFG>;
    return ForwardLauncher{reinterpret_cast<const void *>(kernel_of<Kernel, VARIANT>), Kernel::smem_bytes, Kernel::persistent,
                           &launch<Kernel, VARIANT>};
}

} // namespace flash::sm90
