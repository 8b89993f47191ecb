// The one wrapper around CUDA runtime and cuBLAS status codes: every call goes
// through ATTN_CUDA / ATTN_CUBLAS, which throw attn::Error naming the call,
// the file and line, and what CUDA said.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "attnbench/backend.hpp"

#define ATTN_CUDA(call)                                                                              \
  do {                                                                                               \
    cudaError_t attn_status_ = (call);                                                               \
    if (attn_status_ != cudaSuccess) ::attn::cuda::throw_cuda(attn_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define ATTN_CUBLAS(call)                                                                                       \
  do {                                                                                                          \
    cublasStatus_t attn_status_ = (call);                                                                       \
    if (attn_status_ != CUBLAS_STATUS_SUCCESS) ::attn::cuda::throw_cublas(attn_status_, #call, __FILE__, __LINE__); \
  } while (0)

namespace attn::cuda {

[[noreturn]] void throw_cuda(cudaError_t status, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas(cublasStatus_t status, const char* call, const char* file, int line);

// Whether a CUDA device can be used here, with the reason when not.
Status device_status();

// Seconds `launch` keeps the device busy, measured with CUDA events.
template <typename Launch> double time_on_device(Launch&& launch) {
  cudaEvent_t start, stop;
  ATTN_CUDA(cudaEventCreate(&start));
  ATTN_CUDA(cudaEventCreate(&stop));
  ATTN_CUDA(cudaEventRecord(start));
  launch();
  ATTN_CUDA(cudaEventRecord(stop));
  ATTN_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  ATTN_CUDA(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / 1000.0;
}

// Device memory owned by RAII.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), bytes_(other.bytes_) { other.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  ~DeviceBuffer();
  void* get() const { return ptr_; }
  std::size_t size() const { return bytes_; }
  void upload(const void* host, std::size_t bytes);
  void download(void* host, std::size_t bytes) const;

 private:
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace attn::cuda

