// The planning kernel of a varlen call (varlen_work_plan.cuh says what the plan is). One unit for
// every configuration: the work tiles' shape is a runtime argument, and cub's headers are read
// once per build rather than once per configuration.
#include <algorithm>
#include <cstdint>

#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include "common/cuda_utils.cuh"
#include "common/ptx.cuh"
#include "common/sequence.cuh"
#include "sm90/varlen_work_plan.cuh"

namespace flash::sm90 {
namespace {

constexpr int PLAN_THREADS = 1024;
// A sorted batch: each thread sorts one sequence, or up to MAX_SORT_ITEMS of a batch of more than
// PLAN_THREADS (the sort's cost grows with the items per thread); a batch of more than
// PLAN_SORTED_SEQUENCES keeps its own order.
constexpr int MAX_SORT_ITEMS = 4;
constexpr int PLAN_SORTED_SEQUENCES = PLAN_THREADS * MAX_SORT_ITEMS;
// A sorted batch's plan is written by as many blocks as give each thread one tile to list (up to
// MAX_PLAN_BLOCKS): each block sorts the batch for itself, which costs less than one block listing
// every tile (a binary search and a division each, on dependent loads).
constexpr int MAX_PLAN_BLOCKS = 64;

struct WorkTileShape {
    int B_r;
    int cluster;
    bool last_Q_blocks_first;

