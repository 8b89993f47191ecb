#include "bench/matrix.hpp"

#include <fmt/format.h>

#include "core/error.hpp"

namespace attn::bench {

namespace {

std::string shape(const char* dtype, int heads_q, int heads_kv, int seq_q, int seq_k, int head_dim, const char* causal) {
  std::string s = fmt::format("dtype={},b=1,hq={},hkv={},sq={},sk={},d={}", dtype, heads_q, heads_kv, seq_q, seq_k, head_dim);
  if (std::string_view(causal) != "none") s += fmt::format(",causal={}", causal);
  return s;
}

}  // namespace

std::vector<Problem> benchmark_problems(const std::string& preset) {
  std::vector<std::string> shapes;
  if (preset == "quick") {
    for (int seq : {1024, 4096}) {
      shapes.push_back(shape("f32", 8, 8, seq, seq, 64, "none"));
      shapes.push_back(shape("bf16", 8, 8, seq, seq, 64, "none"));
    }
    shapes.push_back(shape("f32", 8, 8, 4096, 4096, 64, "bottom_right"));
    shapes.push_back(shape("f32", 8, 8, 1, 65536, 64, "none"));
  } else if (preset == "gpu") {
    // The GPU check: seq 1024 to 16384 at 16k tokens per batch, head_dim 64 and
    // 128, bfloat16 and float16, causal and not.
    for (const char* dtype : {"bf16", "f16"})
      for (const char* causal : {"none", "bottom_right"})
        for (int head_dim : {64, 128})
          for (int seq : {1024, 2048, 4096, 8192, 16384}) {
            std::string s = fmt::format("dtype={},b={},hq={},hkv={},sq={},sk={},d={}", dtype, 16384 / seq, 2048 / head_dim,
                                        2048 / head_dim, seq, seq, head_dim);
            if (std::string_view(causal) != "none") s += fmt::format(",causal={}", causal);
            shapes.push_back(s);
          }
  } else if (preset == "standard" || preset == "full") {
    const bool full = preset == "full";
    std::vector<int> seqs = full ? std::vector<int>{512, 1024, 2048, 4096, 8192, 16384} : std::vector<int>{512, 1024, 2048, 4096};
    for (const char* dtype : {"f32", "bf16", "f16"})
      for (const char* causal : {"none", "bottom_right"})
        for (int head_dim : {64, 128})
          for (int seq : seqs) {
            if (!full && head_dim == 128 && std::string_view(dtype) != "f32") continue;
            shapes.push_back(shape(dtype, 8, 8, seq, seq, head_dim, causal));
          }
    for (int seq : {1024, 4096}) {
      shapes.push_back(shape("f32", 16, 16, seq, seq, 64, "none"));
      shapes.push_back(shape("f32", 16, 2, seq, seq, 64, "none"));  // GQA 8:1
      shapes.push_back(shape("bf16", 16, 2, seq, seq, 64, "none"));
    }
    for (int seq_k : {4096, 16384, 65536})
      for (int heads_kv : {8, 1}) shapes.push_back(shape("f32", 8, heads_kv, 1, seq_k, 64, "none"));
  } else {
    throw Error(fmt::format("unknown preset '{}' (quick, standard, full, gpu)", preset));
  }
  std::vector<Problem> problems;
  for (const auto& s : shapes) problems.push_back(Problem::parse(s));
  return problems;
}

double useful_flops(const Problem& p) {
  return 2.0 * static_cast<double>(p.head_dim + p.head_dim_v) * static_cast<double>(p.batch * p.heads_q) *
         static_cast<double>(p.causal_visible_pairs());
}

double kv_bytes(const Problem& p) {
  return static_cast<double>(p.k_elements() + p.v_elements()) * static_cast<double>(dtype_size(p.dtype));
}

}  // namespace attn::bench
