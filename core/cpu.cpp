#include "core/cpu.hpp"

#include <cpuid.h>
#include <fmt/format.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>

#include "attnbench/error.hpp"
#include "core/instruction_loops.hpp"

namespace attn {

namespace {

bool cpu_has_amx_bf16() {
  unsigned eax, ebx, ecx, edx;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const bool tile = edx & (1u << 24), bf16 = edx & (1u << 22);
  return tile && bf16;
}

// Linux hands out the 8 KiB of AMX tile state only on request (5.16 and
// later): permission to use the XTILEDATA state component (18), per process.
bool os_grants_tiles() {
  constexpr long kReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    __builtin_cpu_init();
    CpuFeatures f;
    f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    f.avx512_bf16 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                    __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("fma");
    f.avx512_vbmi = f.avx512_bf16 && __builtin_cpu_supports("avx512vbmi");
    f.amx_bf16 = f.avx512_bf16 && cpu_has_amx_bf16() && os_grants_tiles();
    return f;
  }();
  return features;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? std::string() : line.substr(start);
  }
  return {};
}

std::string_view cpu_kernel_set() {
  static const std::string_view chosen = []() -> std::string_view {
    const CpuFeatures& f = cpu_features();
    const char* env = std::getenv("ATTN_CPU_ISA");
    const std::string forced = env ? env : "";
    if (forced.empty()) return f.amx_bf16 ? "amx_bf16" : f.avx512_vbmi ? "avx512_vbmi" : f.avx512_bf16 ? "avx512_bf16" : "portable";
    if (forced == "portable") return "portable";
    if (forced == "avx512" && f.avx512_bf16) return "avx512_bf16";
    if (forced == "avx512_vbmi" && f.avx512_vbmi) return "avx512_vbmi";
    if (forced == "amx" && f.amx_bf16) return "amx_bf16";
    if (forced == "avx512" || forced == "avx512_vbmi" || forced == "amx") {
      throw Error(fmt::format("ATTN_CPU_ISA={}: this CPU (or the OS) does not allow it; leave it unset to pick the best", forced));
    }
    throw Error(fmt::format("ATTN_CPU_ISA={}: expected amx, avx512_vbmi, avx512 or portable", forced));
  }();
  return chosen;
}

bool is_avx512_set(std::string_view set) { return set == "avx512_bf16" || set == "avx512_vbmi"; }

namespace {

// The best of five interleaved runs of each loop, a few hundred microseconds
// apiece, in flops per second: on a shared VM a run now and then loses its
// core for part of it, and the fastest is the core's rate.
std::pair<double, double> dot_and_fma_rates() {
  using Clock = std::chrono::steady_clock;
  constexpr std::int64_t kIterations = 1 << 13;
  volatile double sink = 0;
  double dot = 0, fma = 0;
  auto rate = [&](auto loop, double flops) {
    const auto start = Clock::now();
    sink = sink + loop(kIterations);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return seconds > 0 ? flops * static_cast<double>(kIterations) / seconds : 0.0;
  };
  for (int run = 0; run < 5; ++run) {
    dot = std::max(dot, rate(loops::dot_bf16_avx512, loops::kDotBf16Flops));
    fma = std::max(fma, rate(loops::fma_avx512, loops::kFmaAvx512Flops));
  }
  return {dot, fma};
}

}  // namespace

const Bf16Products& bf16_products() {
  static const Bf16Products chosen = [] {
    Bf16Products b;
    const std::string_view set = cpu_kernel_set();
    if (const char* env = std::getenv("ATTN_BF16_PRODUCTS"); env && *env) {
      const std::string forced = env;
      if (forced != "dot" && forced != "float32") throw Error(fmt::format("ATTN_BF16_PRODUCTS={}: expected dot or float32", forced));
      b.dot = forced == "dot";
      b.why = fmt::format("ATTN_BF16_PRODUCTS={}", forced);
      return b;
    }
    if (!is_avx512_set(set)) {
      b.why = set == "amx_bf16" ? "AMX tiles (not measured)" : "the portable set (not measured)";
      return b;
    }
    const auto [dot, fma] = dot_and_fma_rates();
    b.dot_gflops = dot / 1e9;
    b.fma_gflops = fma / 1e9;
    b.dot = dot > fma;
    b.why = fmt::format("vdpbf16ps {:.0f} against FMA {:.0f} GFLOP/s on one core, measured", b.dot_gflops, b.fma_gflops);
    return b;
  }();
  return chosen;
}

}  // namespace attn
