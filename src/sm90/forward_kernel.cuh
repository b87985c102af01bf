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
// - multicast: two blocks, a cluster, take two consecutive query blocks of one (batch, head) and
//   visit the same KV tiles; each loads half of every tile's rows into both (TMA multicast), so K
//   and V leave L2 once per pair. A stage is free once the consumers of both blocks have released
//   it. Under a mask the pair loads every tile either block visits, and a block passes over those
//   it does not compute on. Persistent pairs take the work tiles in a fixed rotation.
#pragma once

#include <climits>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/common.h"
#include "common/forward_params.h"
#include "common/fragments.cuh"
#include "common/masking.cuh"
#include "common/online_softmax.cuh"
#include "common/problem_variant.h"
#include "common/ptx.cuh"
#include "common/type_utils.cuh"
#include "sm90/kernel_params.h"
#include "sm90/tma.cuh"
#include "sm90/traits.cuh"
#include "sm90/warpgroup.cuh"
#include "sm90/wgmma.cuh"

namespace flash::sm90 {

// The block's shared memory (traits.cuh lays it out), from the dynamic allocation rounded up to
// TILE_ALIGNMENT_BYTES.
template <typename Kernel>
struct SharedTiles {
    uint8_t *base;

    __device__ __forceinline__ explicit SharedTiles(uint8_t *raw) {
        const uint32_t misalignment = ptx::shared_address(raw) % TILE_ALIGNMENT_BYTES;
        base = raw + (misalignment ? TILE_ALIGNMENT_BYTES - misalignment : 0);
    }

    __device__ __forceinline__ uint8_t *Q(int warpgroup) const { return base + warpgroup * Kernel::wg_Q_bytes; }
    // Where a warpgroup's O goes out: its own block in a persistent block, else its Q block.
    __device__ __forceinline__ uint8_t *O(int warpgroup) const {
        return base + (Kernel::persistent ? Kernel::O_offset : 0) + warpgroup * Kernel::wg_Q_bytes;
    }
    __device__ __forceinline__ uint8_t *K(int stage) const { return base + Kernel::K_offset + stage * Kernel::KV_tile_bytes; }
    __device__ __forceinline__ uint8_t *V(int stage) const { return base + Kernel::V_offset + stage * Kernel::KV_tile_bytes; }

    __device__ __forceinline__ uint64_t *barrier(int i) const {
        return reinterpret_cast<uint64_t *>(base + Kernel::barriers_offset) + i;
    }
    __device__ __forceinline__ uint64_t *Q_full(int warpgroup) const { return barrier(2 * warpgroup); }
    __device__ __forceinline__ uint64_t *Q_empty(int warpgroup) const { return barrier(2 * warpgroup + 1); }
    __device__ __forceinline__ uint64_t *K_full(int stage) const { return barrier(KV_barriers + 4 * stage); }
    __device__ __forceinline__ uint64_t *K_empty(int stage) const { return barrier(KV_barriers + 1 + 4 * stage); }
    __device__ __forceinline__ uint64_t *V_full(int stage) const { return barrier(KV_barriers + 2 + 4 * stage); }
    __device__ __forceinline__ uint64_t *V_empty(int stage) const { return barrier(KV_barriers + 3 + 4 * stage); }
    // Where a persistent block's producer leaves the index of a consumer warpgroup's next work tile,
    // before its arrival on that warpgroup's Q full barrier (whose waiters then read it). The
    // mbarrier orders the write and the reads, but compute-sanitizer's racecheck does not model
    // mbarriers; both sides use shared-memory atomics, which it does not count as hazards, so it
    // checks the rest of the kernel cleanly.
    __device__ __forceinline__ int *work_slot(int warpgroup) const {
        return reinterpret_cast<int *>(barrier(Kernel::n_barriers + warpgroup));
    }

    // One thread, before any other touches the barriers. A full barrier completes on its loader's
    // arrival plus the bytes; an empty one when every consumer warp of its readers has released it.
    __device__ __forceinline__ void init_barriers() const {
#pragma unroll
        for (int wg = 0; wg < Kernel::consumer_warpgroups; ++wg) {
            mbarrier_init(Q_full(wg), 1);
            mbarrier_init(Q_empty(wg), Kernel::consumer_warps / Kernel::consumer_warpgroups);
        }
#pragma unroll
        for (int stage = 0; stage < Kernel::stages; ++stage) {
            mbarrier_init(K_full(stage), 1);
            mbarrier_init(K_empty(stage), Kernel::consumer_warps * Kernel::cluster_size);
            mbarrier_init(V_full(stage), 1);
            mbarrier_init(V_empty(stage), Kernel::consumer_warps * Kernel::cluster_size);
        }
        mbarrier_init_fence();
    }

