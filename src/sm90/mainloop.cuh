// The consumer main loop of one work tile: for each of its KV tiles S = Q K^T (wgmma, Q from shared
// memory or registers), the score modifications and the mask, the online softmax, and O += P V, with
// the product of one tile overlapping the softmax of the next.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/common.h"
#include "common/forward_params.h"
#include "common/fragments.cuh"
#include "common/kv_tile_walk.cuh"
#include "common/masking.cuh"
#include "common/online_softmax.cuh"
#include "common/problem_variant.h"
#include "common/ptx.cuh"
#include "sm90/consumer_warpgroup.cuh"
#include "sm90/fp8_operands.cuh"
#include "sm90/shared_tiles.cuh"
#include "sm90/tma.cuh"
#include "sm90/warpgroup.cuh"
#include "sm90/wgmma.cuh"

namespace flash::sm90 {

// A masked tile's products stop after the last key a warpgroup can see (the diagonal of its last
// row, or the end of the keys) instead of computing what the mask drops, at one of two widths: half
// the tile (rounded up to whole k-slices of P V, K_SLICE keys) or all of it. Half a tile is what the first warpgroup of a
// causal mask's diagonal tile sees, with 128-row work tiles and 128-key tiles. Each width compiles
// the tile's whole softmax once more, and finer steps cost more than they save (measured: P V in
// steps of 16 keys made seq 1000 slower).
template <int B_c, int K_SLICE>
constexpr int half_key_width() {
    return (B_c / 2 + K_SLICE - 1) / K_SLICE * K_SLICE;
}
template <int B_c, int K_SLICE, typename Use>
__device__ __forceinline__ void with_key_width(int keys, Use &&use) {
    constexpr int half = half_key_width<B_c, K_SLICE>();
    if (keys <= half)
        use(std::integral_constant<int, half>{});
    else
        use(std::integral_constant<int, B_c>{});
}

// What a consumer warpgroup computes on one work tile's KV tiles (those of `tiles`, at least one)
// into its softmax statistics and O. Without warp specialization, `loads` says this thread also
// issues the later tiles' loads, each once its stage has been released.
template <typename Kernel, typename Loader, MaskKind MASK, bool MASKED_TAILS, bool SCORE_MODS, bool VARLEN>
struct MainLoop {
    using value_t = typename Kernel::value_t;
    using Swizzle = typename Kernel::Swizzle;
    using Tiles = KVTileRange<Kernel::B_r, Kernel::B_c, MASK, MASKED_TAILS, VARLEN>;
    // e4m3's P is biased to 2^8 at a fresh maximum (OnlineSoftmax): its small values stay normal.
    using Softmax = OnlineSoftmax<1, true, Tiles::may_be_empty, Kernel::fp8 ? 8 : 0>;
    using FullWidth = std::integral_constant<int, Kernel::B_c>;
    static constexpr int B_c = Kernel::B_c;
    static constexpr int d_head = Kernel::d_head;
    static constexpr int stages = Kernel::stages;
    // A stage's K tile after another, and its P V operand (V's tile, or with e4m3 V transposed).
    static constexpr uint64_t stage_step = Kernel::KV_tile_bytes >> 4;
    static constexpr uint64_t PV_stage_step = (Kernel::transposes_V ? Kernel::Vt_tile_bytes : Kernel::KV_tile_bytes) >> 4;

    ConsumerWarpgroup<Kernel> &consumer;
    const SharedTiles<Kernel> smem;
    const ForwardParams &params;
    const Tiles &tiles;
    const Loader &loader;
    bool loads;
    int Q_first_row;
    const ScoreModsOf<SCORE_MODS> &score_mods;
    // What the softmax multiplies the scores by: the softmax scale, or softcap once capped.
    float score_scale;
    Softmax &softmax;
    typename Kernel::O_accumulators &O_acc;

    // Descriptors of this warpgroup's Q block and of stage 0's K and V tiles (with e4m3, V's
    // transposed tile, K-major); slices and stages are offsets added to the start address field
    // (16-byte units).
    uint64_t Q_desc;
    uint64_t K_desc;
    uint64_t V_desc;
    // This warpgroup's last row before seqlen_q.
    int last_row;
    PipelineState<stages> previous; // of the tile whose P V product is still to be issued
    // With deferred_O_rescale, the factors O's rows owe the maxima the last softmax moved, applied in
    // the next turn between S and the P V that adds to O (the P V in flight during that softmax has
    // landed by then), so the softmax does not wait for that P V.
    bool O_rescale_pending = false;
    float O_rescale[2];

