// The SM80 family's traits, StaticForwardKernelConfig<CFG>: every compile-time quantity the kernel
// and its launcher need, derived from one configuration, with static_asserts that guard against
// the configurations the kernel cannot do (the Python validity rules reject them first, with the
// reasons).
#pragma once

#include "common/common.h"
#include "common/type_utils.cuh"
#include "sm80/config.h"
#include "sm80/layout.cuh"

namespace flash::sm80 {

template <FlashForwardKernelConfig CFG>
struct StaticForwardKernelConfig {
    static constexpr FlashForwardKernelConfig config = CFG;
    using value_t = element_t<CFG.dtype>;

    static constexpr int d_head = CFG.d_head;
    static constexpr int B_r = CFG.B_r;
    static constexpr int B_c = CFG.B_c;
    static constexpr int n_warps = CFG.n_warps;
    static constexpr int n_threads = n_warps * WARP_SIZE;
    static constexpr bool async_copy = CFG.async_copy;
    static constexpr bool eager_load_blocks = CFG.eager_load_blocks;
    static constexpr bool swizzled = CFG.swizzled;
    static constexpr bool mma_double_buffer_loads = CFG.mma_double_buffer_loads;
    static constexpr bool optimized_softmax = CFG.optimized_softmax;

    static_assert(CFG.dtype == DType::FP16 || CFG.dtype == DType::BF16, "dtype must be FP16 or BF16");
    static_assert(d_head == 32 || d_head == 64 || d_head == 96 || d_head == 128 || d_head == 192 || d_head == 256,
                  "d_head must be 32, 64, 96, 128, 192 or 256");
    static_assert(B_r == 16 || B_r == 32 || B_r == 64 || B_r == 128, "B_r must be 16, 32, 64 or 128");
    static_assert(B_c == 32 || B_c == 64 || B_c == 128, "B_c must be 32, 64 or 128");
    static_assert(n_warps == 4 || n_warps == 8, "n_warps must be 4 or 8");
    static_assert(!CFG.eager_load_blocks || CFG.async_copy, "eager_load_blocks requires async_copy");

    // Each warp computes the attention output of its own warp_rows query rows (a multiple of 16,
    // the MMA's M). A block of fewer than 16 rows per warp (decoding's few query rows) gives its
    // warps 16 rows each and splits every KV tile's keys over them instead: key group g's warps
    // (row_warps of them, one per 16-row group) take the tile's keys g * warp_keys onwards, each
    // with a softmax of its own, merged into key group 0's warps at the end (key_groups.cuh). Held
    // by one warp, a decode step's rows would leave the others waiting for its products.
    static constexpr int row_warps = B_r / MMA_M < n_warps ? B_r / MMA_M : n_warps;
    static constexpr int key_groups = n_warps / row_warps;
    static constexpr int warp_rows = B_r / row_warps;
    static constexpr int warp_keys = B_c / key_groups;
    static constexpr int M_tiles = warp_rows / MMA_M;
    static_assert(warp_keys % MMA_K == 0, "each key group's share of a KV tile must be a multiple of 16 keys");

    // S = Q K^T: (warp_rows x d_head) * (d_head x warp_keys); O += P V: (warp_rows x warp_keys) * (warp_keys x d_head).
    static constexpr int QK_slices = d_head / MMA_K;
    static constexpr int S_tiles = warp_keys / MMA_N;
    static constexpr int PV_slices = warp_keys / MMA_K;
    static constexpr int O_tiles = d_head / MMA_N;

  private:
    static constexpr bool valid_tile_count(int tiles, int slices) {
        return tiles == 0 || (tiles > 0 && (tiles & (tiles - 1)) == 0 && tiles < slices && slices % tiles == 0);
    }
    static constexpr int slices_per_load(int tiles, int slices) { return tiles == 0 ? slices : tiles; }

  public:
    static_assert(valid_tile_count(CFG.K_mma_load_K_tiles, QK_slices),
                  "K_mma_load_K_tiles must be 0 or a power of two below and dividing d_head / 16");
    static_assert(valid_tile_count(CFG.V_mma_load_K_tiles, PV_slices),
                  "V_mma_load_K_tiles must be 0 or a power of two below a warp's keys per tile / 16");
    static_assert(CFG.Q_mma_load_K_tiles == 0 || CFG.Q_mma_load_K_tiles == CFG.K_mma_load_K_tiles,
                  "Q_mma_load_K_tiles must be 0 or equal K_mma_load_K_tiles");

    // Q's fragments are either loaded once and kept in registers for the whole kernel, or
    // re-read from shared memory for every KV tile, a chunk of k-slices at a time with K's.
    static constexpr bool Q_in_registers = CFG.Q_mma_load_K_tiles == 0;
    static constexpr int K_slices_per_load = slices_per_load(CFG.K_mma_load_K_tiles, QK_slices);
    static constexpr int V_slices_per_load = slices_per_load(CFG.V_mma_load_K_tiles, PV_slices);
    static constexpr int QK_chunks = QK_slices / K_slices_per_load;
    static constexpr int PV_chunks = PV_slices / V_slices_per_load;
    static_assert(!mma_double_buffer_loads || QK_chunks > 1 || PV_chunks > 1,
                  "mma_double_buffer_loads needs K or V loaded in chunks (a nonzero K/V_mma_load_K_tiles)");

    using Q_fragments = FragmentsA<M_tiles, QK_slices>;          // Q_in_registers: all of Q
    using Q_chunk_fragments = FragmentsA<M_tiles, K_slices_per_load>; // otherwise: one chunk at a time
    using K_fragments = FragmentsB<S_tiles, K_slices_per_load>;
    using V_fragments = FragmentsB<O_tiles, V_slices_per_load>;
    using P_fragments = FragmentsA<M_tiles, PV_slices>;
    using S_accumulators = Accumulators<M_tiles, S_tiles>;
    using O_accumulators = Accumulators<M_tiles, O_tiles>;

    // Shared memory: the Q tile (reused to stage O on the way out), then a K and a V tile per
    // pipeline stage. eager_load_blocks copies the next K and V tiles into the second stage
    // while the first is computed on.
    using Q_tile = SmemTile<value_t, B_r, d_head, swizzled>;
    using KV_tile = SmemTile<value_t, B_c, d_head, swizzled>;
    static constexpr int KV_stages = eager_load_blocks ? 2 : 1;
    static constexpr int KV_stage_elems = 2 * KV_tile::size; // one K and one V tile
    static constexpr int smem_bytes = (Q_tile::size + KV_stages * KV_stage_elems) * static_cast<int>(sizeof(value_t));
};

} // namespace flash::sm80