  private:
    static constexpr int KV_barriers = 2 * Kernel::consumer_warpgroups;
};

// Issues one work tile's TMA loads; run by a single thread. The KV tile at position n of the
// block's stream of KV tiles goes to stage n % stages, in round n / stages, once the consumers
// have released that stage's previous round; a warpgroup's Q block for the block's n-th work tile,
// once that warpgroup has released the last one.
template <typename Kernel>
struct TileLoader {
    const KernelParams &kp;
    const SharedTiles<Kernel> &smem;
    int head;
    int kv_head;
    int batch;
    uint32_t rank; // in the cluster

    // Q of the n-th work tile, numbered `index`; a persistent block's producer also tells each
    // warpgroup that index. A work tile whose rows attend no key loads no Q.
    __device__ __forceinline__ void load_Q(int first_row, int n, int index, bool loads) const {
#pragma unroll
        for (int wg = 0; wg < Kernel::consumer_warpgroups; ++wg) {
            mbarrier_wait(smem.Q_empty(wg), (n & 1) ^ 1);
            if constexpr (Kernel::persistent)
                atomicExch(smem.work_slot(wg), index); // the arrival below releases it to the waiters
            if (!loads) {
                mbarrier_arrive(smem.Q_full(wg));
                continue;
            }
            mbarrier_arrive_expect_bytes(smem.Q_full(wg), Kernel::wg_Q_bytes);
#pragma unroll
            for (int c = 0; c < Kernel::col_blocks; ++c)
                tma_load_4d(smem.Q(wg) + c * Kernel::Q_col_block_bytes, &kp.q, smem.Q_full(wg),
                            c * Kernel::Swizzle::cols, first_row + wg * WGMMA_M, head, batch);
        }
    }

    __device__ __forceinline__ void load_KV(int tile, int n) const {
        const int round = n / Kernel::stages;
        const int stage = n % Kernel::stages;
        const uint32_t released_parity = (round & 1) ^ 1;
        load_tile(&kp.k, smem.K(stage), smem.K_empty(stage), smem.K_full(stage), released_parity, tile);
        load_tile(&kp.v, smem.V(stage), smem.V_empty(stage), smem.V_full(stage), released_parity, tile);
    }

  private:
    __device__ __forceinline__ void load_tile(const CUtensorMap *map, uint8_t *dst, uint64_t *empty, uint64_t *full,
                                              uint32_t released_parity, int tile) const {
        // With multicast this block's slice goes to both blocks of the cluster, so the empty
        // barrier counts both blocks' consumers, and each block's full barrier both slices' bytes.
        mbarrier_wait(empty, released_parity);
        mbarrier_arrive_expect_bytes(full, Kernel::KV_tile_bytes);
#pragma unroll
        for (int c = 0; c < Kernel::col_blocks; ++c) {
            uint8_t *const slice = dst + c * Kernel::KV_col_block_bytes + rank * Kernel::KV_slice_bytes;
            const int first_row = tile * Kernel::B_c + rank * Kernel::KV_slice_rows;
            if constexpr (Kernel::multicast)
                tma_load_4d_multicast(slice, map, full, CLUSTER_MASK, c * Kernel::Swizzle::cols, first_row, kv_head, batch);
            else
                tma_load_4d(slice, map, full, c * Kernel::Swizzle::cols, first_row, kv_head, batch);
        }
    }

    static constexpr uint16_t CLUSTER_MASK = (1u << Kernel::cluster_size) - 1;
};

// A block's work: B_r query rows of one (batch, head). Work tiles are numbered with the query
// block fastest, so the blocks running at once share their heads' K and V in L2; under a mask the
// last query blocks, whose rows see the most keys, come first, so a persistent block, which takes
// whichever work tile is next when it is free, ends on short ones. The blocks of a cluster take
// `cluster` consecutive query blocks of one (batch, head) together, as one work tile numbered once;
// in the last such group a block may have no query block (Q_block >= Q_blocks): it only loads its
// share of K and V for the others.
struct WorkTile {
    int Q_block;
    int first_Q_block; // the cluster's first and last existing query blocks
    int last_Q_block;
    int head;
    int batch;

