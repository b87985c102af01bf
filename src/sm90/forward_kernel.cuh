// The Hopper family's forward kernel (sm_90a). A thread block computes O for B_r query rows of
// one (batch, head) at a time (a work tile): each consumer warpgroup owns 64 of the rows and walks
// over the work tile's KV tiles, computing S = Q K^T with both operands in shared memory and O += P V with P from
// registers (wgmma), and the online softmax in between. Q, K and V arrive by TMA into swizzled
// tiles, through a pipeline of `stages` K/V buffers guarded by mbarriers; O leaves
// through shared memory by TMA.
//
// The configuration's knobs:
// - warp_specialized: one more warpgroup only issues the TMA loads, running ahead of the consumers
//   as far as the stages allow, and hands most of its registers to them (setmaxnreg). Without it,
//   the consumers' first thread issues each load once every consumer has released the stage.
// - pingpong: the consumer warpgroups take turns issuing their products (named barriers, round
//   robin), so one warpgroup's softmax runs while the others' products occupy the tensor cores.
// - intra_wg_overlap: a warpgroup computes the softmax of tile j while its product O += P V of
//   tile j - 1, issued together with S = Q K^T of tile j, is still running; the rescaling of O
//   waits for that product. Without it, the warpgroup waits for both products first.
// - persistent: one block per SM takes work tiles from a global counter as it frees up, so the
//   next work tile's Q, K and V load while this one's last products run and its O is stored, and
//   under a mask the uneven tiles balance across the SMs. A warpgroup's next Q loads as soon as
//   its last S = Q K^T is done. Without it, one block per work tile.
// - Q_in_registers: each warp reads its 16 rows of Q into registers once per work tile (ldmatrix),
//   and S = Q K^T takes them from there: the products read only K and V from shared memory (a
//   fifth less at d_head 128), for d_head / 4 more registers per thread. A persistent block's next
//   Q may then load once the first S = Q K^T is done.
// - e4m3 inputs (dtype E4M3): the products run on 8-bit operands with float32 accumulators; the
//   producer warpgroup's other three warps transpose each V tile in shared memory for P V
//   (fp8_operands.cuh), the inputs' dequantisation factors scale the scores and the output, and O
//   is 16-bit.
// - multicast: two blocks, a cluster, take two consecutive query blocks of one (batch, head) and
//   visit the same KV tiles; each loads half of every tile's rows into both (TMA multicast), so K
//   and V leave L2 once per pair. A stage is free once the consumers of both blocks have released
//   it. Under a mask the pair loads every tile either block visits, and a block passes over those
//   it does not compute on. A persistent pair's first block asks the work counter for both.
// - V_transposed_copy (e4m3, dense calls): a copy kernel first writes V transposed, in the key order
//   the transposing warps would write (transposed_v_copy.cuh), and TMA loads its tiles as P V's
//   operand: no transposing warps and no second V tile per stage, for one read and one write of V
//   through memory per call.
#pragma once

#include <cstdint>

#include "common/common.h"
#include "common/forward_params.h"
#include "common/masking.cuh"
#include "common/online_softmax.cuh"
#include "common/problem_variant.h"
#include "sm90/consumer_warpgroup.cuh"
#include "sm90/epilogue.cuh"
#include "sm90/fp8_operands.cuh"
#include "sm90/kernel_params.h"
#include "sm90/mainloop.cuh"
#include "sm90/sequence_tensor_maps.cuh"
#include "sm90/shared_tiles.cuh"
#include "sm90/tile_loader.cuh"
#include "sm90/tile_scheduler.cuh"
#include "sm90/tma.cuh"
#include "sm90/traits.cuh"
#include "sm90/warpgroup.cuh"

