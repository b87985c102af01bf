// The SM80 family's launcher: one thread block per B_r query rows of one (batch, head) (of the
// longest sequence, with per-sequence lengths) and split of the keys, n_warps warps, the traits'
// dynamic shared memory (with an FP8 cache's staged tiles).
#pragma once

#include <algorithm>

#include <cuda_runtime.h>

#include "common/cuda_utils.cuh"
#include "sm80/forward_kernel.cuh"
#include "sm80/launcher.h"
#include "sm80/traits.cuh"

namespace flash::sm80 {

template <typename Kernel, ProblemVariant VARIANT>
constexpr auto kernel_of =
    &flash_forward_kernel<Kernel, VARIANT.mask, VARIANT.masked_tails, VARIANT.score_mods, VARIANT.varlen, VARIANT.kv_e4m3>;

// The dynamic shared memory of a block: the traits', and an FP8 cache's staged tiles.
template <typename Kernel, ProblemVariant VARIANT>
constexpr int smem_bytes_of = KVTileCopies<Kernel, VARIANT.masked_tails, VARIANT.varlen, VARIANT.kv_e4m3>::smem_bytes;

template <typename Kernel, ProblemVariant VARIANT>
void launch(const ForwardParams &params, cudaStream_t stream) {
    const auto kernel = kernel_of<Kernel, VARIANT>;
    constexpr int smem_bytes = smem_bytes_of<Kernel, VARIANT>;
    ensure_dynamic_smem_limit(reinterpret_cast<const void *>(kernel), smem_bytes);
    // With a split over the keys (varlen variant only), num_splits runs of the query blocks.
    const int splits = VARIANT.varlen ? std::max(params.split.num_splits, 1) : 1;
    const dim3 grid((params.seqlen_q + Kernel::B_r - 1) / Kernel::B_r * splits, static_cast<unsigned>(params.heads_q),
                    static_cast<unsigned>(params.batch));
    kernel<<<grid, Kernel::n_threads, smem_bytes, stream>>>(params);
    check_cuda(cudaGetLastError(), "kernel launch");
}

template <FlashForwardKernelConfig CFG, ProblemVariant VARIANT>
ForwardLauncher launcher() {
    using Kernel = StaticForwardKernelConfig<CFG>;
    // The varlen variant (a decoding configuration's) addresses grouped rows.
    return ForwardLauncher{reinterpret_cast<const void *>(kernel_of<Kernel, VARIANT>), smem_bytes_of<Kernel, VARIANT>, 0, 0,
                           false, VARIANT.varlen, nullptr, &launch<Kernel, VARIANT>};
}

} // namespace flash::sm80