    template <MaskKind MASK, int cluster>
    __device__ __forceinline__ static WorkTile of(int index, int Q_blocks, int heads, int rank) {
        const int Q_groups = (Q_blocks + cluster - 1) / cluster;
        const int group = index % Q_groups;
        const int head_index = index / Q_groups;
        const int first = (MASK == MaskKind::NONE ? group : Q_groups - 1 - group) * cluster;
        return {first + rank, first, min(first + cluster - 1, Q_blocks - 1), head_index % heads, head_index / heads};
    }
};

// The KV tiles a work tile's cluster loads, [begin, end): every tile some block of it visits. A
// block's own tiles (KVTileRange) lie within; a block that has none, or no query block, passes them all.
template <typename Tiles>
struct ClusterTileRange {
    int begin = INT_MAX;
    int end = 0;

    __device__ __forceinline__ ClusterTileRange(const ForwardParams &params, const WorkTile &work, int B_r) {
        for (int Q_block = work.first_Q_block; Q_block <= work.last_Q_block; ++Q_block) {
            const Tiles tiles(params, Q_block * B_r);
            if (tiles.begin < tiles.end) {
                begin = min(begin, tiles.begin);
                end = max(end, tiles.end);
            }
        }
        begin = min(begin, end);
    }
};

// Where a consumer is in the K/V pipeline: the stage of its current tile and the parity of that
// stage's current round.
template <int stages>
struct PipelineState {
    int stage = 0;
    uint32_t phase = 0;

    __device__ __forceinline__ void advance() {
        if (++stage == stages) {
            stage = 0;
            phase ^= 1;
        }
    }
};

// A masked tile's products stop after the last key a warpgroup can see (the diagonal of its last
// row, or the end of the keys) instead of computing what the mask drops, at one of two widths: half
// the tile (a multiple of WGMMA_K) or all of it. Half a tile is what the first warpgroup of a
// causal mask's diagonal tile sees, with 128-row work tiles and 128-key tiles. Each width compiles
// the tile's whole softmax once more, and finer steps cost more than they save (measured: P V in
// steps of 16 keys made seq 1000 slower).
template <int B_c>
constexpr int half_key_width() {
    return (B_c / 2 + WGMMA_K - 1) / WGMMA_K * WGMMA_K;
}
template <int B_c, typename Use>
__device__ __forceinline__ void with_key_width(int keys, Use &&use) {
    constexpr int half = half_key_width<B_c>();
    if (keys <= half)
        use(std::integral_constant<int, half>{});
    else
        use(std::integral_constant<int, B_c>{});
}

// The problem variant: MASK and MASKED_TAILS decide which tiles the block visits and which of
// them are masked element by element (KVTileRange); the unmasked tiles in between run the code of
// an unmasked problem. SCORE_MODS applies softcap and ALiBi to every tile's scores. (Separate
// template arguments, as in the SM80 family: nvcc's host stubs cannot spell an all-zero
// class-type template argument.) Compiled for sm_90a only; elsewhere the body is empty and the
// binding never launches it.
template <typename Kernel, MaskKind MASK, bool MASKED_TAILS, bool SCORE_MODS>
__global__ void __launch_bounds__(Kernel::n_threads, 1) hopper_forward_kernel(const __grid_constant__ KernelParams kp) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using value_t = typename Kernel::value_t;
    constexpr int B_r = Kernel::B_r;
    constexpr int B_c = Kernel::B_c;
    constexpr int d_head = Kernel::d_head;
    constexpr int stages = Kernel::stages;
    constexpr int n_consumers = Kernel::consumer_warpgroups;
    constexpr int cluster = Kernel::cluster_size;
    using Swizzle = typename Kernel::Swizzle;
    const ForwardParams &params = kp.params;

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

    const int Q_blocks = (params.seqlen_q + B_r - 1) / B_r;
    const int n_work_tiles = (Q_blocks + cluster - 1) / cluster * params.heads_q * params.batch;
    const int first_work_tile = blockIdx.x / cluster; // a cluster's blocks are consecutive
    const int group_size = params.heads_q / params.heads_kv;
    const auto work_tile = [&](int index) {
        return WorkTile::of<MASK, cluster>(index, Q_blocks, params.heads_q, rank);
    };
    using Tiles = KVTileRange<B_r, B_c, MASK, MASKED_TAILS>;
    // The KV tiles this block loads (its share of them, in a cluster): its own, or its cluster's.
    const auto loaded_tiles = [&](const WorkTile &work, const Tiles &tiles) {
        if constexpr (cluster > 1) {
            const ClusterTileRange<Tiles> range(params, work, B_r);
            return std::pair<int, int>{range.begin, range.end};
        } else {
            return std::pair<int, int>{tiles.begin, tiles.end};
        }
    };

