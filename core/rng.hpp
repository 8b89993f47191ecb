// A portable random number generator: xoshiro256** seeded by splitmix64, with
// uniform and normal transforms of our own so that the same seed gives the
// same bits on every machine and standard library (std::normal_distribution
// does not). Used to generate fixtures.
#pragma once

#include <cstdint>
#include <string_view>

namespace attn {

class Rng {
 public:
  explicit Rng(std::uint64_t seed);
  // Seed from a string (e.g. a fixture name) with FNV-1a.
  static Rng from_name(std::string_view name);

  std::uint64_t next();
  double uniform();                                // [0, 1), 53 random bits
  double uniform(double lo, double hi);            // [lo, hi)
  std::int64_t uniform_int(std::int64_t lo, std::int64_t hi);  // [lo, hi], unbiased
  double normal();                                 // mean 0, variance 1 (Marsaglia polar)

 private:
  std::uint64_t s_[4];
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace attn
