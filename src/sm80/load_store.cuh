// Data movement: global <-> shared memory tile copies (whole thread block), shared memory ->
// register fragments with ldmatrix (one warp), and accumulators -> shared memory (one warp).
//
// Addresses are built so that the per-lane part is computed once and every individual access is
// that plus a compile-time offset, which the compiler folds into the instruction's immediate:
// otherwise it hoists one register per distinct address out of the KV loop and spills them.
#pragma once

#include <cstdint>

#include "common/common.h"
#include "common/ptx.cuh"
#include "common/swizzling.cuh"
#include "common/type_utils.cuh"
#include "sm80/layout.cuh"

namespace flash::sm80 {

// How a block's threads cover a tile in 16-byte chunks, consecutive threads on consecutive chunks
// of a row so each warp's accesses coalesce.
//
// A regular plan copies rows_per_step whole rows per step: thread t copies the chunk column
// t % chunks_per_row of rows t / chunks_per_row + i * rows_per_step, so one per-thread address plus
// a compile-time offset reaches each of its chunks. rows_per_step is the largest power of two
// whose rows the threads can cover at once (it then divides the tile's rows); in a swizzled tile
// it must be a multiple of 8, so all of a thread's chunks sit at one swizzled column. Where rows
// of 12 chunks (d_head 96) leave threads over, those threads copy nothing.
//
// Otherwise (rows of 24 chunks with 4 warps, d_head 192; 32-chunk rows with 4 warps, d_head 256)
// thread t copies the chunks t + i * n_threads of the tile, counted row by row, each chunk's
// position computed.
template <int n_threads, typename Tile>
struct TileCopyPlan {
    static constexpr int chunks_per_row = Tile::cols / ELEMS_PER_COPY;
    static constexpr int chunks = Tile::rows * chunks_per_row;

  private:
    static constexpr int power_of_two_at_most(int n) {
        int p = 1;
        while (2 * p <= n)
            p *= 2;
        return p;
    }
    static constexpr int widest_step = power_of_two_at_most(n_threads / chunks_per_row);

  public:
    static constexpr bool regular =
        n_threads >= chunks_per_row && Tile::rows % widest_step == 0 && (!Tile::swizzled || widest_step % SWIZZLE_CHUNKS == 0);
    static constexpr int rows_per_step = regular ? widest_step : 0;
    // Threads at or past this copy nothing in a regular plan.
    static constexpr int active_threads = rows_per_step * chunks_per_row;
    static constexpr int steps = regular ? Tile::rows / rows_per_step : (chunks + n_threads - 1) / n_threads;
    static constexpr int smem_step_bytes = rows_per_step * Tile::row_bytes;

