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
#include "sm90/work_order.cuh"

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
    bool masked;
    int KV_row_bytes;

    __device__ __forceinline__ int Q_groups(int Q_blocks) const { return (Q_blocks + cluster - 1) / cluster; }
};

// A sequence's query blocks, and its keys (what the order ranks it by).
struct SequenceSize {
    int Q_blocks;
    int keys;

    __device__ __forceinline__ bool operator!=(const SequenceSize &other) const {
        return Q_blocks != other.Q_blocks || keys != other.keys;
    }
};

__device__ __forceinline__ SequenceSize sequence_size(const ForwardParams &params, const WorkTileShape &shape, int b) {
    const SequenceRows rows = sequence_rows(params.sequences, b);
    return {(rows.q.length + shape.B_r - 1) / shape.B_r, rows.k.length};
}

// The plan's arrays: per sequence its query blocks and keys; per position of the batch's order its
// sequence; and the runs of the order, consecutive positions whose sequences have the same query
// blocks and keys, each ordered as one dense problem of that many sequences (work_order.cuh): per
// run its first position and the tiles before it, with one more entry past the last run (the batch,
// and every tile).
struct PlanArrays {
    int *Q_blocks;
    int *keys;
    int *order;
    int *run_first;
    int *run_prefix;

    __device__ __forceinline__ void set_size(int b, const SequenceSize &size) const {
        Q_blocks[b] = size.Q_blocks;
        keys[b] = size.keys;
    }
    __device__ __forceinline__ SequenceSize size(int b) const { return {Q_blocks[b], keys[b]}; }
};

// Lists this block's share of the tiles: tile `index` finds its run, the last whose prefix is at
// most the index, and its place in that run's order (work_order.cuh): the run's (sequence, head)
// units, the heads of a sequence consecutive, and their query block groups, under a mask in chunks
// of units whose K and V fit L2, longest first. Each tile carries its sequence's rows, read again
// here (the loads of a thread's tiles overlap).
__device__ __forceinline__ void list_tiles(const ForwardParams &params, const PlanArrays &arrays, int runs,
                                           const WorkTileShape &shape, PlannedTile *tiles) {
    const int count = arrays.run_prefix[runs];
    const int heads = params.heads_q;
    for (int index = blockIdx.x * PLAN_THREADS + threadIdx.x; index < count; index += gridDim.x * PLAN_THREADS) {
        int low = 0;
        int high = runs - 1;
        while (low < high) {
            const int middle = (low + high + 1) / 2;
            if (arrays.run_prefix[middle] <= index)
                low = middle;
            else
                high = middle - 1;
        }
        const int first = arrays.run_first[low];
        const SequenceSize size = arrays.size(arrays.order[first]);
        const int units = (arrays.run_first[low + 1] - first) * heads;
        const int chunk_units =
            shape.masked ? units_sharing_kv(size.keys, shape.KV_row_bytes, 1, params.heads_q / params.heads_kv) : 1;
        const OrderedWork work =
            ordered_work(index - arrays.run_prefix[low], units, shape.Q_groups(size.Q_blocks), chunk_units, shape.masked);
        const int sequence = arrays.order[first + work.unit / heads];
        tiles[index] = {sequence, work.unit % heads, work.position * shape.cluster, size.Q_blocks,
                        sequence_rows(params.sequences, sequence)};
    }
}

// Whether the sequence at `position` starts a run, from its size and the previous position's.
__device__ __forceinline__ bool starts_run(int position, const SequenceSize &size, const SequenceSize &previous) {
    return position == 0 || size != previous;
}

} // namespace

// A batch of at most PLAN_THREADS * SORT_ITEMS sequences, in blocks that each sort it and list their
// share of the tiles. Thread t sorts sequences SORT_ITEMS * t ..; the sort (a stable radix sort on
// the keys, most first, over the bits the longest needs) leaves it positions SORT_ITEMS * t ..,
// whose tile counts and run starts block scans sum. The arrays are in shared memory.
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
    const PlanArrays arrays{shared_arrays, shared_arrays + batch, shared_arrays + 2 * batch, shared_arrays + 3 * batch,
                            shared_arrays + 4 * batch + 1};

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
            arrays.set_size(b, size);
            keys[i] = static_cast<unsigned>(size.keys) + 1;
            atomicMax(&longest, keys[i]);
        }
    }
    __syncthreads();
    const int key_bits = 32 - __clz(static_cast<int>(longest)); // at least 1: a batch has a sequence
    Sort(temp.sort).SortDescending(keys, sequences, 0, key_bits);
