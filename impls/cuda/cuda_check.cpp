#include <fmt/format.h>

#include "core/error.hpp"
#include "impls/cuda/cuda_check.hpp"

namespace attn::cuda {

void throw_cuda(cudaError_t status, const char* call, const char* file, int line) {
  throw Error(fmt::format("CUDA {} failed at {}:{}: {} ({})", call, file, line, cudaGetErrorString(status),
                          cudaGetErrorName(status)));
}

void throw_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  throw Error(fmt::format("cuBLAS {} failed at {}:{}: {} (status {})", call, file, line, cublasGetStatusString(status),
                          static_cast<int>(status)));
}

Status device_status() {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear it
    return Status::no(fmt::format("no CUDA device ({})", cudaGetErrorString(status)));
  }
  if (count == 0) return Status::no("no CUDA device");
  return Status::yes();
}

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes > 0) ATTN_CUDA(cudaMalloc(&ptr_, bytes));
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  std::swap(ptr_, other.ptr_);
  std::swap(bytes_, other.bytes_);
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

void DeviceBuffer::upload(const void* host, std::size_t bytes) {
  if (bytes > 0) ATTN_CUDA(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* host, std::size_t bytes) const {
  if (bytes > 0) ATTN_CUDA(cudaMemcpy(host, ptr_, bytes, cudaMemcpyDeviceToHost));
}

}  // namespace attn::cuda
