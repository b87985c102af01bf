// Host-side CUDA helpers for the binding and the launchers: error checks that raise, the
// shared-memory limit raised once per kernel and device, the SM count, timing events that are
// always destroyed.
#pragma once

#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include <cuda_runtime.h>

namespace flash {

// Throws std::runtime_error (RuntimeError in Python) naming what failed.
inline void check_cuda(cudaError_t status, const char *what) {
    if (status != cudaSuccess)
        throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(status));
}

// Kernels start with a 48 KB dynamic shared-memory limit; raises it to what `kernel` uses, once per
// (device, kernel), the first time the kernel runs on the current device.
inline void ensure_dynamic_smem_limit(const void *kernel, int smem_bytes) {
    static std::mutex mutex;
    static std::set<std::pair<int, const void *>> raised;
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    const std::lock_guard<std::mutex> lock(mutex);
    if (raised.count({device, kernel}))
        return;
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes),
               "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    raised.insert({device, kernel});
}

// The current device's multiprocessor count, read once per device.
inline int multiprocessor_count() {
    static std::mutex mutex;
    static std::map<int, int> counts;
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    const std::lock_guard<std::mutex> lock(mutex);
    auto found = counts.find(device);
    if (found == counts.end()) {
        int count = 0;
        check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
        found = counts.emplace(device, count).first;
    }
    return found->second;
}

// A start/stop pair of CUDA events around work on one stream; destroyed with the object, so an
// exception between the two records leaks nothing.
class EventTimer {
  public:
    explicit EventTimer(cudaStream_t stream) : stream_(stream) {
        check_cuda(cudaEventCreate(&start_), "cudaEventCreate");
        const cudaError_t status = cudaEventCreate(&stop_);
        if (status != cudaSuccess) {
            cudaEventDestroy(start_);
            check_cuda(status, "cudaEventCreate");
        }
    }
    EventTimer(const EventTimer &) = delete;
    EventTimer &operator=(const EventTimer &) = delete;
    ~EventTimer() {
        cudaEventDestroy(start_);
        cudaEventDestroy(stop_);
    }

    void start() { check_cuda(cudaEventRecord(start_, stream_), "cudaEventRecord"); }
    void stop() { check_cuda(cudaEventRecord(stop_, stream_), "cudaEventRecord"); }

    // Waits for the stop event and returns the time between the two records.
    float elapsed_ms() {
        check_cuda(cudaEventSynchronize(stop_), "cudaEventSynchronize");
        float ms = 0.0f;
        check_cuda(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
        return ms;
    }

  private:
    cudaStream_t stream_;
    cudaEvent_t start_ = nullptr;
    cudaEvent_t stop_ = nullptr;
};

} // namespace flash
