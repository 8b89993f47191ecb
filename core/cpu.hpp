// What this CPU and its OS allow, asked once: the instruction sets the CPU
// kernels and the peak measurements dispatch on, and which kernel set the CPU
// backends use (ATTN_CPU_ISA forces one). The tools read it for host lines,
// reproduce commands and peaks without reaching into a backend's folder.
#pragma once

#include <string>
#include <string_view>

namespace attn {

struct CpuFeatures {
  bool avx2_fma = false;     // AVX2 and FMA
  bool avx512_bf16 = false;  // AVX-512 F, BW, VL, DQ and BF16, and FMA: the avx512_bf16 kernel set
  bool avx512_vbmi = false;  // those and AVX512_VBMI: the avx512_vbmi kernel set
  bool amx_bf16 = false;     // AMX-TILE and AMX-BF16, and Linux granted the tile state
};
const CpuFeatures& cpu_features();

// The CPU's model name from /proc/cpuinfo ("" when there is none).
std::string cpu_model_name();

// The kernel set the CPU backends use: "amx_bf16", "avx512_vbmi",
// "avx512_bf16" or "portable", the best this CPU allows unless
// ATTN_CPU_ISA=amx|avx512_vbmi|avx512|portable forces one (avx512: without
// VBMI). Throws attn::Error for an unknown value or one this CPU refuses.
std::string_view cpu_kernel_set();
// The avx512_bf16 or avx512_vbmi set, the ones whose bfloat16 products are
// measured (bf16_products).
bool is_avx512_set(std::string_view set);

// How the CPU backends multiply bfloat16 cases: in bfloat16 pairs (dot:
// vdpbf16ps, AMX tiles, or the portable set's), or widened to float32 and
// multiplied by FMA. With the avx512_bf16 set it is measured once per process
// on one core (about 2 ms): pairs when vdpbf16ps gives more flops than FMA
// (AMD EPYC family 25 model 17: twice as many; an Intel Xeon family 6 model
// 207 gave less than half). ATTN_BF16_PRODUCTS=dot|float32 forces one (both
// stay tested); attn::Error for another value.
struct Bf16Products {
  bool dot = true;
  double dot_gflops = 0, fma_gflops = 0;  // one core's, when measured
  std::string why;                        // for attn list and the benchmarks' context
};
const Bf16Products& bf16_products();

}  // namespace attn