namespace flash::sm90 {

// A consumer warpgroup's share of the work tile numbered `index`: the KV tiles its block loads
// for it, its main loop over those it computes on, and its epilogue.
template <typename Kernel, MaskKind MASK, bool MASKED_TAILS, bool SCORE_MODS, bool VARLEN, typename Scheduler>
__device__ __forceinline__ void consume_work_tile(const KernelParams &kp, ConsumerWarpgroup<Kernel> &consumer,
                                                  const Scheduler &scheduler, int index, int group_size, uint32_t rank) {
    using Tiles = KVTileRange<Kernel::B_r, Kernel::B_c, MASK, MASKED_TAILS, VARLEN>;
    using Loader = TileLoader<Kernel, Scheduler, VARLEN>;
    constexpr int cluster = Kernel::cluster_size;
    const SharedTiles<Kernel> &smem = consumer.smem;
    const int wg = consumer.wg;

    const auto [work, sequence] = locate_work<VARLEN>(kp.params, scheduler, index);
    const ForwardParams &params = sequence.params;
    const int Q_first_row = work.Q_block * Kernel::B_r;
    const int head = work.head;
    const int batch = work.batch;
    const Tiles tiles(params, Q_first_row);
    const BoxCoordinates Q_boxes = q_boxes(sequence);
    // Without warp specialization (one work tile per block) the first consumer thread also
    // loads: Q and the first round now, each later tile once its stage has been released.
    const bool loads = !Kernel::warp_specialized && threadIdx.x == 0;
    const KVTensorMaps kv_maps =
        loads ? KVTensorMapBinder<Kernel, VARLEN>{kp}.bind(sequence, tiles.begin, tiles.end) : call_tensor_maps(kp);
    const Loader loader{kp, smem, head, head / group_size, Q_boxes, kv_boxes(sequence), kv_pages(sequence), kv_maps, rank};
    if (loads && !tiles.empty()) {
        loader.load_Q(Q_first_row, 0, index, true);
        for (int tile = tiles.begin; tile < min(tiles.begin + Kernel::stages, tiles.end); ++tile)
            loader.load_KV(tile, tile - tiles.begin);
    }
    // Of the KV tiles this block loads, those it computes on: none without a query block.
    const auto [first_loaded, end_loaded] = loaded_tiles<cluster>(params, work, tiles, Kernel::B_r);
    const bool computes = work.Q_block < work.Q_blocks && !tiles.empty();
    const int own_first = computes ? tiles.begin : end_loaded;
    const int own_end = computes ? tiles.end : end_loaded;
    const int passed_after = end_loaded - own_end;
    if constexpr (cluster > 1)
        consumer.pass_tiles(own_first - first_loaded, WithoutTurns{});

    // A warpgroup whose rows all lie past seqlen_q (in a last query block that ends within an
    // earlier warpgroup's rows) computes and stores nothing, but the block's pipeline still
    // counts on its warps.
    if ((MASKED_TAILS || cluster > 1) && Q_first_row + wg * WGMMA_M >= params.seqlen_q) {
        if constexpr (Kernel::persistent)
            consumer.release(smem.Q_empty(wg));
        else
            mbarrier_wait(smem.Q_full(wg), 0); // its Q has landed before the block exits
        consumer.pass_tiles(own_end - own_first, TakingTurns{});
        if constexpr (cluster > 1)
            consumer.pass_tiles(passed_after, WithoutTurns{});
        return;
    }

    using Mainloop = MainLoop<Kernel, Loader, MASK, MASKED_TAILS, SCORE_MODS, VARLEN>;
    typename Mainloop::Softmax softmax;
    softmax.init();
    typename Kernel::O_accumulators O_acc;
    O_acc.zero();
    // FP8 inputs' dequantisation: q's and k's factors scale the scores, v's the output.
    const int kv_head = head / group_size;
    const float qk_descale = Kernel::fp8 ? descale_at(params.descales.q, batch, kv_head) * descale_at(params.descales.k, batch, kv_head)
                                         : 1.0f;
    const ScoreModsOf<SCORE_MODS> score_mods(params, batch, head, params.softmax_scale * qk_descale);

    if (!tiles.empty())
        Mainloop(consumer, params, tiles, loader, loads, Q_first_row, score_mods, softmax, O_acc).run();
    else if constexpr (Kernel::persistent)
        consumer.release(smem.Q_empty(wg)); // nothing to compute: the next Q may load now
    if constexpr (cluster > 1)
        consumer.pass_tiles(passed_after, WithoutTurns{});

    const float O_descale = Kernel::fp8 ? descale_at(params.descales.v, batch, kv_head) : 1.0f;
    write_outputs<Kernel, VARLEN>(kp, params, Q_boxes, consumer, softmax, O_acc, score_mods.post_scale, O_descale,
                                  Q_first_row, head, batch);
}

// The problem variant: MASK and MASKED_TAILS decide which tiles the block visits and which of
// them are masked element by element (KVTileRange); the unmasked tiles in between run the code of
// an unmasked problem. SCORE_MODS applies softcap and ALiBi to every tile's scores. With VARLEN
// each sequence has lengths of its own (Sequence): the work tiles are those the call's plan lists
// (varlen_work_plan.cuh; the kernel may start before the plan is written and waits for it; a
// single-pass block past the plan's tiles exits at once), K and V load through tensor maps whose
// bounds stop at the sequence's end (sequence_tensor_maps.cuh), or from a paged cache a box per
// page (tile_loader.cuh), and a box of O that would reach past it is stored row by row. (Separate
// template arguments, as in the SM80 family: nvcc's host stubs cannot spell an all-zero class-type
// template argument.) Compiled for sm_90a only; elsewhere the body is empty and the binding never
// launches it. KV_E4M3 (an FP8 cache beside 16-bit queries) is the SM80 family's variant alone: the
// generator never compiles it here.
template <typename Kernel, MaskKind MASK, bool MASKED_TAILS, bool SCORE_MODS, bool VARLEN, bool KV_E4M3>
__global__ void __launch_bounds__(Kernel::n_threads, 1) hopper_forward_kernel(const __grid_constant__ KernelParams kp) {
    static_assert(!KV_E4M3, "the Hopper family reads q, k and v of one dtype; e4m3 caches with 16-bit queries run on "
                            "the SM80 family's decoding configurations");
    static_assert(!(Kernel::V_transposed_copy && VARLEN), "V's transposed copy is laid out for dense calls alone");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using Scheduler = typename Kernel::template TileScheduler<MASK, VARLEN>;
    constexpr int cluster = Kernel::cluster_size;
    const ForwardParams &params = kp.params;
    if constexpr (VARLEN)
        wait_for_planned_work(); // the kernel may have started while its plan was being written
    if constexpr (VARLEN && !Kernel::persistent) {
        // The grid covers as many work tiles as the call may have; its plan may list fewer.
        const Scheduler own(params, 0);
        if (own.first() >= own.end())
            return;
    }

    extern __shared__ uint8_t smem_raw[];
    const SharedTiles<Kernel> smem(smem_raw);
    if (threadIdx.x == 0)
        smem.init_barriers();
    // The other blocks of a cluster arrive on this one's barriers and copy into its tiles.
    if constexpr (cluster > 1)
        cluster_sync();
    else
        __syncthreads();
    const uint32_t rank = cluster > 1 ? cluster_cta_rank() : 0;
    const Scheduler scheduler(params, rank);
    const int group_size = params.heads_q / params.heads_kv;

    // Warp-uniform (a shuffle says so to the compiler), so what derives from it lives in uniform registers.
    const int warpgroup = __shfl_sync(FULL_WARP_MASK, threadIdx.x / WARPGROUP_THREADS, 0);
    if constexpr (Kernel::warp_specialized) {
        if (warpgroup == 0) {
            if constexpr (Kernel::moves_registers)
                release_registers<Kernel::template producer_registers<VARLEN>>();
            if (threadIdx.x == 0)
                produce<Kernel, KVTileRange<Kernel::B_r, Kernel::B_c, MASK, MASKED_TAILS, VARLEN>, VARLEN>(
                    kp, smem, scheduler, group_size, rank);
            if constexpr (Kernel::transposes_V)
                if (threadIdx.x >= WARP_SIZE)
                    VTransposer<Kernel>{smem}.run();
            if constexpr (cluster > 1)
                cluster_sync();
            return;
        }
        if constexpr (Kernel::moves_registers)
            claim_registers<Kernel::template consumer_registers<VARLEN>>();
    }

    ConsumerWarpgroup<Kernel> consumer(smem, warpgroup);
    consumer.start_turns();
    // The n-th work tile: the block's own, then (persistent) those the producer hands out, until it
    // hands out the end.
    for (int nth = 0, index = scheduler.first();; ++nth) {
        if constexpr (Kernel::persistent) {
            mbarrier_wait(smem.Q_full(consumer.wg), nth & 1);
            index = Scheduler::handed_off(smem.work_slot(consumer.wg));
            if (index >= scheduler.end())
                break;
        }
        consume_work_tile<Kernel, MASK, MASKED_TAILS, SCORE_MODS, VARLEN>(kp, consumer, scheduler, index, group_size, rank);
        if constexpr (!Kernel::persistent)
            break;
    }
    consumer.finish_turns();
    if (Kernel::persistent && threadIdx.x % WARPGROUP_THREADS == 0)
        tma_store_wait_read(); // the last store has read shared memory before the block exits
    if constexpr (cluster > 1)
        cluster_sync(); // the other blocks' arrivals on this one's barriers are done
#endif
}

} // namespace flash::sm90
