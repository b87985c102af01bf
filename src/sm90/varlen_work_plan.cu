// The planning kernel of a varlen call (varlen_work_plan.cuh says what the plan is). One unit for
// every configuration: the work tiles' shape is a runtime argument, and the block scan's headers
// are read once per build rather than once per configuration.
#include <cstdint>

#include <cub/block/block_scan.cuh>

#include "common/cuda_utils.cuh"
#include "common/ptx.cuh"
#include "common/sequence.cuh"
#include "sm90/varlen_work_plan.cuh"

namespace flash::sm90 {
namespace {

constexpr int PLAN_THREADS = 1024;
// Sequences sorted by their keys up to this many (a comparison of every pair); a larger batch
// keeps its own order.
constexpr int PLAN_SORTED_SEQUENCES = 4096;

// The dynamic shared memory of a sorted batch's arrays: order, query blocks, prefix sums.
constexpr int plan_shared_bytes(int batch) { return (3 * batch + 1) * static_cast<int>(sizeof(int)); }

struct WorkTileShape {
    int B_r;
    int cluster;
    bool last_Q_blocks_first;
};

} // namespace

// One block of PLAN_THREADS. Work tiles of one (sequence, head) are listed with the query block
// fastest and, when shape.last_Q_blocks_first, the last query blocks first, as the dense numbering
// does (WorkTile). A sorted batch's arrays are in shared memory, where each tile's binary search
// over the prefix sums reads them: in global memory, its dependent reads took most of the kernel's
// time.
__global__ void __launch_bounds__(PLAN_THREADS)
    varlen_plan_forward_kernel(const ForwardParams params, VarlenPlanLayout layout, WorkTileShape shape) {
    // The attention kernel launched after this one starts its blocks now; they wait for the plan in
    // wait_for_planned_work. (One block: the trigger counts once it has run.)
    ptx::allow_dependent_launch();
    using Scan = cub::BlockScan<int, PLAN_THREADS>;
    __shared__ typename Scan::TempStorage scan_storage;
    extern __shared__ int shared_arrays[];
    uint8_t *const scratch = static_cast<uint8_t *>(params.scratch);
    const int batch = layout.batch;
    const bool sorts = batch <= PLAN_SORTED_SEQUENCES;
    const auto array = [&](int offset_in_shared, int64_t offset_in_scratch) {
        return sorts ? shared_arrays + offset_in_shared : reinterpret_cast<int *>(scratch + offset_in_scratch);
    };
    int *const order = array(0, layout.order_offset());
    int *const Q_blocks = array(batch, layout.Q_blocks_offset());
    int *const prefix = array(2 * batch, layout.prefix_offset());
    int *const keys = prefix; // each sequence's key count, for the ranking (sorted only): the prefix sums replace them
    PlannedTile *const tiles = reinterpret_cast<PlannedTile *>(scratch + layout.tiles_offset());
    const auto Q_groups_of = [&](int blocks) { return (blocks + shape.cluster - 1) / shape.cluster; };

    for (int b = threadIdx.x; b < batch; b += PLAN_THREADS) {
        const Sequence<true> sequence(params, b);
        Q_blocks[b] = (sequence.q_rows.length + shape.B_r - 1) / shape.B_r;
        if (sorts)
            keys[b] = sequence.k_rows.length;
    }
    __syncthreads();
    // The position of sequence b: after every sequence with more keys, and those with as many
    // that come before it.
    for (int b = threadIdx.x; b < batch; b += PLAN_THREADS) {
        int position = b;
        if (sorts) {
            position = 0;
            const int key = keys[b];
            for (int j = 0; j < batch; ++j)
                position += keys[j] > key || (keys[j] == key && j < b);
        }
        order[position] = b;
    }
    __syncthreads();
    // The tiles before each position.
    int carry = 0;
    for (int first = 0; first < batch; first += PLAN_THREADS) {
        const int position = first + static_cast<int>(threadIdx.x);
        const int count = position < batch ? Q_groups_of(Q_blocks[order[position]]) * params.heads_q : 0;
        int before = 0;
        int chunk_total = 0;
        Scan(scan_storage).ExclusiveSum(count, before, chunk_total);
        if (position < batch)
            prefix[position] = carry + before;
        carry += chunk_total;
        __syncthreads(); // the scan's storage is reused
    }
    if (threadIdx.x == 0) {
        prefix[batch] = carry;
        *reinterpret_cast<int *>(scratch) = carry;
    }
    __syncthreads();
    // Each tile finds its position: the last whose prefix is at most its index.
    for (int index = threadIdx.x; index < carry; index += PLAN_THREADS) {
        int low = 0;
        int high = batch - 1;
        while (low < high) {
            const int middle = (low + high + 1) / 2;
            if (prefix[middle] <= index)
                low = middle;
            else
                high = middle - 1;
        }
        const int b = order[low];
        const int Q_groups = Q_groups_of(Q_blocks[b]);
        const int local = index - prefix[low];
        const int group = local % Q_groups;
        const int first_group = shape.last_Q_blocks_first ? Q_groups - 1 - group : group;
        tiles[index] = {b, local / Q_groups, first_group * shape.cluster, Q_blocks[b]};
    }
}

void plan_varlen_work(const ForwardParams &params, const VarlenPlanLayout &layout, int B_r, int cluster,
                      bool last_Q_blocks_first, cudaStream_t stream) {
    const int shared_bytes = layout.batch <= PLAN_SORTED_SEQUENCES ? plan_shared_bytes(layout.batch) : 0;
    ensure_dynamic_smem_limit(reinterpret_cast<const void *>(varlen_plan_forward_kernel),
                              plan_shared_bytes(PLAN_SORTED_SEQUENCES));
    varlen_plan_forward_kernel<<<1, PLAN_THREADS, shared_bytes, stream>>>(params, layout,
                                                                          WorkTileShape{B_r, cluster, last_Q_blocks_first});
    check_cuda(cudaGetLastError(), "launching the varlen work plan");
}

} // namespace flash::sm90
