// The FlashAttention-2 forward kernel. One thread block computes O for B_r query rows of one
// (batch, head): it walks over all KV tiles, computing S = Q K^T, the online softmax and
// O += P V on tensor cores, and writes O once at the end.
#pragma once

#include <cstdint>

#include "common.h"
#include "flash_config.cuh"
#include "forward_kernel_registry.cuh"
#include "gemm.cuh"
#include "layout.cuh"
#include "load_store.cuh"
#include "ptx.cuh"
#include "softmax.cuh"
#include "static_kernel_configuration.cuh"

namespace flash {

// Element pointer to row `row` of one (batch, head) slice of a (batch, seq, heads, d_head) tensor.
template <typename value_t, typename Ptr>
__device__ __forceinline__ value_t *tensor_rows(Ptr base, const TensorStrides &strides, int batch, int head, int row) {
    return static_cast<value_t *>(base) + batch * strides.batch + head * strides.head + row * strides.seq;
}

// Makes the block's completed tile copies visible to every warp. With cp.async, waits first until
// at most n_pending of this thread's copy groups are still in flight.
template <typename Kernel, int n_pending>
__device__ __forceinline__ void wait_for_copies() {
    if constexpr (Kernel::async_copy)
        ptx::cp_async_wait<n_pending>();
    __syncthreads();
}

template <typename Kernel>
__global__ void __launch_bounds__(Kernel::n_threads) flash_forward_kernel(const __grid_constant__ ForwardKernelArgs args) {
    using value_t = typename Kernel::value_t;
    constexpr bool async_copy = Kernel::async_copy;
    constexpr int n_threads = Kernel::n_threads;

    extern __shared__ __align__(COPY_BYTES) unsigned char smem[];
    const typename Kernel::Q_tile Q_smem{reinterpret_cast<value_t *>(smem)};
    const typename Kernel::KV_tile K_smem{Q_smem.data + Kernel::Q_tile::size};
    const typename Kernel::KV_tile V_smem{K_smem.data + Kernel::KV_tile::size};

    const int Q_block = blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int warp_first_row = (threadIdx.x / WARP_SIZE) * Kernel::warp_rows;

    const value_t *Q = tensor_rows<const value_t>(args.Q, args.Q_strides, batch, head, Q_block * Kernel::B_r);
    const value_t *K = tensor_rows<const value_t>(args.K, args.K_strides, batch, head, 0);
    const value_t *V = tensor_rows<const value_t>(args.V, args.V_strides, batch, head, 0);
    value_t *O = tensor_rows<value_t>(args.O, args.O_strides, batch, head, Q_block * Kernel::B_r);
    const int64_t K_tile_stride = Kernel::B_c * args.K_strides.seq;
    const int64_t V_tile_stride = Kernel::B_c * args.V_strides.seq;

    copy_global_to_shared<async_copy, n_threads>(Q_smem, Q, args.Q_strides.seq);
    typename Kernel::Q_fragments Q_frags;
    if constexpr (Kernel::Q_in_registers) {
        wait_for_copies<Kernel, 0>();
        load_A(Q_frags, Q_smem, warp_first_row, 0);
    }

    typename Kernel::O_accumulators O_acc;
    O_acc.zero();
    OnlineSoftmax<Kernel::M_tiles> softmax;
    softmax.init();

    for (int KV_block = 0; KV_block < args.n_KV_blocks; ++KV_block) {
        __syncthreads(); // every warp is done with the previous K and V tiles before they are overwritten
        copy_global_to_shared<async_copy, n_threads>(K_smem, K + KV_block * K_tile_stride, args.K_strides.seq);
        copy_global_to_shared<async_copy, n_threads>(V_smem, V + KV_block * V_tile_stride, args.V_strides.seq);
        wait_for_copies<Kernel, 1>(); // K (and Q) have landed; V may still be in flight during S = Q K^T

        typename Kernel::S_accumulators S_acc;
        S_acc.zero();
#pragma unroll
        for (int chunk = 0; chunk < Kernel::QK_chunks; ++chunk) {
            const int first_slice = chunk * Kernel::K_slices_per_load;
            typename Kernel::K_fragments K_frags;
            load_B_from_rows_n(K_frags, K_smem, first_slice);
            if constexpr (Kernel::Q_in_registers) {
                warp_gemm<value_t>(S_acc, Q_frags, first_slice, K_frags);
            } else {
                load_A(Q_frags, Q_smem, warp_first_row, first_slice);
                warp_gemm<value_t>(S_acc, Q_frags, 0, K_frags);
            }
        }

        softmax.update(S_acc, O_acc, args.softmax_scale);
        typename Kernel::P_fragments P_frags;
        accumulators_to_A<value_t>(P_frags, S_acc);

        wait_for_copies<Kernel, 0>();
#pragma unroll
        for (int chunk = 0; chunk < Kernel::PV_chunks; ++chunk) {
            const int first_slice = chunk * Kernel::V_slices_per_load;
            typename Kernel::V_fragments V_frags;
            load_B_from_rows_k(V_frags, V_smem, first_slice);
            warp_gemm<value_t>(O_acc, P_frags, first_slice, V_frags);
        }
    }

    softmax.normalize(O_acc);
    // O is staged through the Q tile so the global stores are full 16-byte, coalesced rows.
    __syncthreads();
    store_accumulators(Q_smem, O_acc, warp_first_row);
    __syncthreads();
    copy_shared_to_global<n_threads>(O, args.O_strides.seq, Q_smem);
}

template <FlashForwardKernelConfig CFG>
forward_kernel_fn forward_kernel_pointer() {
    return &flash_forward_kernel<StaticForwardKernelConfig<CFG>>;
}

} // namespace flash
