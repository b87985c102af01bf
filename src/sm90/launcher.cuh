// The Hopper family's launcher: the call's tensor maps, then the traits' threads and dynamic shared
// memory per thread block, one block per work tile (B_r query rows of one (batch, head), of the
// longest sequence with per-sequence lengths), or, when persistent, one per SM at most; with
// multicast, in clusters of two blocks. A varlen call first plans its work tiles, and asks for
// scratch for the plan and for its blocks' tensor maps bounded at a sequence's end; its keys and
// values may be on the pages of a paged cache. With V_transposed_copy the scratch is V's transposed
// copy, which a copy kernel writes first.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>
#include <mutex>
#include <stdexcept>
#include <utility>

#include <cuda_runtime.h>

#include "common/cuda_utils.cuh"
#include "sm90/forward_kernel.cuh"
#include "sm90/kernel_params.h"
#include "sm90/launcher.h"
#include "sm90/sequence_tensor_maps.cuh"
#include "sm90/tensor_maps.h"
#include "sm90/traits.cuh"
#include "sm90/transposed_v_copy.cuh"
#include "sm90/varlen_work_plan.cuh"

namespace flash::sm90 {

template <typename Kernel, ProblemVariant VARIANT>
constexpr auto kernel_of =
    &hopper_forward_kernel<Kernel, VARIANT.mask, VARIANT.masked_tails, VARIANT.score_mods, VARIANT.varlen, VARIANT.kv_e4m3>;

// How many clusters of `config`'s shape (its grid aside) can be resident at once on this device;
// asked once per kernel and device.
inline int resident_clusters(const void *kernel, cudaLaunchConfig_t config) {
    static std::mutex mutex;
    static std::map<std::pair<int, const void *>, int> counts;
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    const std::lock_guard<std::mutex> lock(mutex);
    auto found = counts.find({device, kernel});
    if (found == counts.end()) {
        config.gridDim = dim3(config.attrs[0].val.clusterDim.x);
        int count = 0;
        check_cuda(cudaOccupancyMaxActiveClusters(&count, kernel, &config), "cudaOccupancyMaxActiveClusters");
        if (count < 1)
            throw std::runtime_error("no cluster of this kernel fits on the device");
        found = counts.emplace(std::pair{device, kernel}, count).first;
    }
    return found->second;
}

// How many work tiles a call may have: a dense call's, as the kernel numbers them
// (tile_scheduler.cuh); for a varlen call at most every (batch, head)'s query blocks in clusters'
// groups, and at most one more group per sequence than its rows fill (what its plan may list).
template <typename Kernel, ProblemVariant VARIANT>
int64_t max_work_tiles(const ForwardParams &params) {
    constexpr int cluster = Kernel::cluster_size;
    const int64_t Q_blocks = (params.seqlen_q + Kernel::B_r - 1) / Kernel::B_r;
    if constexpr (!VARIANT.varlen) {
        return dense_work_tiles(cluster, Q_blocks, params.batch, params.heads_q, params.heads_kv);
    } else {
        constexpr int64_t group_rows = Kernel::B_r * cluster;
        const SequenceLayout &layout = params.sequences;
        const int64_t rows = layout.cu_seqlens_q != nullptr ? layout.rows_q : int64_t{layout.rows_q} * params.batch;
        const int64_t groups = std::min((Q_blocks + cluster - 1) / cluster * params.batch,
                                        (rows + group_rows - 1) / group_rows + params.batch);
        return groups * params.heads_q;
    }
}

// The launch's threads, dynamic shared memory per block, cluster shape and grid: one block per work
// tile, or, when persistent, as many (clusters of) blocks as fit at once (with clusters, the GPCs'
// SM counts may leave some SMs out). A varlen kernel may start while its planning kernel runs
// (programmatic stream serialization; its blocks wait for the plan), which hides the second
// launch's latency; so may a V_transposed_copy kernel while the copy's last blocks run (its loading
// thread waits for the copy before its first V tile). config.attrs points into the shape, which
// therefore stays put.
template <typename Kernel, ProblemVariant VARIANT>
struct LaunchShape {
    cudaLaunchAttribute attributes[2]{}; // the cluster shape first (resident_clusters reads it)
    cudaLaunchConfig_t config{};

