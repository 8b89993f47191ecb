#include "attnbench/problem.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "attnbench/error.hpp"

namespace attn {

std::string_view causal_name(Causal causal) {
  switch (causal) {
    case Causal::none: return "none";
    case Causal::top_left: return "top_left";
    case Causal::bottom_right: return "bottom_right";
  }
  return "?";
}

std::string_view align_name(Align align) { return align == Align::top_left ? "top_left" : "bottom_right"; }

std::string feature_names(unsigned features) {
  static const std::pair<unsigned, const char*> names[] = {
      {kFeatureWindow, "sliding window"}, {kFeatureSoftcap, "softcap"}, {kFeatureAlibi, "ALiBi"},
      {kFeatureSinks, "sinks"},           {kFeatureRagged, "ragged batches"}, {kFeaturePaged, "paged KV"}};
  std::string text;
  for (auto [bit, name] : names) {
    if (!(features & bit)) continue;
    if (!text.empty()) text += ", ";
    text += name;
  }
  return text;
}

unsigned Problem::features() const {
  unsigned f = 0;
  if (has_window()) f |= kFeatureWindow;
  if (softcap != 0) f |= kFeatureSoftcap;
  if (alibi) f |= kFeatureAlibi;
  if (sinks) f |= kFeatureSinks;
  if (ragged) f |= kFeatureRagged;
  if (paged()) f |= kFeaturePaged;
  return f;
}

unsigned Problem::encodings() const {
  unsigned bits = 0;
  for (const QuantSpec* spec : {&q_quant, &k_quant, &v_quant}) {
    if (spec->quantised()) bits |= encoding_bit(spec->encoding);
  }
  return bits;
}

std::array<std::int64_t, 4> Problem::stored_shape(char tensor) const {
  if (tensor == 'q') return {q_batch(), heads_q, seq_q, head_dim};
  return {kv_batch(), heads_kv, kv_seq(), tensor == 'k' ? head_dim : head_dim_v};
}

void Problem::fit_quant_scales() {
  for (char t : {'q', 'k', 'v'}) {
    QuantSpec& spec = t == 'q' ? q_quant : t == 'k' ? k_quant : v_quant;
    if (!spec.has_scale()) continue;
    const auto shape = stored_shape(t);
    for (std::size_t a = 0; a < 3; ++a) {
      if (spec.scale[a] != 1) spec.scale[a] = std::max<std::int64_t>(shape[a], 1);
    }
    if (shape[3] % spec.scale[3] != 0) spec.scale[3] = 1;
  }
}

std::string_view layout_name(Layout layout) { return layout == Layout::bhsd ? "bhsd" : "bshd"; }

double default_scale(std::int64_t head_dim) { return 1.0 / std::sqrt(static_cast<double>(head_dim)); }

std::int64_t Problem::causal_visible_pairs() const {
  std::int64_t pairs = 0;
  for (std::int64_t i = 0; i < seq_q; ++i) {
    const KeyRange r = key_range(i, seq_q, seq_k, seq_k);
    pairs += r.hi - r.lo;
  }
  return pairs;
}

namespace {

std::int64_t checked_product(std::initializer_list<std::int64_t> dims, std::string_view what) {
  std::int64_t product = 1;
  for (std::int64_t d : dims) {
    if (__builtin_mul_overflow(product, d, &product)) {
      throw InputError(fmt::format("problem: the element count of {} overflows a 64-bit integer", what));
    }
  }
  // Byte counts (up to 8 bytes per element) must fit too.
  if (product > std::numeric_limits<std::int64_t>::max() / 8) {
    throw InputError(fmt::format("problem: {} has {} elements, more than can be addressed", what, product));
  }
  return product;
}

void check_broadcast(const BroadcastShape& shape, const Problem& p, std::string_view what) {
  if (!shape.present) return;
  if (shape.batch != 1 && shape.batch != p.batch) {
    throw InputError(fmt::format("problem: {} batch dimension is {}, expected 1 or batch={}", what, shape.batch, p.batch));
  }
  if (shape.heads != 1 && shape.heads != p.heads_q) {
    throw InputError(fmt::format("problem: {} heads dimension is {}, expected 1 or heads_q={}", what, shape.heads, p.heads_q));
  }
  if (shape.rows != 1 && shape.rows != p.seq_q) {
    throw InputError(fmt::format("problem: {} query dimension is {}, expected 1 or seq_q={}", what, shape.rows, p.seq_q));
  }
}

void check_quant(const Problem& p, char tensor) {
  const QuantSpec& spec = p.quant(tensor);
  const Encoding e = spec.encoding;
  if (!spec.quantised()) {
    if (spec.descale != Descale::none || spec.has_scale() || spec.zero_point) {
      throw InputError(fmt::format("problem: {} has a descale, scale or zero point but no encoding", tensor));
    }
    return;
  }
  const auto shape = p.stored_shape(tensor);
  const std::int64_t width = shape[3];
  if (is_ggml(e) && width % 32 != 0) {
    throw InputError(fmt::format("problem: {} blocks hold 32 elements, and {}'s rows have {} (head_dim{} = {} is not a "
                                 "multiple of 32)", encoding_name(e), tensor, width, tensor == 'v' ? "_v" : "", width));
  }
  if (spec.descale != Descale::none && !is_fp8(e) && !is_ggml(e)) {
    throw InputError(fmt::format("problem: {}'s descale is for fp8 and ggml encodings, not {} (integer encodings take a "
                                 "scale)", tensor, encoding_name(e)));
  }
  if (spec.has_scale() && is_ggml(e)) {
    throw InputError(fmt::format("problem: {}'s scale: {} blocks carry their own scale (d)", tensor, encoding_name(e)));
  }
  if (spec.zero_point && !is_integer(e)) {
    throw InputError(fmt::format("problem: {}'s zero point is for integer encodings, not {}", tensor, encoding_name(e)));
  }
  if (spec.zero_point && !spec.has_scale()) {
    throw InputError(fmt::format("problem: {}'s zero point needs a scale (the zero point has the scale's shape)", tensor));
  }
  if (!spec.has_scale()) return;
  static const char* axes[] = {"batch", "heads", "seq"};
  for (int a = 0; a < 3; ++a) {
    if (spec.scale[a] != 1 && (spec.scale[a] != shape[a] || shape[a] < 1)) {
      throw InputError(fmt::format("problem: {}'s scale has {} along {}, expected 1 or {}", tensor, spec.scale[a],
                                   axes[a], shape[a]));
    }
  }
  if (spec.scale[3] < 1 || width % spec.scale[3] != 0) {
    throw InputError(fmt::format("problem: {}'s scale has {} groups per row, which must divide the row's {} elements",
                                 tensor, spec.scale[3], width));
  }
}

}  // namespace

void Problem::validate() const {
  const std::pair<const char*, std::int64_t> at_least_one[] = {
      {"batch", batch}, {"heads_q", heads_q}, {"heads_kv", heads_kv},
      {"seq_q", seq_q}, {"head_dim", head_dim}, {"head_dim_v", head_dim_v}};
  for (auto [name, value] : at_least_one) {
    if (value < 1) throw InputError(fmt::format("problem: {} is {}, expected at least 1", name, value));
  }
  if (seq_k < 0) throw InputError(fmt::format("problem: seq_k is {}, expected at least 0", seq_k));
  if (heads_q % heads_kv != 0) {
    throw InputError(fmt::format("problem: heads_q={} is not a multiple of heads_kv={}", heads_q, heads_kv));
  }
  if (!std::isfinite(scale)) throw InputError(fmt::format("problem: scale is {}, expected a finite number", scale));
  for (auto [name, value] : {std::pair{"window_left", window_left}, std::pair{"window_right", window_right}}) {
    if (value < -1) throw InputError(fmt::format("problem: {} is {}, expected -1 (unbounded) or at least 0", name, value));
  }
  if (!(std::isfinite(softcap) && softcap >= 0)) {
    throw InputError(fmt::format("problem: softcap is {}, expected a finite number > 0 (or 0: none)", softcap));
  }
  if (ragged) {
    if (mask.present || bias.present || kv_len) {
      throw InputError("problem: packed (ragged) sequences take no mask, bias or kv_len in format version 2");
    }
    if (paged()) throw InputError("problem: packed (ragged) sequences and paged KV are not combined in format version 2");
  }
  if (page_size < 0) throw InputError(fmt::format("problem: page_size is {}, expected at least 1 (or 0: not paged)", page_size));
  if (paged()) {
    if (kv_len) throw InputError("problem: paged KV takes seq_lens, not kv_len");
    if (seq_k % page_size != 0) {
      throw InputError(fmt::format("problem: seq_k = {} is not a multiple of page_size = {} (seq_k is pages per entry "
                                   "times page_size)", seq_k, page_size));
    }
    if (num_pages < 0) throw InputError(fmt::format("problem: num_pages is {}, expected at least 0", num_pages));
  } else if (num_pages != 0) {
    throw InputError("problem: num_pages is set but page_size is not");
  }
  checked_product({q_batch(), heads_q, seq_q, head_dim}, "q");
  checked_product({kv_batch(), heads_kv, kv_seq(), head_dim}, "k");
  checked_product({kv_batch(), heads_kv, kv_seq(), head_dim_v}, "v");
  checked_product({q_batch(), heads_q, seq_q, head_dim_v}, "out");
  checked_product({q_batch(), heads_q, seq_q, seq_k}, "the score matrix");  // packed: entries share one row axis
  if (paged()) checked_product({batch, pages_per_entry()}, "page_table");
  check_broadcast(mask, *this, "mask");
  check_broadcast(bias, *this, "bias");
  for (char t : {'q', 'k', 'v'}) check_quant(*this, t);
}

std::string Problem::to_string() const {
  std::string s = fmt::format("dtype={},b={},hq={},hkv={},sq={},sk={},d={},dv={},scale={}", dtype_short_name(dtype),
                              batch, heads_q, heads_kv, seq_q, seq_k, head_dim, head_dim_v, scale);
  if (causal != Causal::none) s += fmt::format(",causal={}", causal_name(causal));
  if (mask.present) s += fmt::format(",mask={}x{}x{}", mask.batch, mask.heads, mask.rows);
  if (bias.present) s += fmt::format(",bias={}x{}x{}", bias.batch, bias.heads, bias.rows);
  if (kv_len) s += ",kv_len";
  if (causal == Causal::none && (has_window() || alibi)) s += fmt::format(",align={}", align_name(align));
  if (window_left >= 0) s += fmt::format(",wl={}", window_left);
  if (window_right >= 0) s += fmt::format(",wr={}", window_right);
  if (softcap != 0) s += fmt::format(",softcap={}", softcap);
  if (alibi) s += ",alibi";
  if (sinks) s += ",sinks";
  if (ragged) s += ",ragged";
  if (paged()) s += fmt::format(",paged={}x{}", page_size, num_pages);
  for (char t : {'q', 'k', 'v'}) {
    const QuantSpec& spec = quant(t);
    if (!spec.quantised()) continue;
    s += fmt::format(",{}enc={}", t, encoding_short_name(spec.encoding));
    if (spec.descale != Descale::none) s += fmt::format(",{}descale={}", t, spec.descale == Descale::tensor ? "tensor" : "head");
    if (spec.has_scale()) s += fmt::format(",{}scale={}x{}x{}x{}", t, spec.scale[0], spec.scale[1], spec.scale[2], spec.scale[3]);
    if (spec.zero_point) s += fmt::format(",{}zp", t);
  }
  if (layout != Layout::bhsd) s += fmt::format(",layout={}", layout_name(layout));
  return s;
}

namespace {

std::int64_t parse_int(std::string_view key, std::string_view value) {
  std::int64_t out = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  if (ec != std::errc() || ptr != value.data() + value.size()) {
    throw InputError(fmt::format("problem string: {}='{}' is not an integer", key, value));
  }
  return out;
}

double parse_double(std::string_view key, std::string_view value) {
  double out = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  if (ec != std::errc() || ptr != value.data() + value.size()) {
    throw InputError(fmt::format("problem string: {}='{}' is not a number", key, value));
  }
  return out;
}

BroadcastShape parse_broadcast(std::string_view key, std::string_view value) {
  BroadcastShape shape{.present = true};
  std::int64_t* dims[] = {&shape.batch, &shape.heads, &shape.rows};
  std::size_t start = 0;
  for (int d = 0; d < 3; ++d) {
    std::size_t end = value.find('x', start);
    if ((d < 2) != (end != std::string_view::npos)) {
      throw InputError(fmt::format("problem string: {}='{}' must be BATCHxHEADSxROWS", key, value));
    }
    *dims[d] = parse_int(key, value.substr(start, end == std::string_view::npos ? value.npos : end - start));
    start = end + 1;
  }
  return shape;
}

}  // namespace

Problem Problem::parse(std::string_view text) {
  Problem p;
  std::map<std::string, std::string, std::less<>> fields;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(',', start);
    std::string_view token = text.substr(start, end == text.npos ? text.npos : end - start);
    if (token.empty()) throw InputError(fmt::format("problem string '{}': empty field", text));
    std::size_t eq = token.find('=');
    std::string key(token.substr(0, eq));
    std::string value(eq == token.npos ? "" : token.substr(eq + 1));
    if (!fields.emplace(key, value).second) throw InputError(fmt::format("problem string: '{}' given twice", key));
    if (end == text.npos) break;
    start = end + 1;
  }
  auto take = [&](std::string_view key) -> std::optional<std::string> {
    auto it = fields.find(key);
    if (it == fields.end()) return std::nullopt;
    std::string v = it->second;
    fields.erase(it);
    return v;
  };
  auto need = [&](std::string_view key) {
    auto v = take(key);
    if (!v) throw InputError(fmt::format("problem string '{}': missing {}=", text, key));
    return *v;
  };
  std::string dtype_text = need("dtype");
  auto dtype = parse_dtype(dtype_text);
  if (!dtype) throw InputError(fmt::format("problem string: dtype='{}' is not one of f64, f32, f16, bf16", dtype_text));
  p.dtype = *dtype;
  p.batch = parse_int("b", need("b"));
  p.heads_q = parse_int("hq", need("hq"));
  p.heads_kv = parse_int("hkv", need("hkv"));
  p.seq_q = parse_int("sq", need("sq"));
  p.seq_k = parse_int("sk", need("sk"));
  p.head_dim = parse_int("d", need("d"));
  p.head_dim_v = p.head_dim;
  if (auto v = take("dv")) p.head_dim_v = parse_int("dv", *v);
  p.scale = p.head_dim >= 1 ? default_scale(p.head_dim) : 1.0;
  if (auto v = take("scale")) p.scale = parse_double("scale", *v);
  if (auto v = take("causal")) {
    if (*v == "none") p.causal = Causal::none;
    else if (*v == "top_left") p.causal = Causal::top_left;
    else if (*v == "bottom_right") p.causal = Causal::bottom_right;
    else throw InputError(fmt::format("problem string: causal='{}' is not none, top_left or bottom_right", *v));
  }
  if (auto v = take("mask")) p.mask = parse_broadcast("mask", *v);
  if (auto v = take("bias")) p.bias = parse_broadcast("bias", *v);
  if (auto v = take("kv_len")) {
    if (!v->empty()) throw InputError("problem string: kv_len takes no value");
    p.kv_len = true;
  }
  auto flag = [&](std::string_view key) {
    auto v = take(key);
    if (v && !v->empty()) throw InputError(fmt::format("problem string: {} takes no value", key));
    return v.has_value();
  };
  if (auto v = take("align")) {
    if (*v == "top_left") p.align = Align::top_left;
    else if (*v == "bottom_right") p.align = Align::bottom_right;
    else throw InputError(fmt::format("problem string: align='{}' is not top_left or bottom_right", *v));
    if (p.causal != Causal::none && p.align != p.alignment()) {
      throw InputError(fmt::format("problem string: align={} contradicts causal={}", *v, causal_name(p.causal)));
    }
  }
  if (p.causal != Causal::none) p.align = p.alignment();
  if (auto v = take("wl")) p.window_left = parse_int("wl", *v);
  if (auto v = take("wr")) p.window_right = parse_int("wr", *v);
  if (auto v = take("softcap")) p.softcap = parse_double("softcap", *v);
  p.alibi = flag("alibi");
  p.sinks = flag("sinks");
  p.ragged = flag("ragged");
  if (auto v = take("paged")) {
    const std::size_t x = v->find('x');
    if (x == std::string::npos) throw InputError(fmt::format("problem string: paged='{}' must be PAGE_SIZExNUM_PAGES", *v));
    p.page_size = parse_int("paged", v->substr(0, x));
    p.num_pages = parse_int("paged", v->substr(x + 1));
    if (p.page_size < 1) throw InputError(fmt::format("problem string: paged='{}': the page size must be at least 1", *v));
  }
  for (char t : {'q', 'k', 'v'}) {
    QuantSpec& spec = t == 'q' ? p.q_quant : t == 'k' ? p.k_quant : p.v_quant;
    const std::string key(1, t);
    if (auto v = take(key + "enc")) {
      const auto encoding = parse_encoding(*v);
      if (!encoding || *encoding == Encoding::none) {
        throw InputError(fmt::format("problem string: {}enc='{}' is not an encoding (e4m3, e5m2, s8, u8, s4, u4, q8_0, "
                                     "q4_0)", t, *v));
      }
      spec.encoding = *encoding;
    }
    if (auto v = take(key + "descale")) {
      if (*v == "tensor") spec.descale = Descale::tensor;
      else if (*v == "head") spec.descale = Descale::entry_head;
      else throw InputError(fmt::format("problem string: {}descale='{}' is not tensor or head", t, *v));
    }
    if (auto v = take(key + "scale")) {
      std::size_t begin = 0;
      for (int a = 0; a < 4; ++a) {
        const std::size_t end = v->find('x', begin);
        if ((a < 3) != (end != std::string::npos)) {
          throw InputError(fmt::format("problem string: {}scale='{}' must be BATCHxHEADSxSEQxGROUPS", t, *v));
        }
        spec.scale[static_cast<std::size_t>(a)] =
            parse_int(key + "scale", std::string_view(*v).substr(begin, end == std::string::npos ? std::string::npos : end - begin));
        if (spec.scale[static_cast<std::size_t>(a)] < 1) {
          throw InputError(fmt::format("problem string: {}scale='{}': every size must be at least 1", t, *v));
        }
        begin = end + 1;
      }
    }
    spec.zero_point = flag(key + "zp");
  }
  if (auto v = take("layout")) {
    if (*v == "bhsd") p.layout = Layout::bhsd;
    else if (*v == "bshd") p.layout = Layout::bshd;
    else throw InputError(fmt::format("problem string: layout='{}' is not bhsd or bshd", *v));
  }
  if (!fields.empty()) throw InputError(fmt::format("problem string: unknown field '{}'", fields.begin()->first));
  p.validate();
  return p;
}

}  // namespace attn
