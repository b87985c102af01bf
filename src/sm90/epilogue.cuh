// The Hopper epilogue of one work tile: the shared normalisation and log-sum-exp
// (finish_softmax), then O through shared memory by TMA (a varlen call's box that would reach past
// its sequence's end, by 16-byte stores).
#pragma once

#include <cstdint>

#include "common/common.h"
#include "common/forward_params.h"
#include "common/softmax_epilogue.cuh"
#include "common/type_utils.cuh"
#include "sm90/box_coordinates.cuh"
#include "sm90/consumer_warpgroup.cuh"
#include "sm90/kernel_params.h"
#include "sm90/tma.cuh"
#include "sm90/warpgroup.cuh"
#include "sm90/wgmma.cuh"

namespace flash::sm90 {

// A warpgroup's 64 rows of O, from first_row of (batch, head) of a sequence (params: its lengths,
// o at its first row), from the swizzled block in shared memory to the rows before the sequence's
// end, in 16-byte stores: a TMA box would write past it, over the next sequence's rows.
template <typename Kernel>
__device__ __forceinline__ void store_sequence_rows(const ForwardParams &params, const uint8_t *O_smem, int first_row,
                                                    int head, int batch) {
    using Swizzle = typename Kernel::O_Swizzle;
    // The call's columns: a smaller head size than the configuration's stops short of its tile.
    const int row_chunks = params.d_head * ELEMENT_BYTES / COPY_BYTES;
    constexpr int block_chunks = Swizzle::bytes / COPY_BYTES; // per row of one column block
    const int rows = min(WGMMA_M, params.seqlen_q - first_row);
    uint8_t *const O = static_cast<uint8_t *>(params.o) +
                       (batch * params.o_strides.batch + head * params.o_strides.head) * ELEMENT_BYTES;
    for (int i = threadIdx.x % WARPGROUP_THREADS; i < rows * row_chunks; i += WARPGROUP_THREADS) {
        const int row = i / row_chunks;
        const int chunk = i % row_chunks;
        const uint8_t *const from = O_smem + chunk / block_chunks * Kernel::O_col_block_bytes + row * Swizzle::bytes +
                                    Swizzle::chunk_in_row(row, chunk % block_chunks) * COPY_BYTES;
        *reinterpret_cast<uint4 *>(O + (first_row + row) * params.o_strides.seq * ELEMENT_BYTES + chunk * COPY_BYTES) =
            *reinterpret_cast<const uint4 *>(from);
    }
}

// A consumer warpgroup's 64 rows of the work tile starting at Q_first_row of (batch, head), whose
// sequence's lengths are params' and whose boxes of O are at O_boxes (with VARLEN, a box that would
// reach past the sequence's end is stored row by row instead: store_sequence_rows). With e4m3, O is
// multiplied by v's dequantisation factor O_descale and written in the call's 16-bit o_dtype.
template <typename Kernel, bool VARLEN, typename Softmax>
__device__ __forceinline__ void write_outputs(const KernelParams &kp, const ForwardParams &params, const BoxCoordinates &O_boxes,
                                              const ConsumerWarpgroup<Kernel> &consumer, const Softmax &softmax,
                                              typename Kernel::O_accumulators &O_acc, float score_scale, float O_descale,
                                              int Q_first_row, int head, int batch) {
    using Swizzle = typename Kernel::O_Swizzle;
    const int warp_first_row = consumer.warp_first_row;
    finish_softmax(softmax, O_acc, score_scale, params.lse, params, batch, head, Q_first_row, warp_first_row,
                   [&] { return params.seqlen_q - Q_first_row; });

    // O leaves through shared memory, in the swizzled layout TMA reads, once every warp
    // of the warpgroup is done with Q (whose block O reuses, SharedTiles::O) and the previous
    // work tile's store has read its O; TMA drops the rows past seqlen_q (past the sequence's end).
    const bool stores = threadIdx.x % WARPGROUP_THREADS == 0;
    if (Kernel::persistent && stores)
        tma_store_wait_read();
    named_barrier_sync(consumer.warpgroup_barrier, WARPGROUP_THREADS);
    // A persistent block's O block, computed once per block; a single pass's (its Q block), here.
    uint8_t *const O_smem = Kernel::persistent ? consumer.O_smem : consumer.smem.O(consumer.wg);
    constexpr int chunks_per_row = Swizzle::bytes / COPY_BYTES; // one 8-column accumulator tile each
    const auto write_O = [&](auto element) {
        using out_t = decltype(element);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = warp_first_row % WGMMA_M + consumer.lane / QUAD_SIZE + 8 * h;
#pragma unroll
            for (int n = 0; n < Kernel::d_head / MMA_N; ++n) {
                const int chunk = Swizzle::chunk_in_row(row, n % chunks_per_row);
                // Added to the pointer term by term, in this order: an integer offset summed first
                // compiles to other address arithmetic, and ptxas then schedules the main loop otherwise.
                uint8_t *const at = O_smem + consumer.lane % QUAD_SIZE * 2 * ELEMENT_BYTES + row * Swizzle::bytes +
                                    chunk * COPY_BYTES + n / chunks_per_row * Kernel::O_col_block_bytes;
                *reinterpret_cast<uint32_t *>(at) = pack_pair<out_t>(O_acc.r[0][n][2 * h] * O_descale,
                                                                     O_acc.r[0][n][2 * h + 1] * O_descale);
            }
        }
    };
    if constexpr (!Kernel::fp8)
        write_O(typename Kernel::value_t{});
    else if (params.o_dtype == DType::FP16)
        write_O(half{});
    else
        write_O(nv_bfloat16{});
    const int wg_first_row = Q_first_row + consumer.wg * WGMMA_M;
    // A varlen box that would reach past the sequence's end is stored row by row; the others, by TMA.
    if (VARLEN && wg_first_row + WGMMA_M > params.seqlen_q) {
        named_barrier_sync(consumer.warpgroup_barrier, WARPGROUP_THREADS);
        store_sequence_rows<Kernel>(params, O_smem, wg_first_row, head, batch);
        return;
    }
    fence_async_shared();
    named_barrier_sync(consumer.warpgroup_barrier, WARPGROUP_THREADS);
    if (stores) {
#pragma unroll
        for (int c = 0; c < Kernel::O_col_blocks; ++c)
            O_boxes.store(&kp.o, O_smem + c * Kernel::O_col_block_bytes, c * Swizzle::cols, wg_first_row, head);
        tma_store_commit();
    }
}

} // namespace flash::sm90
