#include "bench/matrix.hpp"

#include <fmt/format.h>

#include "attnbench/error.hpp"
#include "core/rng.hpp"
#include "attnbench/sequences.hpp"

namespace attn::bench {

namespace {

std::string shape(const char* dtype, int heads_q, int heads_kv, int seq_q, int seq_k, int head_dim, const char* causal) {
  std::string s = fmt::format("dtype={},b=1,hq={},hkv={},sq={},sk={},d={}", dtype, heads_q, heads_kv, seq_q, seq_k, head_dim);
  if (std::string_view(causal) != "none") s += fmt::format(",causal={}", causal);
  return s;
}

// Format version 4 caches: K and V in one encoding, with the descales and
// scales serving stacks keep (fp8: one per (sequence, kv head); int8: one per
// token).
constexpr const char* kFp8Cache = ",kenc=e4m3,kdescale=head,venc=e4m3,vdescale=head";
constexpr const char* kQ8Cache = ",kenc=q8_0,venc=q8_0";
constexpr const char* kQ4Cache = ",kenc=q4_0,venc=q4_0";
// int8 with a scale per token of the paged decode below (a pool of 8 * 256 + 1 pages of 16, 8 kv heads).
constexpr const char* kInt8Cache = ",kenc=s8,kscale=2049x8x16x1,venc=s8,vscale=2049x8x16x1";

// A decode step of `batch` sequences of up to seq_k keys in pages of `page`,
// GQA heads_q:heads_kv; the pool holds every page an entry could use, and one.
std::string paged_decode(const char* dtype, int batch, int heads_q, int heads_kv, int seq_k, int head_dim, int page) {
  return fmt::format("dtype={},b={},hq={},hkv={},sq=1,sk={},d={},causal=bottom_right,paged={}x{}", dtype, batch, heads_q,
                     heads_kv, seq_k, head_dim, page, batch * (seq_k / page) + 1);
}

// A causal prefill of `entries` packed sequences of seq tokens in all
// (benchmark_sequences says how they share them).
std::string packed_prefill(const char* dtype, int entries, int heads, int seq, int head_dim) {
  return fmt::format("dtype={},b={},hq={},hkv={},sq={},sk={},d={},causal=bottom_right,ragged", dtype, entries, heads, heads,
                     seq, seq, head_dim);
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
    // Format version 2: a sliding-window prefill, a paged decode batch at
    // vLLM's default page size, a packed prefill batch.
    shapes.push_back(shape("f32", 8, 8, 4096, 4096, 64, "bottom_right") + ",wl=512");
    shapes.push_back(paged_decode("bf16", 8, 32, 8, 4096, 128, 16));
    shapes.push_back(packed_prefill("f32", 6, 8, 4096, 64));
    // Format version 4: the same paged decode from an fp8 and a Q8_0 cache.
    shapes.push_back(paged_decode("bf16", 8, 32, 8, 4096, 128, 16) + kFp8Cache);
    shapes.push_back(paged_decode("bf16", 8, 32, 8, 4096, 128, 16) + kQ8Cache);
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
    for (int seq_k : {4096, 65536})
      for (int heads_kv : {8, 1}) shapes.push_back(shape("bf16", 8, heads_kv, 1, seq_k, 64, "none"));
    // Format version 2: sliding-window prefill (Mistral's 4096 window scaled
    // to the sequence), paged decode at page sizes 16 and 64, packed prefill.
    for (const char* dtype : {"f32", "bf16"})
      for (int seq : full ? std::vector<int>{2048, 4096, 8192, 16384} : std::vector<int>{2048, 8192}) {
        shapes.push_back(shape(dtype, 8, 8, seq, seq, 64, "bottom_right") + fmt::format(",wl={}", seq / 8));
        shapes.push_back(packed_prefill(dtype, 6, 8, seq, 64));
      }
    // Paged decode: GQA 32:8 at head_dim 128 and 8:1 at 64, 8 sequences of
    // unequal lengths, and 64 of them.
    for (const char* dtype : {"f32", "bf16", "f16"})
      for (int page : {16, 64})
        for (int seq_k : full ? std::vector<int>{1024, 4096, 8192} : std::vector<int>{4096}) {
          shapes.push_back(paged_decode(dtype, 8, 32, 8, seq_k, 128, page));
        }
    for (const char* dtype : {"f32", "bf16"}) shapes.push_back(paged_decode(dtype, 8, 8, 1, 4096, 64, 16));
    shapes.push_back(paged_decode("bf16", 64, 32, 8, 1024, 128, 16));
    // Format version 4, the precision axis past bfloat16: paged decode from
    // fp8 (vLLM's cache), Q8_0 and Q4_0 (llama.cpp's) and int8 per token.
    for (const char* cache : {kFp8Cache, kQ8Cache, kQ4Cache, kInt8Cache}) {
      shapes.push_back(paged_decode("bf16", 8, 32, 8, 4096, 128, 16) + cache);
    }
    shapes.push_back(paged_decode("f32", 8, 32, 8, 4096, 128, 16) + kQ8Cache);
  } else if (preset == "training") {
    // Training shapes, timed backward by default (preset_directions): seq 1k
    // to 8k, 8 to 32 heads, head_dim 64 and 128, causal and not, GQA 4:1,
    // float32 and bfloat16; each backward call is at most about 2 s here.
    for (const char* dtype : {"f32", "bf16"}) {
      shapes.push_back(shape(dtype, 16, 16, 1024, 1024, 64, "none"));
      shapes.push_back(shape(dtype, 8, 8, 4096, 4096, 64, "none"));
      shapes.push_back(shape(dtype, 8, 8, 4096, 4096, 64, "bottom_right"));
      shapes.push_back(shape(dtype, 8, 8, 2048, 2048, 128, "none"));
      shapes.push_back(shape(dtype, 8, 8, 8192, 8192, 64, "bottom_right"));
      shapes.push_back(shape(dtype, 32, 8, 2048, 2048, 128, "bottom_right"));
    }
  } else {
    throw Error(fmt::format("unknown preset '{}' (quick, standard, full, training, gpu)", preset));
  }
  std::vector<Problem> problems;
  for (const auto& s : shapes) problems.push_back(Problem::parse(s));
  return problems;
}

Sequences benchmark_sequences(const Problem& p) {
  Sequences s;
  if (p.ragged) {
    static const std::int64_t shares[] = {1, 3, 0, 2, 5, 1, 4, 2};
    std::int64_t total = 0;
    for (std::int64_t e = 0; e < p.batch; ++e) total += shares[e % 8];
    auto split = [&](std::int64_t length, std::vector<std::int64_t>& cu) {
      cu = {0};
      std::int64_t given = 0;
      for (std::int64_t e = 0; e < p.batch; ++e) {
        given += shares[e % 8];
        cu.push_back(total > 0 ? length * given / total : 0);
      }
    };
    split(p.seq_q, s.cu_seqlens_q);
    split(p.seq_k, s.cu_seqlens_k);
  }
  if (p.paged()) {
    const std::int64_t per_entry = p.pages_per_entry();
    std::vector<std::int64_t> order(static_cast<std::size_t>(p.num_pages));
    for (std::size_t n = 0; n < order.size(); ++n) order[n] = static_cast<std::int64_t>(n);
    Rng rng = Rng::from_name("pages " + p.to_string());
    for (std::size_t n = order.size(); n > 1; --n) std::swap(order[n - 1], order[static_cast<std::size_t>(rng.uniform_int(0, static_cast<std::int64_t>(n) - 1))]);
    std::size_t next = 0;
    for (std::int64_t b = 0; b < p.batch; ++b) {
      const std::int64_t len = std::max<std::int64_t>(p.seq_k - (b * 389) % std::max<std::int64_t>(p.seq_k / 2, 1), 1);
      s.seq_lens.push_back(len);
      for (std::int64_t n = 0; n < per_entry; ++n) {
        const bool used = n * p.page_size < len && next < order.size();
        s.page_table.push_back(used ? order[next++] : 0);
      }
    }
  }
  return s;
}

namespace {

// Visible (query, key) pairs of all entries, per head.
double visible_pairs(const Problem& p) {
  if (!p.ragged && !p.paged()) return static_cast<double>(p.batch) * static_cast<double>(p.causal_visible_pairs());
  const Sequences s = benchmark_sequences(p);
  SequenceMap map{&p, nullptr, s.cu_seqlens_q.data(), s.cu_seqlens_k.data(), s.page_table.data(), s.seq_lens.data()};
  double pairs = 0;
  for (std::int64_t e = 0; e < p.batch; ++e) {
    for (std::int64_t i = 0; i < map.q_len(e); ++i) {
      const SequenceMap::Row r = map.entry_row(e, i);
      pairs += static_cast<double>(r.keys.hi - r.keys.lo);
    }
  }
  return pairs;
}

}  // namespace

double useful_flops(const Problem& p) {
  return 2.0 * static_cast<double>(p.head_dim + p.head_dim_v) * static_cast<double>(p.heads_q) * visible_pairs(p);
}

double dense_flops(const Problem& p) {
  double pairs = static_cast<double>(p.batch) * static_cast<double>(p.seq_q) * static_cast<double>(p.seq_k);
  if (p.ragged || p.paged()) {
    const Sequences s = benchmark_sequences(p);
    pairs = 0;
    for (std::int64_t e = 0; e < p.batch; ++e) {
      const double q = p.ragged ? static_cast<double>(s.cu_seqlens_q[e + 1] - s.cu_seqlens_q[e]) : static_cast<double>(p.seq_q);
      const double k = p.ragged ? static_cast<double>(s.cu_seqlens_k[e + 1] - s.cu_seqlens_k[e]) : static_cast<double>(s.seq_lens[e]);
      pairs += q * k;
    }
  }
  return 2.0 * static_cast<double>(p.head_dim + p.head_dim_v) * static_cast<double>(p.heads_q) * pairs;
}

// Bytes of one key's row of K or V as stored: its codes and, for scales per
// token (or finer), their float32 factors and int32 zero points (format
// version 4); width elements of the dtype otherwise.
double row_bytes(const Problem& p, char tensor) {
  const QuantSpec& spec = p.quant(tensor);
  const std::int64_t width = tensor == 'k' ? p.head_dim : p.head_dim_v;
  if (!spec.quantised()) return static_cast<double>(width) * static_cast<double>(dtype_size(p.dtype));
  double bytes = static_cast<double>(encoded_row_bytes(spec.encoding, width));
  if (spec.has_scale() && spec.scale[2] > 1) bytes += static_cast<double>(spec.scale[3]) * (spec.zero_point ? 8.0 : 4.0);
  return bytes;
}

double kv_bytes(const Problem& p) {
  const double per_key = static_cast<double>(p.heads_kv) * (row_bytes(p, 'k') + row_bytes(p, 'v'));
  if (p.paged()) {
    double keys = 0;
    for (std::int64_t len : benchmark_sequences(p).seq_lens) keys += static_cast<double>(len);
    return keys * per_key;
  }
  return static_cast<double>(p.kv_batch() * p.kv_seq()) * per_key;
}

}  // namespace attn::bench