    // Warp-uniform (a shuffle says so to the compiler), so what derives from it lives in uniform registers.
    const int warpgroup = __shfl_sync(FULL_WARP_MASK, threadIdx.x / WARPGROUP_THREADS, 0);
    if constexpr (Kernel::warp_specialized) {
        if (warpgroup == 0) {
            if constexpr (Kernel::moves_registers)
                release_registers<Kernel::producer_registers>();
            if (threadIdx.x == 0) {
                // A block's first work tile is its own; a persistent block asks the work counter for
                // each next one as it starts loading this one, so the tiles go to the blocks that
                // are free first (under a mask, the longest first).
                int n = 0;        // work tiles loaded so far
                int KV_loads = 0; // KV tiles loaded so far: the position in the pipeline
                for (int index = first_work_tile; index < n_work_tiles; ++n) {
                    // The blocks of a cluster must take the same work tiles, so a persistent
                    // cluster takes every (gridDim.x / cluster)-th in turn rather than asking the counter.
                    const int next = !Kernel::persistent ? n_work_tiles
                                     : cluster > 1       ? index + gridDim.x / cluster
                                                         : gridDim.x + atomicAdd(params.work_counter, 1);
                    const WorkTile work = work_tile(index);
                    const Tiles tiles(params, work.Q_block * B_r);
                    const auto [first_tile, end_tile] = loaded_tiles(work, tiles);
                    const TileLoader<Kernel> loader{kp, smem, work.head, work.head / group_size, work.batch, rank};
                    loader.load_Q(work.Q_block * B_r, n, index, !tiles.empty() && work.Q_block < Q_blocks);
                    for (int tile = first_tile; tile < end_tile; ++tile)
                        loader.load_KV(tile, KV_loads++);
                    index = next;
                }
                // The end, as a work tile past the last that loads nothing.
                if constexpr (Kernel::persistent)
                    TileLoader<Kernel>{kp, smem, 0, 0, 0, rank}.load_Q(0, n, n_work_tiles, false);
            }
            if constexpr (cluster > 1)
                cluster_sync();
            return;
        }
        if constexpr (Kernel::moves_registers)
            claim_registers<Kernel::consumer_registers>();
    }

    // This thread as a consumer: warpgroup wg's 64 rows, warp warp_in_wg's 16 of them.
    const int wg = Kernel::warp_specialized ? warpgroup - 1 : warpgroup;
    const int lane = threadIdx.x % WARP_SIZE;
    const int warp_first_row = wg * WGMMA_M + (threadIdx.x % WARPGROUP_THREADS) / WARP_SIZE * MMA_M;
    constexpr bool rows_may_be_empty = MASK != MaskKind::NONE;
    // Named barriers of this warpgroup's threads alone (ping-pong's turns take 1 .. n_consumers): one
    // for the epilogue, one for the vote on rescaling (a reduction may not share a barrier with
    // plain synchronization).
    const int warpgroup_barrier = 1 + n_consumers + wg;
    const int vote_barrier = 1 + 2 * n_consumers + wg;
    PipelineState<stages> current; // of the next KV tile, carried from one work tile to the next
    // A warp's release of a buffer it has read.
    const auto release = [&](uint64_t *empty) {
        if (lane == 0)
            mbarrier_arrive(empty);
    };
    // A K or V stage goes back to every block of the cluster, whose loads write into this one's.
    const auto release_KV = [&](uint64_t *empty) {
        if constexpr (cluster > 1) {
            if (lane == 0)
#pragma unroll
                for (int r = 0; r < cluster; ++r)
                    mbarrier_arrive_cluster(empty, r);
        } else {
            release(empty);
        }
    };
    // Pingpong: warpgroup wg issues its products after warpgroup wg - 1 (round robin) and then lets
    // warpgroup wg + 1 go, from a work tile's first S = Q K^T on. The turns run on across work
    // tiles, so a warpgroup's first turn in the next work tile waits for the others' last products,
    // not for their epilogues. The warpgroups of a block share its work tiles and take one turn per
    // KV tile, so as many turns each: the last warpgroup's arrival before the first turn leaves one
    // arrival over at the end, which the first warpgroup takes on its way out.
    constexpr int pair_threads = 2 * WARPGROUP_THREADS;
    const int my_turn = 1 + wg;
    const int next_turn = 1 + (wg + 1) % n_consumers;
    if constexpr (Kernel::pingpong)
        if (wg == n_consumers - 1)
            named_barrier_arrive(1, pair_threads);
    // Issues a KV tile's products on this warpgroup's turn.
    const auto in_turn = [&](auto &&issue) {
        if constexpr (Kernel::pingpong)
            named_barrier_sync(my_turn, pair_threads);
        issue();
        if constexpr (Kernel::pingpong)
            named_barrier_arrive(next_turn, pair_threads);
    };
    // Waits for the next `count` KV tiles, which this warpgroup does not compute on, and releases
    // them once each has landed, so that its arrivals count towards that stage's round: tiles its
    // cluster loads for the other block, or (taking its turns, as if it issued products) those of
    // a work tile whose rows all lie past seqlen_q.
    const auto pass_tiles = [&](int count, auto take_turns) {
        for (int i = 0; i < count; ++i) {
            mbarrier_wait(smem.K_full(current.stage), current.phase);
            mbarrier_wait(smem.V_full(current.stage), current.phase);
            if constexpr (decltype(take_turns)::value)
                in_turn([] {});
            release_KV(smem.K_empty(current.stage));
            release_KV(smem.V_empty(current.stage));
            current.advance();
        }
    };
    using TakingTurns = std::true_type;
    using WithoutTurns = std::false_type;

