// Host side: the TMA tensor maps of a call's tensors, encoded by the driver. The driver's encoder
// is reached through the runtime's entry-point query, so the extension needs no link to libcuda.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include <cuda.h>
#include <cuda_runtime.h>

#include "common/common.h"
#include "common/cuda_utils.cuh"
#include "common/dtype.h"
#include "common/forward_params.h"

namespace flash::sm90 {

using EncodeTiled = CUresult (*)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                 const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiled tensor_map_encoder() {
    static const EncodeTiled encoder = [] {
        void *function = nullptr;
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
        check_cuda(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found),
                   "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
        if (found != cudaDriverEntryPointSuccess || function == nullptr)
            throw std::runtime_error("the CUDA driver has no cuTensorMapEncodeTiled; TMA needs a driver for CUDA 12.0 or newer");
        return reinterpret_cast<EncodeTiled>(function);
    }();
    return encoder;
}

// A (d_head, seq, heads, batch) view of one (batch, seq, heads, d_head) tensor of `dtype` (e4m3 as
// bytes: TMA only moves them), copied in boxes of one swizzled row's columns (swizzle_bytes, 128, 64
// or 32) by box_rows rows, with that swizzle; reads
// past the tensor's edges give zeros and writes there are dropped. TMA wants every stride a
// multiple of 16 bytes: the binding guarantees it for dimensions longer than 1, and the stride of
// a dimension of extent 1 is never used, so 16 stands in for it.
inline CUtensorMap make_tensor_map(DType dtype, const void *data, const TensorStrides &strides, int d_head, int seqlen,
                                   int heads, int batch, int box_rows, int swizzle_bytes) {
    const int bytes = element_bytes(dtype);
    const auto stride_bytes = [&](int extent, int64_t stride) {
        return static_cast<cuuint64_t>(extent > 1 ? stride * bytes : COPY_BYTES);
    };
    const cuuint64_t dims[4] = {static_cast<cuuint64_t>(d_head), static_cast<cuuint64_t>(seqlen),
                                static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
    const cuuint64_t byte_strides[3] = {stride_bytes(seqlen, strides.seq), stride_bytes(heads, strides.head),
                                        stride_bytes(batch, strides.batch)};
    const cuuint32_t box[4] = {static_cast<cuuint32_t>(swizzle_bytes / bytes), static_cast<cuuint32_t>(box_rows), 1, 1};
    const CUtensorMapDataType type = dtype == DType::FP16   ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                     : dtype == DType::BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                            : CU_TENSOR_MAP_DATA_TYPE_UINT8;
    const cuuint32_t element_strides[4] = {1, 1, 1, 1};
    CUtensorMap map;
    const CUresult status = tensor_map_encoder()(
        &map, type, 4,
        const_cast<void *>(data), dims, byte_strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
        swizzle_bytes == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
        : swizzle_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                              : CU_TENSOR_MAP_SWIZZLE_32B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (status != CUDA_SUCCESS)
        throw std::runtime_error("cuTensorMapEncodeTiled failed (CUresult " + std::to_string(static_cast<int>(status)) + ")");
    return map;
}

} // namespace flash::sm90