    explicit LaunchShape(const ForwardParams &params) {
        // Raised before the occupancy query as well as the launch: with the default limit no block
        // of more than 48 KiB fits, so the query would count no cluster. (A varlen call's scratch is
        // sized, through this shape, before its launch.)
        ensure_dynamic_smem_limit(kernel(), Kernel::smem_bytes);
        constexpr int cluster = Kernel::cluster_size;
        config.blockDim = dim3(Kernel::n_threads);
        config.dynamicSmemBytes = Kernel::smem_bytes;
        config.attrs = attributes;
        if constexpr (cluster > 1) {
            attributes[config.numAttrs].id = cudaLaunchAttributeClusterDimension;
            attributes[config.numAttrs++].val.clusterDim = {cluster, 1, 1};
        }
        if constexpr (VARIANT.varlen || Kernel::V_transposed_copy)
            attributes[config.numAttrs++] = dependent_launch_attribute();
        int64_t clusters = max_work_tiles<Kernel, VARIANT>(params);
        if constexpr (Kernel::persistent)
            clusters = std::min<int64_t>(clusters, cluster > 1 ? resident_clusters(kernel(), config) : multiprocessor_count());
        config.gridDim = dim3(static_cast<unsigned>(clusters * cluster));
    }
    LaunchShape(const LaunchShape &) = delete;
    LaunchShape &operator=(const LaunchShape &) = delete;

    static const void *kernel() { return reinterpret_cast<const void *>(kernel_of<Kernel, VARIANT>); }
};

// A varlen call's scratch: its work plan (varlen_work_plan.cuh), then its blocks' slots for
// sequence tensor maps (sequence_tensor_maps.cuh), aligned as the copy engine wants tensor maps.
template <typename Kernel, ProblemVariant VARIANT>
struct VarlenScratch {
    VarlenPlanLayout plan;
    int64_t maps_offset;
    int64_t bytes;

