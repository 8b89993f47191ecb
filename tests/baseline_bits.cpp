// Prints the bits of the measured half of the tolerance policy on every
// fixture given: each plain formulation's out and probe, each plain backward's
// gradients, and the measured limits and bounds derived from them, as one
// hash per fixture. Built twice (tests/CMakeLists.txt): with the project's
// flags, and with FMA contraction allowed; the two must print the same, which
// holds only while the files that promise the same bits on every machine are
// compiled without contraction.
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fixtures/fixture.hpp"
#include "verify/backward_baseline.hpp"
#include "verify/baseline.hpp"
#include "verify/tolerance.hpp"

using namespace attn;

namespace {

struct Hash {
  std::uint64_t value = 1469598103934665603ull;  // FNV-1a
  void add(double x) {
    std::uint64_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    for (int byte = 0; byte < 8; ++byte) value = (value ^ ((bits >> (8 * byte)) & 0xff)) * 1099511628211ull;
  }
  void add(const std::vector<double>& xs) {
    for (double x : xs) add(x);
  }
  void add(const ReferenceGradients& g) {
    for (const auto* part : {&g.dq, &g.dk, &g.dv, &g.dbias, &g.dsinks}) add(*part);
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (!__builtin_cpu_supports("fma")) {
    std::puts("this CPU has no FMA: nothing to compare");
    return 77;  // SKIP_RETURN_CODE
  }
  for (const auto& file : find_fixture_files(std::vector<std::filesystem::path>(argv + 1, argv + argc))) {
    const Fixture f = read_fixture(file);
    const Problem& p = f.problem();
    Hash h;
    ReferenceStats stats;
    const ReferenceResult truth = reference_attention(f.data, &stats, 1);
    const BaselineFamily family = baseline_family(f.data, 1);
    for (const auto& out : family.out) h.add(out);
    for (const auto& probe : family.probe) h.add(probe);
    std::vector<char> counts(stats.visible.size());
    for (std::size_t r = 0; r < counts.size(); ++r) counts[r] = stats.visible[r] > 0;
    const MeasuredLimit m = measured_limit(p.dtype, truth.out, family.out, forward_floor_magnitude(p, stats), p.head_dim_v,
                                           counts, p.seq_k);
    h.add(m.baseline_max), h.add(m.baseline_rms), h.add(m.floor_max), h.add(m.floor_rms);
    h.add(derive_bounds(p, truth.out, truth.lse, stats).out);
    if (f.gradients) {
      const GradientBounds g = derive_gradient_bounds(f.data, f.gradients->dout, truth, stats, f.gradients->bias_requires_grad);
      h.add(g.bound);
      h.add(g.magnitude);
      for (const ReferenceGradients& plain :
           baseline_backward_family(f.data, f.gradients->dout, family.out.front(), f.gradients->bias_requires_grad)) {
        h.add(plain);
      }
    }
    std::printf("%016llx %s\n", static_cast<unsigned long long>(h.value), f.header.name.c_str());
  }
  return 0;
}