#pragma unroll
    for (int i = 0; i < SORT_ITEMS; ++i) {
        const int position = SORT_ITEMS * static_cast<int>(threadIdx.x) + i;
        if (position < batch)
            arrays.order[position] = sequences[i];
    }
    __syncthreads(); // the sort's storage is reused by the scans, and the order is read across threads

    int counts[SORT_ITEMS];
    int starts[SORT_ITEMS];
#pragma unroll
    for (int i = 0; i < SORT_ITEMS; ++i) {
        const int position = SORT_ITEMS * static_cast<int>(threadIdx.x) + i;
        counts[i] = 0;
        starts[i] = 0;
        if (position < batch) {
            const SequenceSize size = arrays.size(sequences[i]);
            counts[i] = shape.Q_groups(size.Q_blocks) * params.heads_q;
            starts[i] = starts_run(position, size, position > 0 ? arrays.size(arrays.order[position - 1]) : size);
        }
    }
    int before[SORT_ITEMS];
    int total = 0;
    Scan(temp.scan).ExclusiveSum(counts, before, total);
    __syncthreads();
    int run[SORT_ITEMS];
    int runs = 0;
    Scan(temp.scan).ExclusiveSum(starts, run, runs);
#pragma unroll
    for (int i = 0; i < SORT_ITEMS; ++i) {
        if (starts[i]) {
            arrays.run_first[run[i]] = SORT_ITEMS * static_cast<int>(threadIdx.x) + i;
            arrays.run_prefix[run[i]] = before[i];
        }
    }
    if (threadIdx.x == 0) {
        arrays.run_first[runs] = batch;
        arrays.run_prefix[runs] = total;
        if (blockIdx.x == 0)
            *static_cast<int *>(params.scratch) = total;
    }
    __syncthreads();
    list_tiles(params, arrays, runs, shape,
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
    const PlanArrays arrays{reinterpret_cast<int *>(scratch + layout.Q_blocks_offset()),
                            reinterpret_cast<int *>(scratch + layout.keys_offset()),
                            reinterpret_cast<int *>(scratch + layout.order_offset()),
                            reinterpret_cast<int *>(scratch + layout.run_first_offset()),
                            reinterpret_cast<int *>(scratch + layout.run_prefix_offset())};
    // The tiles and runs before each position, PLAN_THREADS positions at a time.
    int tiles_carry = 0;
    int runs_carry = 0;
    for (int first = 0; first < batch; first += PLAN_THREADS) {
        const int position = first + static_cast<int>(threadIdx.x);
        int count = 0;
        int start = 0;
        if (position < batch) {
            const SequenceSize size = sequence_size(params, shape, position);
            arrays.set_size(position, size);
            arrays.order[position] = position;
            count = shape.Q_groups(size.Q_blocks) * params.heads_q;
            start = starts_run(position, size, position > 0 ? sequence_size(params, shape, position - 1) : size);
        }
        int before = 0;
        int chunk_tiles = 0;
        Scan(scan_storage).ExclusiveSum(count, before, chunk_tiles);
        __syncthreads(); // the scan's storage is reused
        int run = 0;
        int chunk_runs = 0;
        Scan(scan_storage).ExclusiveSum(start, run, chunk_runs);
        if (start) {
            arrays.run_first[runs_carry + run] = position;
            arrays.run_prefix[runs_carry + run] = tiles_carry + before;
        }
        tiles_carry += chunk_tiles;
        runs_carry += chunk_runs;
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        arrays.run_first[runs_carry] = batch;
        arrays.run_prefix[runs_carry] = tiles_carry;
        *reinterpret_cast<int *>(scratch) = tiles_carry;
    }
    __syncthreads();
    list_tiles(params, arrays, runs_carry, shape, reinterpret_cast<PlannedTile *>(scratch + layout.tiles_offset()));
}

void plan_varlen_work(const ForwardParams &params, const VarlenPlanLayout &layout, int B_r, int cluster, bool masked,
                      int KV_row_bytes, cudaStream_t stream) {
    const WorkTileShape shape{B_r, cluster, masked, KV_row_bytes};
    if (layout.batch <= PLAN_SORTED_SEQUENCES) {
        // PlanArrays: per sequence its query blocks and keys, per position its sequence, and per run
        // (at most one per position, and one entry more) its first position and prefix.
        const auto shared_bytes = [](int batch) { return (5 * batch + 2) * static_cast<int>(sizeof(int)); };
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