    __device__ __forceinline__ MainLoop(ConsumerWarpgroup<Kernel> &consumer_, const ForwardParams &params_,
                                        const Tiles &tiles_, const Loader &loader_, bool loads_, int Q_first_row_,
                                        const ScoreModsOf<SCORE_MODS> &score_mods_, Softmax &softmax_,
                                        typename Kernel::O_accumulators &O_acc_)
        : consumer(consumer_), smem(consumer_.smem), params(params_), tiles(tiles_), loader(loader_), loads(loads_),
          Q_first_row(Q_first_row_), score_mods(score_mods_), score_scale(score_mods_.post_scale), softmax(softmax_),
          O_acc(O_acc_), Q_desc(k_major_descriptor<Swizzle>(ptx::shared_address(smem.Q(consumer_.wg)))),
          K_desc(k_major_descriptor<Swizzle>(ptx::shared_address(smem.K(0)))),
          V_desc(Kernel::fp8 ? k_major_descriptor<typename Kernel::Vt_Swizzle>(ptx::shared_address(smem.PV_operand(0)))
                             : mn_major_descriptor<Swizzle>(ptx::shared_address(smem.V(0)), Kernel::KV_col_block_bytes)),
          last_row(min(Q_first_row_ + (consumer_.wg + 1) * WGMMA_M, params_.seqlen_q) - 1) {}

    // The register tiles (Q with Q_in_registers, and P) are locals of run(), passed to the steps
    // that use them: kept apart from the loop's other state, they stay in registers as they would
    // in a single function.
    __device__ __forceinline__ void run() {
        typename Kernel::Q_fragments Q_frag;
        typename Kernel::P_fragments P;
        if constexpr (!Kernel::persistent)
            mbarrier_wait(smem.Q_full(consumer.wg), 0);
        if constexpr (Kernel::Q_in_registers)
            load_Q_fragments(Q_frag);
        walk_kv_tiles<true>(
            tiles,
            [&](int tile, auto masked) {
                at_width(tile, masked, [&](auto width) { first_tile(Q_frag, P, masked, width); });
            },
            [&](int first, int last, auto masked) {
                for (int tile = first; tile < last; ++tile)
                    at_width(tile, masked, [&](auto width) { later_tile(Q_frag, P, tile, masked, width); });
            });
        last_PV(P);
    }

  private:
    // k-slice kk of a K-major tile: its column block, then 32 bytes per slice inside the row.
    template <typename TileSwizzle = Swizzle>
    __device__ __forceinline__ static uint64_t k_slice(int kk, int col_block_bytes) {
        constexpr int slices_per_row = TileSwizzle::bytes / WGMMA_K_BYTES;
        return static_cast<uint64_t>((kk / slices_per_row * col_block_bytes + kk % slices_per_row * WGMMA_K_BYTES) >> 4);
    }

    // This warp's 16 rows, one ldmatrix per 16-column slice: lane l addresses row l % 16
    // of the slice's left (l < 16) or right half.
    __device__ __forceinline__ void load_Q_fragments(typename Kernel::Q_fragments &Q_frag) const {
        const int row = consumer.warp_first_row % WGMMA_M + consumer.lane % MMA_M;
        const uint32_t Q_base = ptx::shared_address(smem.Q(consumer.wg));
#pragma unroll
        for (int kk = 0; kk < d_head / MMA_K; ++kk) {
            const int col = kk * MMA_K + consumer.lane / MMA_M * ELEMS_PER_COPY;
            const int chunk = Swizzle::chunk_in_row(row, col % Swizzle::cols / ELEMS_PER_COPY);
            ptx::ldmatrix_x4(Q_frag.r[0][kk],
                             Q_base + col / Swizzle::cols * Kernel::Q_col_block_bytes + row * Swizzle::bytes + chunk * COPY_BYTES);
        }
    }