    // The n-th work tile: the block's own, then (persistent) those the producer hands out, until it
    // hands out the end.
    for (int nth = 0, index = first_work_tile;; ++nth) {
        if constexpr (Kernel::persistent) {
            mbarrier_wait(smem.Q_full(wg), nth & 1);
            index = __shfl_sync(FULL_WARP_MASK, lane == 0 ? atomicOr(smem.work_slot(wg), 0) : 0, 0); // read once per warp
            if (index >= n_work_tiles)
                break;
        }
        const WorkTile work = work_tile(index);
        const int Q_first_row = work.Q_block * B_r;
        const int head = work.head;
        const int batch = work.batch;
        const Tiles tiles(params, Q_first_row);
        const TileLoader<Kernel> loader{kp, smem, head, head / group_size, batch, rank};
        // Without warp specialization (one work tile per block) the first consumer thread also
        // loads: Q and the first round now, each later tile once its stage has been released.
        const bool loads = !Kernel::warp_specialized && threadIdx.x == 0;
        if (loads && !tiles.empty()) {
            loader.load_Q(Q_first_row, 0, index, true);
            for (int tile = tiles.begin; tile < min(tiles.begin + stages, tiles.end); ++tile)
                loader.load_KV(tile, tile - tiles.begin);
        }
        // Of the KV tiles this block loads, those it computes on: none without a query block.
        const auto [first_loaded, end_loaded] = loaded_tiles(work, tiles);
        const bool computes = work.Q_block < Q_blocks && !tiles.empty();
        const int own_first = computes ? tiles.begin : end_loaded;
        const int own_end = computes ? tiles.end : end_loaded;
        const int passed_after = end_loaded - own_end;
        if constexpr (cluster > 1)
            pass_tiles(own_first - first_loaded, WithoutTurns{});

        // A warpgroup whose rows all lie past seqlen_q (in a last query block that ends within an
        // earlier warpgroup's rows) computes and stores nothing, but the block's pipeline still
        // counts on its warps.
        if ((MASKED_TAILS || cluster > 1) && Q_first_row + wg * WGMMA_M >= params.seqlen_q) {
            if constexpr (Kernel::persistent)
                release(smem.Q_empty(wg));
            else
                mbarrier_wait(smem.Q_full(wg), 0); // its Q has landed before the block exits
            pass_tiles(own_end - own_first, TakingTurns{});
            if constexpr (cluster > 1)
                pass_tiles(passed_after, WithoutTurns{});
            if constexpr (Kernel::persistent)
                continue;
            else
                break;
        }

        OnlineSoftmax<1, true, rows_may_be_empty> softmax;
        softmax.init();
        typename Kernel::O_accumulators O_acc;
        O_acc.zero();
        const ScoreModsOf<SCORE_MODS> score_mods(params, batch, head);
        // What the softmax multiplies the scores by: the softmax scale, or softcap once capped.
        const float score_scale = score_mods.post_scale;

        if (!tiles.empty()) {
            typename Kernel::Q_fragments Q_frag;
            // Descriptors of this warpgroup's Q block and of stage 0's K and V tiles; slices and
            // stages are offsets added to the start address field (16-byte units).
            const uint64_t Q_desc = k_major_descriptor<Swizzle>(ptx::shared_address(smem.Q(wg)));
            const uint64_t K_desc = k_major_descriptor<Swizzle>(ptx::shared_address(smem.K(0)));
            const uint64_t V_desc =
                mn_major_descriptor<Swizzle>(ptx::shared_address(smem.V(0)), Kernel::KV_col_block_bytes);
            constexpr uint64_t stage_step = Kernel::KV_tile_bytes >> 4;
            // k-slice kk of a K-major tile: its column block, then 32 bytes per slice inside the row.
            const auto k_slice = [](int kk, int col_block_bytes) {
                constexpr int slices_per_row = Swizzle::cols / WGMMA_K;
                return static_cast<uint64_t>(
                    (kk / slices_per_row * col_block_bytes + kk % slices_per_row * WGMMA_K * ELEMENT_BYTES) >> 4);
            };

            // S = Q K^T over the tile's first `width` keys (B_c but in masked tiles): a narrower product
            // writes the leading columns of S; the others are masked, -infinity from the start. The
            // fence orders these and every earlier register write (O's rescaling too) before the products.
            const auto issue_S = [&](typename Kernel::S_accumulators &S, int stage, auto width) {
                constexpr int W = decltype(width)::value;
#pragma unroll
                for (int i = W / 2; i < B_c / 2; ++i)
                    flat(S)[i] = -INFINITY;
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < d_head / WGMMA_K; ++kk) {
                    const uint64_t K_slice = K_desc + stage * stage_step + k_slice(kk, Kernel::KV_col_block_bytes);
                    if constexpr (Kernel::Q_in_registers)
                        Wgmma<W>::template rs<value_t, /*B_MN_MAJOR=*/false>(leading<W / 2>(flat(S)), Q_frag.r[0][kk], K_slice,
                                                                                   kk > 0);
                    else
                        Wgmma<W>::template ss<value_t>(leading<W / 2>(flat(S)), Q_desc + k_slice(kk, Kernel::Q_col_block_bytes),
                                                       K_slice, kk > 0);
                }
            };
            // P's k-slice kk multiplies V's rows 16 kk .. 16 kk + 15; the slices past `width` keys hold
            // only masked (zero) probabilities.
            const auto issue_PV = [&](typename Kernel::P_fragments &P, int stage, auto width) {
#pragma unroll
                for (int kk = 0; kk < decltype(width)::value / WGMMA_K; ++kk)
                    Wgmma<d_head>::template rs<value_t>(flat(O_acc), P.r[0][kk],
                                                        V_desc + stage * stage_step + ((kk * WGMMA_K * Swizzle::bytes) >> 4), 1);
            };
            using FullWidth = std::integral_constant<int, B_c>;
            // The keys of KV tile `tile` that this warpgroup's rows before seqlen_q may see, at least 1:
            // up to its last such row's diagonal (plus the window's right side) and the end of the keys.
            const int last_row = min(Q_first_row + (wg + 1) * WGMMA_M, params.seqlen_q) - 1;
            const auto visible_keys = [&](int tile) {
                int keys = B_c;
                if constexpr (MASKED_TAILS)
                    keys = min(keys, params.seqlen_k - tile * B_c);
                if constexpr (MASK != MaskKind::NONE)
                    keys = min(keys, last_row + params.seqlen_k - params.seqlen_q + params.mask.window_right - tile * B_c + 1);
                return max(keys, 1);
            };
            // process(width) with a masked tile's visible keys, or the full width. A branch per width
            // holds all the work on the tile's S: where branches that wrote S differently join while
            // products are in flight, ptxas makes them wait.
            const auto at_width = [&](int tile, auto masked, auto &&process) {
                if constexpr (decltype(masked)::value)
                    with_key_width<B_c>(visible_keys(tile), process);
                else
                    process(FullWidth{});
            };
            // Once the work tile's last S = Q K^T that reads Q in shared memory is done (with Q in
            // registers, its first), a persistent block's next Q may load.
            const auto release_Q_after = [&](int tile) {
                if (Kernel::persistent && tile == (Kernel::Q_in_registers ? tiles.begin : tiles.end - 1))
                    release(smem.Q_empty(wg));
            };
            // A tile of `width` keys: the columns past it are -infinity already (the score
            // modifications leave them alone), and without a mask (the end of the keys alone) a masked
            // tile of full width has its first half all attended.
            const auto modify_and_mask = [&](typename Kernel::S_accumulators &S, int tile, auto masked, auto width) {
                constexpr int W = decltype(width)::value;
                if constexpr (SCORE_MODS)
                    score_mods.template apply<W>(S, params, Q_first_row + warp_first_row, tile * B_c);
                if constexpr (decltype(masked)::value)
                    apply_mask<MASK, MASKED_TAILS, MASK == MaskKind::NONE && W == B_c ? half_key_width<B_c>() : 0, W>(
                        S, params, Q_first_row + warp_first_row, tile * B_c);
            };

            if constexpr (!Kernel::persistent)
                mbarrier_wait(smem.Q_full(wg), 0);
            if constexpr (Kernel::Q_in_registers) {
                // This warp's 16 rows, one ldmatrix per 16-column slice: lane l addresses row l % 16
                // of the slice's left (l < 16) or right half.
                const int row = warp_first_row % WGMMA_M + lane % MMA_M;
                const uint32_t Q_base = ptx::shared_address(smem.Q(wg));
#pragma unroll
                for (int kk = 0; kk < d_head / MMA_K; ++kk) {
                    const int col = kk * MMA_K + lane / MMA_M * ELEMS_PER_COPY;
                    const int chunk = Swizzle::chunk_in_row(row, col % Swizzle::cols / ELEMS_PER_COPY);
                    ptx::ldmatrix_x4(Q_frag.r[0][kk], Q_base + col / Swizzle::cols * Kernel::Q_col_block_bytes +
                                                          row * Swizzle::bytes + chunk * COPY_BYTES);
                }
            }
            PipelineState<stages> previous; // of the tile whose P V product is still to be issued
            typename Kernel::P_fragments P;

            // The first tile: S, its softmax (which only sets the maxima), P.
            const auto process_first_tile = [&](auto masked, auto width) {
                typename Kernel::S_accumulators S;
                mbarrier_wait(smem.K_full(current.stage), current.phase);
                in_turn([&] {
                    issue_S(S, current.stage, width);
                    wgmma_commit();
                });
                wgmma_wait<0>();
                fence_registers(flat(S));
                release_KV(smem.K_empty(current.stage));
                release_Q_after(tiles.begin);
                modify_and_mask(S, tiles.begin, masked, width);
                softmax.template exponentiate<true>(S, score_scale, [](int, int, float) {});
                accumulators_to_A<value_t>(P, S);
                previous = current;
                current.advance();
            };

            // A later tile: S of this tile and P V of the previous one are issued together.
            const auto process_tile = [&](int tile, auto masked, auto width) {
                typename Kernel::S_accumulators S;
                mbarrier_wait(smem.K_full(current.stage), current.phase);
                mbarrier_wait(smem.V_full(previous.stage), previous.phase);
                in_turn([&] {
                    fence_registers(flat(O_acc));
                    issue_S(S, current.stage, width);
                    wgmma_commit();
                    issue_PV(P, previous.stage, FullWidth{});
                    wgmma_commit();
                });

                if constexpr (Kernel::intra_wg_overlap) {
                    wgmma_wait<1>(); // S has landed; P V may still run
                    fence_registers(flat(S));
                    release_KV(smem.K_empty(current.stage));
                    release_Q_after(tile);
                    modify_and_mask(S, tile, masked, width);
                    float rescale[2];
                    const bool rescaled = softmax.template exponentiate<false>(
                        S, score_scale, [&](int, int h, float factor) { rescale[h] = factor; });
                    // The probabilities are computed here, while P V runs. The compiler schedules
                    // the wait below as early as its basic block allows, so it sits in branches of
                    // their own; wgmma waits must be reached by the whole warpgroup alike, so the
                    // branch is on whether any of its warps rescales.
                    fence_registers(flat(S));
                    if (named_barrier_any(vote_barrier, WARPGROUP_THREADS, rescaled)) {
                        wgmma_wait<0>();
                        fence_registers(flat(O_acc));
                        if (rescaled)
#pragma unroll
                            for (int h = 0; h < 2; ++h)
                                decltype(softmax)::rescale_row(O_acc.r[0], h, rescale[h]);
                    } else {
                        wgmma_wait<0>();
                    }
                    fence_registers(flat(O_acc));
                    fence_registers(flat(P));
                    release_KV(smem.V_empty(previous.stage));
                } else {
                    wgmma_wait<0>();
                    fence_registers(flat(S));
                    fence_registers(flat(O_acc));
                    release_KV(smem.K_empty(current.stage));
                    release_KV(smem.V_empty(previous.stage));
                    release_Q_after(tile);
                    modify_and_mask(S, tile, masked, width);
                    softmax.template update<false>(S, O_acc, score_scale);
                }
                if (loads && tile - 1 + stages < tiles.end)
                    loader.load_KV(tile - 1 + stages, tile - 1 + stages - tiles.begin);
                accumulators_to_A<value_t>(P, S);
                previous = current;
                current.advance();
            };
            using Masked = std::true_type;
            using Unmasked = std::false_type;
            const auto process_range = [&](int first, int last, auto masked) {
                for (int tile = first; tile < last; ++tile)
                    at_width(tile, masked, [&](auto width) { process_tile(tile, masked, width); });
            };

            if (tiles.is_masked(tiles.begin))
                at_width(tiles.begin, Masked{}, [&](auto width) { process_first_tile(Masked{}, width); });
            else
                process_first_tile(Unmasked{}, FullWidth{});
            int next_tile = tiles.begin + 1;
            if constexpr (Tiles::has_masked_prefix) {
                process_range(next_tile, tiles.unmasked_begin, Masked{});
                next_tile = max(next_tile, tiles.unmasked_begin);
            }
            if constexpr (Tiles::has_masked_suffix) {
                process_range(next_tile, tiles.unmasked_end, Unmasked{});
                process_range(max(next_tile, tiles.unmasked_end), tiles.end, Masked{});
            } else {
                process_range(next_tile, tiles.end, Unmasked{});
            }

            // The last tile's P V, over its visible keys if it is masked.
            mbarrier_wait(smem.V_full(previous.stage), previous.phase);
            fence_registers(flat(O_acc));
            // Fence, commit and wait in each branch: ptxas wants them in the products' own block.
            const auto issue_last_PV = [&](auto width) {
                wgmma_fence();
                issue_PV(P, previous.stage, width);
                wgmma_commit();
                wgmma_wait<0>();
                fence_registers(flat(O_acc));
            };
            if (tiles.is_masked(tiles.end - 1))
                with_key_width<B_c>(visible_keys(tiles.end - 1), issue_last_PV);
            else
                issue_last_PV(FullWidth{});
            fence_registers(flat(P));
            release_KV(smem.V_empty(previous.stage));
        } else if constexpr (Kernel::persistent) {
            release(smem.Q_empty(wg)); // nothing to compute: the next Q may load now
        }
        if constexpr (cluster > 1)
            pass_tiles(passed_after, WithoutTurns{});

