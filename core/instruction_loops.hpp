// Loops of one instruction each, to measure a core's rate of it: `attn peak`
// times them on every thread, and the CPU backends once on one thread to
// choose how bfloat16 cases multiply (cpu.hpp's bf16_products). Each call
// runs `iterations` rounds of kChains independent instructions and returns a
// value the caller must keep (so the loop cannot be dropped). The AVX-512
// loops need cpu_features().avx512_bf16.
#pragma once

#include <cstdint>

namespace attn::loops {

inline constexpr int kChains = 24;  // independent chains: enough to cover the latency on every pipe

// kChains vfmadd231ps zmm a round: 2 flops per lane.
double fma_avx512(std::int64_t iterations);
inline constexpr double kFmaAvx512Flops = kChains * 16.0 * 2;

// kChains vdpbf16ps zmm a round: 4 flops per float32 lane (2 products, 2 adds).
double dot_bf16_avx512(std::int64_t iterations);
inline constexpr double kDotBf16Flops = kChains * 16.0 * 4;

}  // namespace attn::loops
