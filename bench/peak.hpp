// This machine's limits, measured in a few seconds: float32 FMA throughput,
// bfloat16 dot-product throughput and memory read bandwidth, with all the
// threads a backend would use. Reports state results as fractions of these.
#pragma once

#include <string>

namespace attn::bench {

struct MachinePeak {
  double fp32_gflops = 0;      // 2 flops per FMA lane (AVX-512, else AVX2, else plain C++)
  double bf16_gflops = 0;      // 4 flops per vdpbf16ps lane (2 products, 2 adds); 0 without AVX512_BF16
  double amx_bf16_gflops = 0;  // TDPBF16PS tiles; 0 without AMX (or when Linux refuses the tile state)
  double bandwidth_gbs = 0;    // streaming reads of a buffer far larger than the caches
  int threads = 1;
  std::string isa;             // the CPU backends' kernel set (cpu_kernel_set()): "amx_bf16", "avx512_vbmi", "avx512_bf16" or "portable"
};

MachinePeak measure_peak(int threads, double seconds_per_test = 0.5);

}  // namespace attn::bench