    // Chunk i of this thread: its row and first column, and whether it exists (a thread may have
    // no chunk in a regular plan, and the last step of an irregular plan may be short).
    static __device__ __forceinline__ int row(int i) {
        return regular ? threadIdx.x / chunks_per_row + i * rows_per_step : (threadIdx.x + i * n_threads) / chunks_per_row;
    }
    static __device__ __forceinline__ int col(int i) {
        return ((regular ? threadIdx.x : threadIdx.x + i * n_threads) % chunks_per_row) * ELEMS_PER_COPY;
    }
    static __device__ __forceinline__ bool exists(int i) {
        if constexpr (regular)
            return active_threads == n_threads || threadIdx.x < active_threads;
        else
            return chunks % n_threads == 0 || i + 1 < steps || threadIdx.x + i * n_threads < chunks;
    }
};

// Copies a tile from global memory (rows src_row_stride elements apart, each row contiguous) into
// shared memory. With async_copy the copies are cp.async instructions closed into one group (wait
// with cp_async_wait); without, they are vector loads through registers, complete on return.
// partial_rows: only the first valid_rows rows exist in global memory; partial_cols: only the first
// valid_cols columns (a multiple of 8, a head size smaller than the tile's). What does not exist is
// not read and arrives as zeros.
template <bool async_copy, int n_threads, bool partial_rows = false, bool partial_cols = false, typename Tile>
__device__ __forceinline__ void copy_global_to_shared(const Tile &dst, const typename Tile::value_t *src,
                                                      int64_t src_row_stride, int valid_rows = Tile::rows,
                                                      int valid_cols = Tile::cols) {
    using Plan = TileCopyPlan<n_threads, Tile>;
    using value_t = typename Tile::value_t;
    constexpr bool predicated = partial_rows || partial_cols;
    const auto chunk_exists = [&](int i) {
        return (!partial_rows || Plan::row(i) < valid_rows) && (!partial_cols || Plan::col(i) < valid_cols);
    };

    if constexpr (Plan::regular) {
        const uint32_t dst_address = ptx::shared_address(dst.at(Plan::row(0), Plan::col(0)));
        const value_t *src_thread = src + Plan::row(0) * src_row_stride + Plan::col(0);
        const int64_t src_step = Plan::rows_per_step * src_row_stride;
        // A thread the plan leaves over copies nothing (and still commits its empty group).
        if (Plan::exists(0)) {
            if constexpr (async_copy) {
#pragma unroll
                for (int i = 0; i < Plan::steps; ++i) {
                    if constexpr (predicated)
                        ptx::cp_async_16_zfill(dst_address + i * Plan::smem_step_bytes, src_thread + i * src_step,
                                               chunk_exists(i) ? COPY_BYTES : 0);
                    else
                        ptx::cp_async_16(dst_address + i * Plan::smem_step_bytes, src_thread + i * src_step);
                }
            } else {
                // All loads first, then all stores, so the loads are in flight together.
                uint4 staged[Plan::steps];
#pragma unroll
                for (int i = 0; i < Plan::steps; ++i)
                    staged[i] =
                        chunk_exists(i) ? *reinterpret_cast<const uint4 *>(src_thread + i * src_step) : uint4{0, 0, 0, 0};
#pragma unroll
                for (int i = 0; i < Plan::steps; ++i)
                    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst_address + i * Plan::smem_step_bytes),
                                 "r"(staged[i].x), "r"(staged[i].y), "r"(staged[i].z), "r"(staged[i].w));
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < Plan::steps; ++i) {
            if (!Plan::exists(i))
                continue;
            const int row = Plan::row(i), col = Plan::col(i);
            const uint32_t dst_address = ptx::shared_address(dst.at(row, col));
            const value_t *src_chunk = src + row * src_row_stride + col;
            if constexpr (async_copy)
                ptx::cp_async_16_zfill(dst_address, src_chunk, chunk_exists(i) ? COPY_BYTES : 0);
            else
                *reinterpret_cast<uint4 *>(dst.at(row, col)) =
                    chunk_exists(i) ? *reinterpret_cast<const uint4 *>(src_chunk) : uint4{0, 0, 0, 0};
        }
    }
    if constexpr (async_copy)
        ptx::cp_async_commit();
}

// As copy_global_to_shared, for a tile whose rows lie anywhere in global memory (a paged cache's
// keys): the row of this thread's chunk i of the plan starts at src_row(i, row), contiguous. src_row
// must return an address inside the tensor for every chunk, those of rows past valid_rows included,
// which are not read.
template <bool async_copy, int n_threads, bool partial_rows, bool partial_cols, typename Tile, typename RowAddress>
__device__ __forceinline__ void copy_rows_global_to_shared(const Tile &dst, const RowAddress &src_row,
                                                           int valid_rows = Tile::rows, int valid_cols = Tile::cols) {
    using Plan = TileCopyPlan<n_threads, Tile>;
#pragma unroll
    for (int i = 0; i < Plan::steps; ++i) {
        if (!Plan::exists(i))
            continue;
        const int row = Plan::row(i), col = Plan::col(i);
        const bool exists = (!partial_rows || row < valid_rows) && (!partial_cols || col < valid_cols);
        const typename Tile::value_t *src_chunk = src_row(i, row) + col;
        if constexpr (async_copy)
            ptx::cp_async_16_zfill(ptx::shared_address(dst.at(row, col)), src_chunk, exists ? COPY_BYTES : 0);
        else
            *reinterpret_cast<uint4 *>(dst.at(row, col)) =
                exists ? *reinterpret_cast<const uint4 *>(src_chunk) : uint4{0, 0, 0, 0};
    }
    if constexpr (async_copy)
        ptx::cp_async_commit();
}

