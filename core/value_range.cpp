#include "attnbench/value_range.hpp"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>

#include "attnbench/error.hpp"

namespace attn {

namespace {

// Each term of a score in the log2 domain may be this large: its sum with
// the others (scaled product, ALiBi, bias), times log2(e), stays finite.
constexpr double kLargestTerm = std::numeric_limits<float>::max() / 16.0;
constexpr double kLog2e = 1.4426950408889634;

}  // namespace

Status float32_scores_fit(const Problem& p, const AttentionIO& io) {
  if (p.softcap != 0) {
    if (p.softcap * kLog2e > kLargestTerm) {
      return Status::no(fmt::format("softcap {:.6g} is beyond what float32 scores hold (at most {:.3g})", p.softcap,
                                    kLargestTerm / kLog2e));
    }
    if (p.softcap < std::numeric_limits<float>::min()) {
      return Status::no(fmt::format("softcap {:.6g} is below float32's normal range", p.softcap));
    }
  }
  // The largest distance from a diagonal to a key: fewer than seq_q + seq_k positions.
  const double distance = static_cast<double>(p.seq_q + p.seq_k);
  if (io.alibi_slopes) {
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      const double penalty = std::fabs(static_cast<double>(io.alibi_slopes[h])) * distance * kLog2e;
      if (penalty > kLargestTerm) {
        return Status::no(fmt::format("ALiBi slope {:.6g} of head {} over up to {} key positions gives penalties "
                                      "beyond what float32 scores hold",
                                      static_cast<double>(io.alibi_slopes[h]), h, p.seq_q + p.seq_k));
      }
    }
  }
  if (io.sinks) {
    for (std::int64_t h = 0; h < p.heads_q; ++h) {
      if (std::fabs(static_cast<double>(io.sinks[h])) * kLog2e > kLargestTerm) {
        return Status::no(fmt::format("sink {:.6g} of head {} is beyond what float32 scores hold",
                                      static_cast<double>(io.sinks[h]), h));
      }
    }
  }
  if (!io.bias.empty() && p.dtype == DType::f32) {  // 16-bit biases are far inside the range
    const Dims4& shape = io.bias.shape;
    auto extent = [&](int axis) { return io.bias.strides[static_cast<std::size_t>(axis)] == 0 ? 1 : shape[static_cast<std::size_t>(axis)]; };
    for (std::int64_t b = 0; b < extent(0); ++b)
      for (std::int64_t h = 0; h < extent(1); ++h)
        for (std::int64_t i = 0; i < extent(2); ++i)
          for (std::int64_t j = 0; j < shape[3]; ++j) {
            const double x = load_float(io.bias, io.bias.offset(b, h, i, j));
            if (std::isfinite(x) && std::fabs(x) * kLog2e > kLargestTerm) {
              return Status::no(fmt::format("bias {:.6g} is beyond what float32 scores hold", x));
            }
          }
  }
  return Status::yes();
}

double case_memory_limit_bytes() {
  const char* text = std::getenv("ATTN_MAX_CASE_GIB");
  double gib = 2.0;
  if (text != nullptr) {
    char* end = nullptr;
    const double value = std::strtod(text, &end);
    if (end != text && *end == '\0' && value > 0 && std::isfinite(value)) gib = value;
  }
  return gib * 1024.0 * 1024.0 * 1024.0;
}

double address_space_left() {
  struct rlimit limit {};
  if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return INFINITY;
  double mapped_pages = 0;
  std::ifstream statm("/proc/self/statm");  // first field: pages mapped (libraries, stacks, malloc's arenas)
  if (!(statm >> mapped_pages)) return INFINITY;
  return static_cast<double>(limit.rlim_cur) - mapped_pages * static_cast<double>(sysconf(_SC_PAGESIZE));
}

void require_workspace(double bytes, const char* what) {
  if (const double left = address_space_left(); bytes > left) {
    throw Unsupported(fmt::format("{} would take {:.2f} GiB, more than the {:.2f} GiB of address space this process "
                                  "may still map (ulimit -v)",
                                  what, bytes / (1 << 30), std::max(left, 0.0) / (1 << 30)));
  }
  const double limit = case_memory_limit_bytes();
  if (bytes > limit) {
    throw Unsupported(fmt::format("{} would take {:.2f} GiB, more than a case may use ({:.2f} GiB; ATTN_MAX_CASE_GIB "
                                  "raises it)",
                                  what, bytes / (1 << 30), limit / (1 << 30)));
  }
}

void require_float32_scores(const Problem& p, const AttentionIO& io) {
  const Status fits = float32_scores_fit(p, io);
  if (!fits) throw Unsupported(fits.reason);
}

}  // namespace attn
