// Data movement: global <-> shared memory tile copies (whole thread block), shared memory ->
// register fragments with ldmatrix (one warp), and accumulators -> shared memory (one warp).
#pragma once

#include <cstdint>

#include "common.h"
#include "layout.cuh"
#include "ptx.cuh"
#include "type_utils.cuh"

namespace flash {

// Copies a tile from global memory (rows src_row_stride elements apart, each row contiguous) into
// shared memory, 16 bytes per thread per step, consecutive threads on consecutive chunks of a row
// so each warp's accesses coalesce. With async_copy the copies are cp.async instructions closed
// into one group (wait with cp_async_wait); without, they are vector loads through registers that
// are complete when this returns.
template <bool async_copy, int n_threads, typename Tile>
__device__ __forceinline__ void copy_global_to_shared(const Tile &dst, const typename Tile::value_t *src,
                                                      int64_t src_row_stride) {
    constexpr int chunks_per_row = Tile::cols / ELEMS_PER_COPY;
    constexpr int chunks = Tile::rows * chunks_per_row;
    static_assert(chunks % n_threads == 0, "the block's threads must evenly divide the tile's 16-byte chunks");
    constexpr int chunks_per_thread = chunks / n_threads;

    if constexpr (async_copy) {
#pragma unroll
        for (int i = 0; i < chunks_per_thread; ++i) {
            const int chunk = i * n_threads + threadIdx.x;
            const int row = chunk / chunks_per_row;
            const int col = (chunk % chunks_per_row) * ELEMS_PER_COPY;
            ptx::cp_async_16(dst.at(row, col), src + row * src_row_stride + col);
        }
        ptx::cp_async_commit();
    } else {
        // All loads first, then all stores, so the loads are in flight together.
        uint4 staged[chunks_per_thread];
#pragma unroll
        for (int i = 0; i < chunks_per_thread; ++i) {
            const int chunk = i * n_threads + threadIdx.x;
            const int row = chunk / chunks_per_row;
            const int col = (chunk % chunks_per_row) * ELEMS_PER_COPY;
            staged[i] = *reinterpret_cast<const uint4 *>(src + row * src_row_stride + col);
        }
#pragma unroll
        for (int i = 0; i < chunks_per_thread; ++i) {
            const int chunk = i * n_threads + threadIdx.x;
            const int row = chunk / chunks_per_row;
            const int col = (chunk % chunks_per_row) * ELEMS_PER_COPY;
            *reinterpret_cast<uint4 *>(dst.at(row, col)) = staged[i];
        }
    }
}

// Copies a shared-memory tile to global memory with the same thread-to-chunk mapping.
template <int n_threads, typename Tile>
__device__ __forceinline__ void copy_shared_to_global(typename Tile::value_t *dst, int64_t dst_row_stride,
                                                      const Tile &src) {
    constexpr int chunks_per_row = Tile::cols / ELEMS_PER_COPY;
    constexpr int chunks = Tile::rows * chunks_per_row;
    static_assert(chunks % n_threads == 0, "the block's threads must evenly divide the tile's 16-byte chunks");
#pragma unroll
    for (int i = 0; i < chunks / n_threads; ++i) {
        const int chunk = i * n_threads + threadIdx.x;
        const int row = chunk / chunks_per_row;
        const int col = (chunk % chunks_per_row) * ELEMS_PER_COPY;
        *reinterpret_cast<uint4 *>(dst + row * dst_row_stride + col) = *reinterpret_cast<const uint4 *>(src.at(row, col));
    }
}

// A operand from a row-major tile (rows = M, columns = K): the warp's rows first_row.. and the
// k-slices first_slice.. . One ldmatrix.x4 per 16x16 piece: lanes 0-15 address its rows at the
// slice's first 8 columns, lanes 16-31 the same rows at the last 8, which yields registers
// a0..a3 in the order the MMA wants them.
template <int M, int S, typename Tile>
__device__ __forceinline__ void load_A(FragmentsA<M, S> &a, const Tile &tile, int first_row, int first_slice) {
    const int lane = threadIdx.x % WARP_SIZE;
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int s = 0; s < S; ++s) {
            const int row = first_row + m * MMA_M + lane % 16;
            const int col = (first_slice + s) * MMA_K + (lane / 16) * 8;
            ptx::ldmatrix_x4(a.r[m][s], tile.at(row, col));
        }
}

