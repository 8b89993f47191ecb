#include "core/layer_data.hpp"

namespace attn {

std::vector<double> split_heads(const std::vector<double>& x, std::int64_t batch, std::int64_t seq, std::int64_t heads,
                                std::int64_t dim) {
  std::vector<double> out(x.size());
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t s = 0; s < seq; ++s)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t d = 0; d < dim; ++d) {
          out[static_cast<std::size_t>(((b * heads + h) * seq + s) * dim + d)] =
              x[static_cast<std::size_t>(((b * seq + s) * heads + h) * dim + d)];
        }
  return out;
}

std::vector<double> merge_heads(const std::vector<double>& x, std::int64_t batch, std::int64_t heads, std::int64_t seq,
                                std::int64_t dim) {
  std::vector<double> out(x.size());
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t s = 0; s < seq; ++s)
        for (std::int64_t d = 0; d < dim; ++d) {
          out[static_cast<std::size_t>(((b * seq + s) * heads + h) * dim + d)] =
              x[static_cast<std::size_t>(((b * heads + h) * seq + s) * dim + d)];
        }
  return out;
}

}  // namespace attn