        softmax.normalize(O_acc);
        if (params.lse != nullptr)
            store_log_sum_exp(softmax, score_scale,
                              params.lse + (static_cast<int64_t>(batch) * params.heads_q + head) * params.seqlen_q + Q_first_row,
                              warp_first_row, params.seqlen_q - Q_first_row);

        // O leaves through shared memory, in the swizzled layout TMA reads, once every warp
        // of the warpgroup is done with Q (whose block O reuses unless persistent) and the previous
        // work tile's store has read its O; TMA drops the rows past seqlen_q.
        const bool stores = threadIdx.x % WARPGROUP_THREADS == 0;
        if (Kernel::persistent && stores)
            tma_store_wait_read();
        named_barrier_sync(warpgroup_barrier, WARPGROUP_THREADS);
        uint8_t *const O_smem = smem.O(wg);
        constexpr int chunks_per_row = Swizzle::bytes / COPY_BYTES; // one 8-column accumulator tile each
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = warp_first_row % WGMMA_M + lane / QUAD_SIZE + 8 * h;
#pragma unroll
            for (int n = 0; n < d_head / MMA_N; ++n) {
                const int chunk = Swizzle::chunk_in_row(row, n % chunks_per_row);
                const int offset = n / chunks_per_row * Kernel::Q_col_block_bytes + row * Swizzle::bytes +
                                   chunk * COPY_BYTES + lane % QUAD_SIZE * 2 * ELEMENT_BYTES;
                *reinterpret_cast<uint32_t *>(O_smem + offset) =
                    pack_pair<value_t>(O_acc.r[0][n][2 * h], O_acc.r[0][n][2 * h + 1]);
            }
        }
        fence_async_shared();
        named_barrier_sync(warpgroup_barrier, WARPGROUP_THREADS);
        if (stores) {
#pragma unroll
            for (int c = 0; c < Kernel::col_blocks; ++c)
                tma_store_4d(&kp.o, O_smem + c * Kernel::Q_col_block_bytes, c * Swizzle::cols,
                             Q_first_row + wg * WGMMA_M, head, batch);
            tma_store_commit();
        }
        if constexpr (!Kernel::persistent)
            break;
    }
    if constexpr (Kernel::pingpong)
        if (wg == 0)
            named_barrier_sync(1, pair_threads);
    if (Kernel::persistent && threadIdx.x % WARPGROUP_THREADS == 0)
        tma_store_wait_read(); // the last store has read shared memory before the block exits
    if constexpr (cluster > 1)
        cluster_sync(); // the other blocks' arrivals on this one's barriers are done
#endif
}

} // namespace flash::sm90