// Copies a shared-memory tile to global memory with the same thread-to-chunk mapping; partial_rows:
// only its first valid_rows rows; partial_cols: only their first valid_cols columns.
template <int n_threads, bool partial_rows = false, bool partial_cols = false, typename Tile>
__device__ __forceinline__ void copy_shared_to_global(typename Tile::value_t *dst, int64_t dst_row_stride,
                                                      const Tile &src, int valid_rows = Tile::rows,
                                                      int valid_cols = Tile::cols) {
    using Plan = TileCopyPlan<n_threads, Tile>;
    using value_t = typename Tile::value_t;
    const auto chunk_exists = [&](int i) {
        return Plan::exists(i) && (!partial_rows || Plan::row(i) < valid_rows) &&
               (!partial_cols || Plan::col(i) < valid_cols);
    };
    if constexpr (Plan::regular) {
        const value_t *src_thread = src.at(Plan::row(0), Plan::col(0));
        value_t *dst_thread = dst + Plan::row(0) * dst_row_stride + Plan::col(0);
#pragma unroll
        for (int i = 0; i < Plan::steps; ++i)
            if (chunk_exists(i))
                *reinterpret_cast<uint4 *>(dst_thread + i * Plan::rows_per_step * dst_row_stride) =
                    *reinterpret_cast<const uint4 *>(src_thread + i * Plan::rows_per_step * Tile::row_stride);
    } else {
#pragma unroll
        for (int i = 0; i < Plan::steps; ++i) {
            const int row = Plan::row(i), col = Plan::col(i);
            if (chunk_exists(i))
                *reinterpret_cast<uint4 *>(dst + row * dst_row_stride + col) =
                    *reinterpret_cast<const uint4 *>(src.at(row, col));
        }
    }
}

// As copy_shared_to_global, for rows that lie anywhere in global memory (grouped heads packed as
// rows): tile row `row` goes to dst_row(row), contiguous. The addresses come first: computed
// between the stores, they would be computed again after each (a store may change what they read).
template <int n_threads, bool partial_rows, bool partial_cols, typename Tile, typename RowAddress>
__device__ __forceinline__ void copy_shared_to_global_rows(const RowAddress &dst_row, const Tile &src,
                                                           int valid_rows = Tile::rows, int valid_cols = Tile::cols) {
    using Plan = TileCopyPlan<n_threads, Tile>;
    typename Tile::value_t *dst[Plan::steps];
#pragma unroll
    for (int i = 0; i < Plan::steps; ++i)
        dst[i] = dst_row(Plan::row(i)) + Plan::col(i);
#pragma unroll
    for (int i = 0; i < Plan::steps; ++i) {
        const int row = Plan::row(i), col = Plan::col(i);
        if (Plan::exists(i) && (!partial_rows || row < valid_rows) && (!partial_cols || col < valid_cols))
            *reinterpret_cast<uint4 *>(dst[i]) = *reinterpret_cast<const uint4 *>(src.at(row, col));
    }
}

// The shared-memory addresses one lane gives ldmatrix when its warp reads a tile as 8-row groups:
// rows lane_row + 8i, 16-byte chunks 2p + chunk_lsb (p a compile-time "chunk pair"). The swizzle
// XORs the low three chunk bits with row % 8, which is the same for all the lane's rows, so it
// depends on p % 4 alone: four per-lane bases, and each access is one of them plus a compile-time
// byte offset (8 rows, and 8 chunks = 128 bytes, leave the swizzle unchanged).
template <typename Tile>
struct LdmatrixAddresses {
    static constexpr int row_bytes = Tile::row_bytes;
    uint32_t base[4];

    __device__ __forceinline__ LdmatrixAddresses(const Tile &tile, int lane_row, int chunk_lsb) {
#pragma unroll
        for (int p = 0; p < 4; ++p)
            base[p] = ptx::shared_address(tile.at(lane_row, (2 * p + chunk_lsb) * ELEMS_PER_COPY));
    }

    // Moves the addresses to a tile `bytes` further on (another pipeline stage of the same shape).
    __device__ __forceinline__ void shift(int bytes) {
#pragma unroll
        for (int p = 0; p < 4; ++p)
            base[p] += bytes;
    }

