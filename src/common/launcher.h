// What the registry maps a (family configuration, problem variant) to: everything the binding needs
// to run and describe one compiled kernel without including any kernel code.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "forward_params.h"

namespace flash {

struct ForwardLauncher {
    // The __global__ function, for attribute queries (registers, spills).
    const void *kernel;
    // Dynamic shared memory of one block.
    int smem_bytes;
    // The registers per thread that setmaxnreg leaves the producer warpgroup and gives each consumer
    // warpgroup (the Hopper family's warp-specialized kernels); 0 where the kernel moves none.
    int producer_registers;
    int consumer_registers;
    // Whether the kernel needs ForwardParams::work_counter: the binding then zeroes one per call.
    bool needs_work_counter;
    // Whether it reads q and writes o at ForwardParams::q_query_stride and o_query_stride, so that
    // grouped heads packed as rows run on the call's tensors in place (else on packed copies).
    bool reads_grouped_rows;
    // How many bytes of ForwardParams::scratch the kernel needs for a call (null: none).
    int64_t (*scratch_bytes)(const ForwardParams &params);
    // Computes the grid and block, raises the kernel's shared-memory limit on first use on the
    // current device, and launches on `stream`; throws std::runtime_error on a CUDA error.
    void (*launch)(const ForwardParams &params, cudaStream_t stream);
};

} // namespace flash