// B operand of S = Q * K^T from the K tile, stored row-major as (N = key rows, K = d_head): that is
// B in column-major order, so no transpose. One ldmatrix.x4 covers two 8-row n-tiles of one
// k-slice: lanes 0-7 / 8-15 address n-tile n at the slice's low / high 8 columns (b0, b1),
// lanes 16-31 the same for n-tile n + 1.
template <int N, int S, typename Tile>
__device__ __forceinline__ void load_B_from_rows_n(FragmentsB<N, S> &b, const Tile &tile, int first_slice) {
    static_assert(N % 2 == 0, "ldmatrix.x4 loads n-tiles in pairs");
    const int lane = threadIdx.x % WARP_SIZE;
#pragma unroll
    for (int n = 0; n < N; n += 2)
#pragma unroll
        for (int s = 0; s < S; ++s) {
            const int row = n * MMA_N + (lane / 16) * 8 + lane % 8;
            const int col = (first_slice + s) * MMA_K + ((lane / 8) % 2) * 8;
            uint32_t r[4];
            ptx::ldmatrix_x4(r, tile.at(row, col));
            b.r[n][s][0] = r[0];
            b.r[n][s][1] = r[1];
            b.r[n + 1][s][0] = r[2];
            b.r[n + 1][s][1] = r[3];
        }
}

// B operand of O = P * V from the V tile, stored row-major as (K = key rows, N = d_head): B in
// row-major order, so ldmatrix transposes each 8x8 matrix. Lanes 0-7 / 8-15 address the slice's
// low / high 8 rows at n-tile n (b0, b1), lanes 16-31 the same rows at n-tile n + 1.
template <int N, int S, typename Tile>
__device__ __forceinline__ void load_B_from_rows_k(FragmentsB<N, S> &b, const Tile &tile, int first_slice) {
    static_assert(N % 2 == 0, "ldmatrix.x4 loads n-tiles in pairs");
    const int lane = threadIdx.x % WARP_SIZE;
#pragma unroll
    for (int s = 0; s < S; ++s)
#pragma unroll
        for (int n = 0; n < N; n += 2) {
            const int row = (first_slice + s) * MMA_K + ((lane / 8) % 2) * 8 + lane % 8;
            const int col = n * MMA_N + (lane / 16) * 8;
            uint32_t r[4];
            ptx::ldmatrix_x4_trans(r, tile.at(row, col));
            b.r[n][s][0] = r[0];
            b.r[n][s][1] = r[1];
            b.r[n + 1][s][0] = r[2];
            b.r[n + 1][s][1] = r[3];
        }
}

// Rounds a warp's accumulators to the 16-bit type and writes them to its rows first_row.. of a
// row-major tile.
template <int M, int N, typename Tile>
__device__ __forceinline__ void store_accumulators(const Tile &tile, const Accumulators<M, N> &acc, int first_row) {
    using value_t = typename Tile::value_t;
    const int lane = threadIdx.x % WARP_SIZE;
    const int lane_row = lane / QUAD_SIZE;
    const int lane_col = 2 * (lane % QUAD_SIZE);
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int n = 0; n < N; ++n)
#pragma unroll
            for (int half_row = 0; half_row < 2; ++half_row) {
                const int row = first_row + m * MMA_M + half_row * 8 + lane_row;
                const int col = n * MMA_N + lane_col;
                *reinterpret_cast<uint32_t *>(tile.at(row, col)) =
                    pack_pair<value_t>(acc.r[m][n][2 * half_row], acc.r[m][n][2 * half_row + 1]);
            }
}

} // namespace flash