    // Rows lane_row + row_offset (a multiple of 8), chunk 2 * chunk_pair + chunk_lsb.
    __device__ __forceinline__ uint32_t at(int row_offset, int chunk_pair) const {
        return base[chunk_pair % 4] + row_offset * row_bytes + (chunk_pair / 4) * (SWIZZLE_CHUNKS * COPY_BYTES);
    }
};

// A operand from a row-major tile (rows = M, columns = K), for the warp whose rows start at
// first_row: one ldmatrix.x4 per 16x16 piece, lanes 0-15 addressing its rows at the k-slice's first
// 8 columns and lanes 16-31 the same rows at the last 8, which yields a0..a3 in the MMA's order.
template <typename Tile>
__device__ __forceinline__ LdmatrixAddresses<Tile> A_addresses(const Tile &tile, int first_row) {
    const int lane = threadIdx.x % WARP_SIZE;
    return LdmatrixAddresses<Tile>(tile, first_row + lane % 16, lane / 16);
}

template <int M, int S, typename Tile>
__device__ __forceinline__ void load_A(FragmentsA<M, S> &a, const LdmatrixAddresses<Tile> &addresses,
                                       int first_slice) {
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int s = 0; s < S; ++s)
            ptx::ldmatrix_x4(a.r[m][s], addresses.at(m * MMA_M, first_slice + s));
}

// B operand of S = Q * K^T from the K tile, stored row-major as (N = key rows, K = d_head): that is
// B in column-major order, so no transpose. One ldmatrix.x4 covers two 8-row n-tiles of one
// k-slice: lanes 0-7 / 8-15 address n-tile n at the slice's low / high 8 columns (b0, b1),
// lanes 16-31 the same for n-tile n + 1. The warp's keys start at row first_row (a multiple of 16).
template <typename Tile>
__device__ __forceinline__ LdmatrixAddresses<Tile> B_from_rows_n_addresses(const Tile &tile, int first_row) {
    const int lane = threadIdx.x % WARP_SIZE;
    return LdmatrixAddresses<Tile>(tile, first_row + (lane / 16) * 8 + lane % 8, (lane / 8) % 2);
}

template <int N, int S, typename Tile>
__device__ __forceinline__ void load_B_from_rows_n(FragmentsB<N, S> &b, const LdmatrixAddresses<Tile> &addresses,
                                                   int first_slice) {
    static_assert(N % 2 == 0, "ldmatrix.x4 loads n-tiles in pairs");
#pragma unroll
    for (int n = 0; n < N; n += 2)
#pragma unroll
        for (int s = 0; s < S; ++s) {
            uint32_t r[4];
            ptx::ldmatrix_x4(r, addresses.at(n * MMA_N, first_slice + s));
            b.r[n][s][0] = r[0];
            b.r[n][s][1] = r[1];
            b.r[n + 1][s][0] = r[2];
            b.r[n + 1][s][1] = r[3];
        }
}

// B operand of O = P * V from the V tile, stored row-major as (K = key rows, N = d_head): B in
// row-major order, so ldmatrix transposes each 8x8 matrix. Lanes 0-7 / 8-15 address the slice's
// low / high 8 rows at n-tile n (b0, b1), lanes 16-31 the same rows at n-tile n + 1. The warp's
// keys start at row first_row (a multiple of 16).
template <typename Tile>
__device__ __forceinline__ LdmatrixAddresses<Tile> B_from_rows_k_addresses(const Tile &tile, int first_row) {
    const int lane = threadIdx.x % WARP_SIZE;
    return LdmatrixAddresses<Tile>(tile, first_row + ((lane / 8) % 2) * 8 + lane % 8, lane / 16);
}

template <int N, int S, typename Tile>
__device__ __forceinline__ void load_B_from_rows_k(FragmentsB<N, S> &b, const LdmatrixAddresses<Tile> &addresses,
                                                   int first_slice) {
    static_assert(N % 2 == 0, "ldmatrix.x4 loads n-tiles in pairs");
#pragma unroll
    for (int s = 0; s < S; ++s)
#pragma unroll
        for (int n = 0; n < N; n += 2) {
            uint32_t r[4];
            ptx::ldmatrix_x4_trans(r, addresses.at((first_slice + s) * MMA_K, n / 2));
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

} // namespace flash::sm80