    // S = Q K^T over the tile's first `width` keys (B_c but in masked tiles): a narrower product
    // writes the leading columns of S; the others are masked, -infinity from the start. The
    // fence orders these and every earlier register write (O's rescaling too) before the products.
    template <typename Width>
    __device__ __forceinline__ void issue_S(typename Kernel::S_accumulators &S, const typename Kernel::Q_fragments &Q_frag,
                                            int stage, Width) const {
        constexpr int W = Width::value;
#pragma unroll
        for (int i = W / 2; i < B_c / 2; ++i)
            flat(S)[i] = -INFINITY;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < d_head / Kernel::wgmma_k; ++kk) {
            const uint64_t K_slice = K_desc + stage * stage_step + k_slice(kk, Kernel::KV_col_block_bytes);
            if constexpr (Kernel::Q_in_registers)
                Wgmma<W>::template rs<value_t, /*B_MN_MAJOR=*/false>(leading<W / 2>(flat(S)), Q_frag.r[0][kk], K_slice,
                                                                           kk > 0);
            else
                Wgmma<W>::template ss<value_t>(leading<W / 2>(flat(S)), Q_desc + k_slice(kk, Kernel::Q_col_block_bytes),
                                               K_slice, kk > 0);
        }
    }
    // P's k-slice kk multiplies V's keys wgmma_k kk .. wgmma_k (kk + 1) - 1: rows of V's tile, or
    // 32 bytes of each row of its transposed tile (in the column block of those keys); the slices
    // past `width` keys hold only masked (zero) probabilities.
    template <typename Width>
    __device__ __forceinline__ void issue_PV(const typename Kernel::P_fragments &P, int stage, Width) {
        static_assert(Width::value % Kernel::wgmma_k == 0, "P V runs over whole k-slices");
#pragma unroll
        for (int kk = 0; kk < Width::value / Kernel::wgmma_k; ++kk) {
            const uint64_t slice = Kernel::fp8 ? k_slice<typename Kernel::Vt_Swizzle>(kk, Kernel::Vt_col_block_bytes)
                                               : static_cast<uint64_t>((kk * WGMMA_K * Swizzle::bytes) >> 4);
            Wgmma<d_head>::template rs<value_t>(flat(O_acc), P.r[0][kk], V_desc + stage * PV_stage_step + slice, 1);
        }
    }
    // The probabilities as the A operand of P V.
    __device__ __forceinline__ static void to_P(typename Kernel::P_fragments &P, const typename Kernel::S_accumulators &S) {
        if constexpr (Kernel::fp8)
            probabilities_to_e4m3(P, S);
        else
            accumulators_to_A<value_t>(P, S);
    }

    // The keys of KV tile `tile` that this warpgroup's rows before seqlen_q may see, at least 1:
    // up to its last such row's diagonal (plus the window's right side) and the end of the keys.
    __device__ __forceinline__ int visible_keys(int tile) const {
        int keys = B_c;
        if constexpr (MASKED_TAILS)
            keys = min(keys, params.seqlen_k - tile * B_c);
        if constexpr (MASK != MaskKind::NONE)
            keys = min(keys, diagonal_key(params, last_row) + params.mask.window_right - tile * B_c + 1);
        return max(keys, 1);
    }
    // process(width) with a masked tile's visible keys, or the full width. A branch per width
    // holds all the work on the tile's S: where branches that wrote S differently join while
    // products are in flight, ptxas makes them wait.
    template <typename Masked, typename Process>
    __device__ __forceinline__ void at_width(int tile, Masked, Process &&process) const {
        if constexpr (Masked::value)
            with_key_width<B_c, Kernel::wgmma_k>(visible_keys(tile), process);
        else
            process(FullWidth{});
    }
    // Once the work tile's last S = Q K^T that reads Q in shared memory is done (with Q in
    // registers, its first), a persistent block's next Q may load.
    __device__ __forceinline__ void release_Q_after(int tile) const {
        if (Kernel::persistent && tile == (Kernel::Q_in_registers ? tiles.begin : tiles.end - 1))
            consumer.release(smem.Q_empty(consumer.wg));
    }
    // A tile of `width` keys: the columns past it are -infinity already (the score
    // modifications leave them alone), and without a mask (the end of the keys alone) a masked
    // tile of full width has its first half all attended.
    template <typename Masked, typename Width>
    __device__ __forceinline__ void modify_and_mask(typename Kernel::S_accumulators &S, int tile, Masked, Width) const {
        constexpr int W = Width::value;
        if constexpr (SCORE_MODS)
            score_mods.template apply<W>(S, params, Q_first_row + consumer.warp_first_row, tile * B_c);
        if constexpr (Masked::value)
            apply_mask<MASK, MASKED_TAILS, MASK == MaskKind::NONE && W == B_c ? half_key_width<B_c, Kernel::wgmma_k>() : 0, W>(
                S, params, Q_first_row + consumer.warp_first_row, tile * B_c);
    }

    // The first tile: S, its softmax (which only sets the maxima), P.
    template <typename Masked, typename Width>
    __device__ __forceinline__ void first_tile(const typename Kernel::Q_fragments &Q_frag, typename Kernel::P_fragments &P,
                                               Masked masked, Width width) {
        PipelineState<stages> &current = consumer.current;
        typename Kernel::S_accumulators S;
        mbarrier_wait(smem.K_full(current.stage), current.phase);
        consumer.in_turn([&] {
            issue_S(S, Q_frag, current.stage, width);
            wgmma_commit();
        });
        wgmma_wait<0>();
        fence_registers(flat(S));
        consumer.release_KV(smem.K_empty(current.stage));
        release_Q_after(tiles.begin);
        modify_and_mask(S, tiles.begin, masked, width);
        softmax.template exponentiate<true>(S, score_scale, [](int, int, float) {});
        to_P(P, S);
        previous = current;
        current.advance();
    }