    explicit VarlenScratch(const ForwardParams &params) : plan{max_work_tiles<Kernel, VARIANT>(params), params.batch} {
        constexpr int64_t map_alignment = 128;
        maps_offset = (plan.bytes() + map_alignment - 1) / map_alignment * map_alignment;
        bytes = maps_offset +
                LaunchShape<Kernel, VARIANT>(params).config.gridDim.x * SequenceTensorMapSlots<Kernel>::bytes_per_block;
    }
};

template <typename Kernel, ProblemVariant VARIANT>
int64_t varlen_scratch_bytes(const ForwardParams &params) {
    return VarlenScratch<Kernel, VARIANT>(params).bytes;
}

// With V_transposed_copy, the scratch is V's transposed copy.
inline int64_t transposed_v_bytes(const ForwardParams &params) { return TransposedVLayout(params).bytes(); }

template <typename Kernel, ProblemVariant VARIANT>
void launch(const ForwardParams &params, cudaStream_t stream) {
    const auto kernel = kernel_of<Kernel, VARIANT>;
    // A varlen call's sequences are rows of the tensors' seq dimension (rows_q, rows_k long); with
    // cu_seqlens all of them are in the one batch entry, and with kv_batch_idx k and v have
    // kv_batches entries of their own.
    const SequenceLayout &layout = params.sequences;
    // q, k and v of the configuration's dtype; o of the call's (16-bit, in its own swizzle with e4m3).
    const auto map_of = [&](const void *data, const TensorStrides &strides, int seqlen, int rows, int heads, int batch,
                            int box_rows, DType dtype = Kernel::config.dtype, int swizzle_bytes = Kernel::Swizzle::bytes) {
        return make_tensor_map(dtype, data, strides, params.d_head, VARIANT.varlen ? rows : seqlen, heads, batch, box_rows,
                               swizzle_bytes);
    };
    const int batch_q = VARIANT.varlen && layout.cu_seqlens_q != nullptr ? 1 : params.batch;
    const int batch_k = !VARIANT.varlen              ? params.batch
                        : layout.cu_seqlens_k != nullptr ? 1
                        : layout.kv_batch_idx != nullptr ? layout.kv_batches
                                                         : params.batch;
    // A paged cache's k and v: (d_head, page_size, heads_kv, num_pages) views of the pools, whose
    // boxes never straddle two pages.
    const PagedKV &paged = layout.paged;
    const bool paged_kv = VARIANT.varlen && paged.block_table != nullptr;
    const int kv_box_rows = paged_kv ? std::gcd(paged.page_size, Kernel::KV_slice_rows) : Kernel::KV_slice_rows;
    const auto kv_map_of = [&](const void *data, const TensorStrides &strides) {
        if (paged_kv)
            return make_tensor_map(Kernel::config.dtype, data, strides, params.d_head, paged.page_size, params.heads_kv,
                                   paged.num_pages, kv_box_rows, Kernel::Swizzle::bytes);
        return map_of(data, strides, params.seqlen_k, layout.rows_k, params.heads_kv, batch_k, kv_box_rows);
    };
    // V's transposed copy, written first: its columns are the keys, its rows d_head, each box one
    // column block of a transposed V tile. The box has the configuration's rows, the bytes the stage's
    // barrier waits for; under a smaller head, TMA fills the rows past the call's with zeros.
    const auto v_map = [&] {
        if constexpr (Kernel::V_transposed_copy) {
            copy_V_transposed<Kernel::d_head>(params, params.scratch, stream);
            const TransposedVLayout copy(params);
            return make_tensor_map(Kernel::config.dtype, params.scratch, copy.strides(), static_cast<int>(copy.row_keys),
                                   params.d_head, params.heads_kv, params.batch, Kernel::d_head, Kernel::Vt_Swizzle::bytes);
        } else {
            return kv_map_of(params.v, params.v_strides);
        }
    };
    CUtensorMap *sequence_maps = nullptr;
    if constexpr (VARIANT.varlen) {
        const VarlenScratch<Kernel, VARIANT> scratch(params);
        sequence_maps = reinterpret_cast<CUtensorMap *>(static_cast<uint8_t *>(params.scratch) + scratch.maps_offset);
        plan_varlen_work(params, scratch.plan, Kernel::B_r, Kernel::cluster_size, VARIANT.mask != MaskKind::NONE,
                         Kernel::KV_row_bytes, stream);
    }
    const KernelParams kp{
        params,
        map_of(params.q, params.q_strides, params.seqlen_q, layout.rows_q, params.heads_q, batch_q, WGMMA_M),
        kv_map_of(params.k, params.k_strides),
        v_map(),
        map_of(params.o, params.o_strides, params.seqlen_q, layout.rows_q, params.heads_q, batch_q, WGMMA_M,
               Kernel::fp8 ? params.o_dtype : Kernel::config.dtype, Kernel::O_Swizzle::bytes),
        sequence_maps,
        kv_box_rows,
    };
    LaunchShape<Kernel, VARIANT> shape(params);
    shape.config.stream = stream;
    check_cuda(cudaLaunchKernelEx(&shape.config, kernel, kp), "cudaLaunchKernelEx");
}

template <HopperForwardKernelConfig CFG, ProblemVariant VARIANT>
ForwardLauncher launcher() {
    using Kernel = StaticHopperKernelConfig<CFG>;
    constexpr bool moves = Kernel::moves_registers;
    return ForwardLauncher{reinterpret_cast<const void *>(kernel_of<Kernel, VARIANT>),
                           Kernel::smem_bytes,
                           moves ? Kernel::template producer_registers<VARIANT.varlen> : 0,
                           moves ? Kernel::template consumer_registers<VARIANT.varlen> : 0,
                           Kernel::persistent,
                           false,
                           VARIANT.varlen                ? &varlen_scratch_bytes<Kernel, VARIANT>
                           : Kernel::V_transposed_copy ? &transposed_v_bytes
                                                         : nullptr,
                           &launch<Kernel, VARIANT>};
}

} // namespace flash::sm90