    __device__ __forceinline__ int Q_groups(int Q_blocks) const { return (Q_blocks + cluster - 1) / cluster; }
};

// A sequence's query blocks, and its keys (what the order ranks it by).
struct SequenceSize {
    int Q_blocks;
    int keys;
};

__device__ __forceinline__ SequenceSize sequence_size(const ForwardParams &params, const WorkTileShape &shape, int b) {
    const SequenceRows rows = sequence_rows(params.sequences, b);
    return {(rows.q.length + shape.B_r - 1) / shape.B_r, rows.k.length};
}

// The positions' arrays, in the batch's order: the sequence at each position, its query blocks,
// and the tiles before each position (batch + 1 prefix sums).
struct PlanArrays {
    int *order;
    int *Q_blocks;
    int *prefix;
};

// Lists this block's share of the tiles: tile `index` finds its position, the last whose prefix is
// at most the index. Tiles of one (sequence, head) come with the query block fastest and, when
// shape.last_Q_blocks_first, the last query blocks first, as the dense numbering has them (WorkTile).
// Each carries its sequence's rows, read again here (the loads of a thread's tiles overlap).
__device__ __forceinline__ void list_tiles(const ForwardParams &params, const PlanArrays &arrays, int batch,
                                           const WorkTileShape &shape, PlannedTile *tiles) {
    const int count = arrays.prefix[batch];
    for (int index = blockIdx.x * PLAN_THREADS + threadIdx.x; index < count; index += gridDim.x * PLAN_THREADS) {
        int low = 0;
        int high = batch - 1;
        while (low < high) {
            const int middle = (low + high + 1) / 2;
            if (arrays.prefix[middle] <= index)
                low = middle;
            else
                high = middle - 1;
        }
        const int Q_blocks = arrays.Q_blocks[low];
        const int Q_groups = shape.Q_groups(Q_blocks);
        const int local = index - arrays.prefix[low];
        const int group = local % Q_groups;
        const int first_group = shape.last_Q_blocks_first ? Q_groups - 1 - group : group;
        const int sequence = arrays.order[low];
        tiles[index] = {sequence, local / Q_groups, first_group * shape.cluster, Q_blocks,
                        sequence_rows(params.sequences, sequence)};
    }
}

} // namespace

// A batch of at most PLAN_THREADS * SORT_ITEMS sequences, in blocks that each sort it and list their
// share of the tiles. Thread t sorts sequences SORT_ITEMS * t ..; the sort (a stable radix sort on
// the keys, most first, over the bits the longest needs) leaves it positions SORT_ITEMS * t ..,
// whose tile counts one block scan sums. The arrays are in shared memory.
template <int SORT_ITEMS>
__global__ void __launch_bounds__(PLAN_THREADS)
    varlen_plan_sorted_forward_kernel(const ForwardParams params, VarlenPlanLayout layout, WorkTileShape shape) {
    // The attention kernel launched after this one starts its blocks now; they wait for the plan in
    // wait_for_planned_work. (The trigger counts once every block has run it.)
    ptx::allow_dependent_launch();
    using Sort = cub::BlockRadixSort<unsigned, PLAN_THREADS, SORT_ITEMS, int>;
    using Scan = cub::BlockScan<int, PLAN_THREADS>;
    __shared__ union {
        typename Sort::TempStorage sort;
        typename Scan::TempStorage scan;
    } temp;
    __shared__ unsigned longest;
    extern __shared__ int shared_arrays[];
    const int batch = layout.batch;
    int *const Q_blocks_of = shared_arrays; // by sequence
    const PlanArrays arrays{shared_arrays + batch, shared_arrays + 2 * batch, shared_arrays + 3 * batch};

    if (threadIdx.x == 0)
        longest = 0;
    __syncthreads();
    unsigned keys[SORT_ITEMS];
    int sequences[SORT_ITEMS];
#pragma unroll
    for (int i = 0; i < SORT_ITEMS; ++i) {
        const int b = SORT_ITEMS * static_cast<int>(threadIdx.x) + i;
        sequences[i] = b;
        keys[i] = 0; // past the batch: after every sequence of the batch, which sorts on its keys + 1
        if (b < batch) {
            const SequenceSize size = sequence_size(params, shape, b);
            Q_blocks_of[b] = size.Q_blocks;
            keys[i] = static_cast<unsigned>(size.keys) + 1;
            atomicMax(&longest, keys[i]);
        }
    }
    __syncthreads();
    const int key_bits = 32 - __clz(static_cast<int>(longest)); // at least 1: a batch has a sequence
    Sort(temp.sort).SortDescending(keys, sequences, 0, key_bits);
    __syncthreads(); // the sort's storage is reused by the scan

    int counts[SORT_ITEMS];
#pragma unroll
    for (int i = 0; i < SORT_ITEMS; ++i) {
        const int position = SORT_ITEMS * static_cast<int>(threadIdx.x) + i;
        counts[i] = position < batch ? shape.Q_groups(Q_blocks_of[sequences[i]]) * params.heads_q : 0;
    }
    int before[SORT_ITEMS];
    int total = 0;
    Scan(temp.scan).ExclusiveSum(counts, before, total);
#pragma unroll
    for (int i = 0; i < SORT_ITEMS; ++i) {
        const int position = SORT_ITEMS * static_cast<int>(threadIdx.x) + i;
        if (position < batch) {
            arrays.order[position] = sequences[i];
            arrays.Q_blocks[position] = Q_blocks_of[sequences[i]];
            arrays.prefix[position] = before[i];
        }
    }
    if (threadIdx.x == 0) {
        arrays.prefix[batch] = total;
        if (blockIdx.x == 0)
            *static_cast<int *>(params.scratch) = total;
    }
    __syncthreads();
    list_tiles(params, arrays, batch, shape,
               reinterpret_cast<PlannedTile *>(static_cast<uint8_t *>(params.scratch) + layout.tiles_offset()));
}

// A larger batch, in its own order, in one block whose arrays are in the scratch (global memory).
__global__ void __launch_bounds__(PLAN_THREADS)
    varlen_plan_forward_kernel(const ForwardParams params, VarlenPlanLayout layout, WorkTileShape shape) {
    ptx::allow_dependent_launch();
    using Scan = cub::BlockScan<int, PLAN_THREADS>;
    __shared__ typename Scan::TempStorage scan_storage;
    uint8_t *const scratch = static_cast<uint8_t *>(params.scratch);
    const int batch = layout.batch;
    const PlanArrays arrays{reinterpret_cast<int *>(scratch + layout.order_offset()),
                            reinterpret_cast<int *>(scratch + layout.Q_blocks_offset()),
                            reinterpret_cast<int *>(scratch + layout.prefix_offset())};
    // The tiles before each position, PLAN_THREADS positions at a time.
    int carry = 0;
    for (int first = 0; first < batch; first += PLAN_THREADS) {
        const int position = first + static_cast<int>(threadIdx.x);
        int count = 0;
        if (position < batch) {
            const int Q_blocks = sequence_size(params, shape, position).Q_blocks;
            arrays.order[position] = position;
            arrays.Q_blocks[position] = Q_blocks;
            count = shape.Q_groups(Q_blocks) * params.heads_q;
        }
        int before = 0;
        int chunk_total = 0;
        Scan(scan_storage).ExclusiveSum(count, before, chunk_total);
        if (position < batch)
            arrays.prefix[position] = carry + before;
        carry += chunk_total;
        __syncthreads(); // the scan's storage is reused
    }
    if (threadIdx.x == 0) {
        arrays.prefix[batch] = carry;
        *reinterpret_cast<int *>(scratch) = carry;
    }
    __syncthreads();
    list_tiles(params, arrays, batch, shape, reinterpret_cast<PlannedTile *>(scratch + layout.tiles_offset()));
}

void plan_varlen_work(const ForwardParams &params, const VarlenPlanLayout &layout, int B_r, int cluster,
                      bool last_Q_blocks_first, cudaStream_t stream) {
    const WorkTileShape shape{B_r, cluster, last_Q_blocks_first};
    if (layout.batch <= PLAN_SORTED_SEQUENCES) {
        // Per sequence its query blocks, and per position its sequence, query blocks and prefix.
        const auto shared_bytes = [](int batch) { return (4 * batch + 1) * static_cast<int>(sizeof(int)); };
        const int items = layout.batch <= PLAN_THREADS ? 1 : MAX_SORT_ITEMS;
        const auto kernel = items == 1 ? varlen_plan_sorted_forward_kernel<1> : varlen_plan_sorted_forward_kernel<MAX_SORT_ITEMS>;
        ensure_dynamic_smem_limit(reinterpret_cast<const void *>(kernel), shared_bytes(PLAN_THREADS * items));
        const int blocks = static_cast<int>(std::clamp<int64_t>((layout.capacity + PLAN_THREADS - 1) / PLAN_THREADS, 1, MAX_PLAN_BLOCKS));
        kernel<<<blocks, PLAN_THREADS, shared_bytes(layout.batch), stream>>>(params, layout, shape);
    } else {
        varlen_plan_forward_kernel<<<1, PLAN_THREADS, 0, stream>>>(params, layout, shape);
    }
    check_cuda(cudaGetLastError(), "launching the varlen work plan");
}

} // namespace flash::sm90
