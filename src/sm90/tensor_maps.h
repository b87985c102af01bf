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

// The tensor map of `dims` dimensions (d_head first) with these byte strides of dimensions 1 ..
// dims - 1, copied in boxes of one swizzled row's columns (swizzle_bytes, 128 or 64) by box_rows
// rows, with that swizzle; reads past the tensor's edges give zeros and writes there are dropped.
inline CUtensorMap encode_tensor_map(DType dtype, const void *data, int dims, const cuuint64_t *extents,
                                     const cuuint64_t *byte_strides, int box_rows, int swizzle_bytes) {
    const cuuint32_t box[5] = {static_cast<cuuint32_t>(swizzle_bytes / ELEMENT_BYTES), static_cast<cuuint32_t>(box_rows),
                               1, 1, 1};
    const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
    CUtensorMap map;
    const CUresult status = tensor_map_encoder()(
        &map, dtype == DType::FP16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        static_cast<cuuint32_t>(dims), const_cast<void *>(data), extents, byte_strides, box, element_strides,
        CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (status != CUDA_SUCCESS)
        throw std::runtime_error("cuTensorMapEncodeTiled failed (CUresult " + std::to_string(static_cast<int>(status)) + ")");
    return map;
}

// TMA wants every stride a multiple of 16 bytes: the binding guarantees it for dimensions longer
// than 1, and the stride of a dimension of extent 1 is never used, so 16 stands in for it.
inline cuuint64_t stride_bytes(int64_t extent, int64_t stride) {
    return static_cast<cuuint64_t>(extent > 1 ? stride * ELEMENT_BYTES : COPY_BYTES);
}

// A (d_head, seq, heads, batch) view of one (batch, seq, heads, d_head) tensor: the box at
// coordinates (column, row, head, batch).
inline CUtensorMap make_tensor_map(DType dtype, const void *data, const TensorStrides &strides, int d_head, int seqlen,
                                   int heads, int batch, int box_rows, int swizzle_bytes) {
    const cuuint64_t extents[4] = {static_cast<cuuint64_t>(d_head), static_cast<cuuint64_t>(seqlen),
                                   static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
    const cuuint64_t byte_strides[3] = {stride_bytes(seqlen, strides.seq), stride_bytes(heads, strides.head),
                                        stride_bytes(batch, strides.batch)};
    return encode_tensor_map(dtype, data, 4, extents, byte_strides, box_rows, swizzle_bytes);
}

// The view of a varlen call's tensor (rows the length of its seq dimension) whose bounds stop at
// each sequence's end: row r of the sequence whose used rows are start .. start + length - 1 is
// the element at (column, rows - length + r, start + length, head, batch) of a
// (d_head, rows, rows + 1, heads, batch) view whose two row dimensions both step one row, from
// `rows` rows before the data. The second row coordinate places the box; the first is in bounds
// exactly for r < length, so a box reads zeros and drops writes past the sequence's end, as a
// dense tensor's map does past the tensor's.
inline CUtensorMap make_sequence_tensor_map(DType dtype, const void *data, const TensorStrides &strides, int d_head,
                                            int rows, int heads, int batch, int box_rows, int swizzle_bytes) {
    const cuuint64_t extents[5] = {static_cast<cuuint64_t>(d_head), static_cast<cuuint64_t>(rows),
                                   static_cast<cuuint64_t>(rows) + 1, static_cast<cuuint64_t>(heads),
                                   static_cast<cuuint64_t>(batch)};
    const cuuint64_t row_stride = stride_bytes(rows, strides.seq);
    const cuuint64_t byte_strides[4] = {row_stride, row_stride, stride_bytes(heads, strides.head),
                                        stride_bytes(batch, strides.batch)};
    const void *origin = static_cast<const uint8_t *>(data) - static_cast<int64_t>(rows) * static_cast<int64_t>(row_stride);
    return encode_tensor_map(dtype, origin, 5, extents, byte_strides, box_rows, swizzle_bytes);
}

} // namespace flash::sm90
