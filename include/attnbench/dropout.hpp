// A counter-based dropout mask any backend may draw (the in-tree ones do):
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC 2011), the generator PyTorch and FlashAttention draw attention
// dropout from. Each bit is a function of (seed, offset, entry, head, query,
// key) alone, so a tile draws its own bits in any order, on any thread, and
// the backward replays the forward's mask without storing it.
//
// The verifier does not need this generator: it judges any backend's mask
// statistically (docs/verification/dropout.md). What it draws is written
// down there, so that another implementation can give the same bits.
#pragma once

#include <cstdint>

#include "attnbench/backend.hpp"
#include "attnbench/problem.hpp"

namespace attn {

struct Philox4x32 {
  std::uint32_t v[4];
};

// Philox4x32 with 10 rounds: the counter (c0 .. c3) under the key (k0, k1).
constexpr Philox4x32 philox4x32_10(Philox4x32 c, std::uint32_t k0, std::uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t a = std::uint64_t{0xD2511F53u} * c.v[0];
    const std::uint64_t b = std::uint64_t{0xCD9E8D57u} * c.v[2];
    c = {{static_cast<std::uint32_t>(b >> 32) ^ c.v[1] ^ k0, static_cast<std::uint32_t>(b),
          static_cast<std::uint32_t>(a >> 32) ^ c.v[3] ^ k1, static_cast<std::uint32_t>(a)}};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

// The mask of one DropoutView on one problem: element n = ((e * heads_q + h)
// * seq_q + i) * seq_k + j (e the batch entry, i the query's and j the key's
// positions within it) is word n mod 4 of philox4x32_10(counter = (low and
// high 32 bits of n / 4, low and high of offset), key = (low and high of
// seed)); the weight is dropped when that word is below floor(p * 2^32).
class DropoutMask {
 public:
  DropoutMask(const Problem& problem, const DropoutView& dropout)
      : heads_(problem.heads_q), seq_q_(problem.seq_q), seq_k_(problem.seq_k), seed_(dropout.seed),
        offset_(dropout.offset), threshold_(threshold_of(dropout.p)), keep_scale_(1.0 / (1.0 - dropout.p)) {}

  // Whether the weight of (e, h, i, j) is kept.
  bool keeps(std::int64_t e, std::int64_t h, std::int64_t i, std::int64_t j) const {
    const std::uint64_t n = index(e, h, i, j);
    return word(n / 4, static_cast<int>(n % 4)) >= threshold_;
  }
  // keep[t] = keeps(e, h, i, j0 + t) for t < count, one Philox call per four keys.
  void row(std::int64_t e, std::int64_t h, std::int64_t i, std::int64_t j0, std::int64_t count,
           std::uint8_t* keep) const {
    std::uint64_t n = index(e, h, i, j0);
    for (std::int64_t t = 0; t < count;) {
      const Philox4x32 r = draw(n / 4);
      for (std::uint64_t lane = n % 4; lane < 4 && t < count; ++lane, ++t, ++n) {
        keep[t] = r.v[lane] >= threshold_ ? 1 : 0;
      }
    }
  }
  // 1 / (1 - p) in float64; a float32 kernel rounds it once.
  double keep_scale() const { return keep_scale_; }

 private:
  static std::uint32_t threshold_of(double p) {
    const double t = p * 4294967296.0;
    return t <= 0 ? 0u : t >= 4294967295.0 ? 4294967295u : static_cast<std::uint32_t>(t);
  }
  std::uint64_t index(std::int64_t e, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return static_cast<std::uint64_t>(((e * heads_ + h) * seq_q_ + i) * seq_k_ + j);
  }
  Philox4x32 draw(std::uint64_t block) const {
    return philox4x32_10({{static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
                           static_cast<std::uint32_t>(offset_), static_cast<std::uint32_t>(offset_ >> 32)}},
                         static_cast<std::uint32_t>(seed_), static_cast<std::uint32_t>(seed_ >> 32));
  }
  std::uint32_t word(std::uint64_t block, int lane) const { return draw(block).v[lane]; }

  std::int64_t heads_, seq_q_, seq_k_;
  std::uint64_t seed_, offset_;
  std::uint32_t threshold_;
  double keep_scale_;
};

}  // namespace attn
