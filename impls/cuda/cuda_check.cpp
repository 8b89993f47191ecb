#include <dlfcn.h>
#include <fmt/format.h>

#include "attnbench/error.hpp"
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
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess && count > 0) return Status::yes();
  cudaGetLastError();  // clear it
  // The runtime says "driver version is insufficient" also when there is no
  // driver at all: tell the cases apart.
  if (void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) {
    ::dlclose(driver);
  } else {
    return Status::no("no NVIDIA driver on this machine (libcuda.so.1 cannot be loaded)");
  }
  if (status == cudaSuccess || status == cudaErrorNoDevice) {
    return Status::no("no CUDA device (the NVIDIA driver is installed but sees no GPU)");
  }
  if (status == cudaErrorInsufficientDriver) {
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    return Status::no(fmt::format("the NVIDIA driver supports CUDA up to {}.{}, older than this build's runtime {}.{}",
                                  driver / 1000, driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10));
  }
  return Status::no(fmt::format("no usable CUDA device: {} ({})", cudaGetErrorString(status), cudaGetErrorName(status)));
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
