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

// An attribute of the current device, read once per (device, attribute): a launch path may ask on
// every call.
inline int device_attribute(cudaDeviceAttr attribute) {
    static std::mutex mutex;
    static std::map<std::pair<int, cudaDeviceAttr>, int> values;
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    const std::lock_guard<std::mutex> lock(mutex);
    auto found = values.find({device, attribute});
    if (found == values.end()) {
        int value = 0;
        check_cuda(cudaDeviceGetAttribute(&value, attribute, device), "cudaDeviceGetAttribute");
        found = values.emplace(std::pair{device, attribute}, value).first;
    }
    return found->second;
}

inline int multiprocessor_count() { return device_attribute(cudaDevAttrMultiProcessorCount); }

// Whether the current device overlaps a kernel launched with programmatic stream serialization with
// the one before it (ptx::allow_dependent_launch): compute capability 9.0 and later.
inline bool overlaps_dependent_launches() { return device_attribute(cudaDevAttrComputeCapabilityMajor) >= 9; }

// The launch attribute that lets a kernel start before the one ahead of it in the stream ends
// (programmatic stream serialization): it waits for that one's writes in
// ptx::wait_for_prerequisite_grids.
inline cudaLaunchAttribute dependent_launch_attribute() {
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    return attribute;
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