    // A later tile: S of this tile and P V of the previous one are issued together.
    template <typename Masked, typename Width>
    __device__ __forceinline__ void later_tile(const typename Kernel::Q_fragments &Q_frag, typename Kernel::P_fragments &P,
                                               int tile, Masked masked, Width width) {
        PipelineState<stages> &current = consumer.current;
        typename Kernel::S_accumulators S;
        mbarrier_wait(smem.K_full(current.stage), current.phase);
        mbarrier_wait(smem.PV_full(previous.stage), previous.phase);
        consumer.in_turn([&] {
            fence_registers(flat(O_acc));
            issue_S(S, Q_frag, current.stage, width);
            wgmma_commit();
            apply_O_rescale();
            issue_PV(P, previous.stage, FullWidth{});
            wgmma_commit();
        });

        if constexpr (Kernel::intra_wg_overlap) {
            wgmma_wait<1>(); // S has landed; P V may still run
            fence_registers(flat(S));
            consumer.release_KV(smem.K_empty(current.stage));
            release_Q_after(tile);
            modify_and_mask(S, tile, masked, width);
            // The probabilities are computed here, while P V runs.
            if constexpr (Kernel::deferred_O_rescale) {
                O_rescale_pending = softmax.template exponentiate<false>(
                    S, score_scale, [&](int, int h, float factor) { O_rescale[h] = factor; });
                fence_registers(flat(S));
                wgmma_wait<0>();
            } else {
                float rescale[2];
                const bool rescaled = softmax.template exponentiate<false>(
                    S, score_scale, [&](int, int h, float factor) { rescale[h] = factor; });
                // The compiler schedules the wait below as early as its basic block allows, so it
                // sits in branches of their own; wgmma waits must be reached by the whole
                // warpgroup alike, so the branch is on whether any of its warps rescales.
                fence_registers(flat(S));
                if (named_barrier_any(consumer.vote_barrier, WARPGROUP_THREADS, rescaled)) {
                    wgmma_wait<0>();
                    fence_registers(flat(O_acc));
                    if (rescaled)
#pragma unroll
                        for (int h = 0; h < 2; ++h)
                            Softmax::rescale_row(O_acc.r[0], h, rescale[h]);
                } else {
                    wgmma_wait<0>();
                }
            }
            fence_registers(flat(O_acc));
            fence_registers(flat(P));
            consumer.release_KV(smem.PV_empty(previous.stage));
        } else {
            wgmma_wait<0>();
            fence_registers(flat(S));
            fence_registers(flat(O_acc));
            consumer.release_KV(smem.K_empty(current.stage));
            consumer.release_KV(smem.PV_empty(previous.stage));
            release_Q_after(tile);
            modify_and_mask(S, tile, masked, width);
            softmax.template update<false>(S, O_acc, score_scale);
        }
        if (loads && tile - 1 + stages < tiles.end)
            loader.load_KV(tile - 1 + stages, tile - 1 + stages - tiles.begin);
        to_P(P, S);
        previous = current;
        current.advance();
    }

    // With deferred_O_rescale, the rescaling the last softmax left, before the P V that adds to O;
    // the fence orders it before that product.
    __device__ __forceinline__ void apply_O_rescale() {
        if constexpr (Kernel::deferred_O_rescale) {
            if (O_rescale_pending)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    Softmax::rescale_row(O_acc.r[0], h, O_rescale[h]);
            O_rescale_pending = false;
            fence_registers(flat(O_acc));
            wgmma_fence();
        }
    }

    // The last tile's P V, over its visible keys if it is masked.
    __device__ __forceinline__ void last_PV(typename Kernel::P_fragments &P) {
        mbarrier_wait(smem.PV_full(previous.stage), previous.phase);
        fence_registers(flat(O_acc));
        apply_O_rescale();
        // Fence, commit and wait in each branch: ptxas wants them in the products' own block.
        const auto issue_last_PV = [&](auto width) {
            wgmma_fence();
            issue_PV(P, previous.stage, width);
            wgmma_commit();
            wgmma_wait<0>();
            fence_registers(flat(O_acc));
        };
        if (tiles.is_masked(tiles.end - 1))
            with_key_width<B_c, Kernel::wgmma_k>(visible_keys(tiles.end - 1), issue_last_PV);
        else
            issue_last_PV(FullWidth{});
        fence_registers(flat(P));
        consumer.release_KV(smem.PV_empty(previous.stage));
    }
};

} // namespace flash::sm90
