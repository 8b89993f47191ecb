#include "core/plugin.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstddef>
#include <cstring>
#include <deque>
#include <iterator>
#include <limits>
#include <memory>

#include "attnbench/plugin.h"
#include "attnbench/error.hpp"
#include "core/extensions.hpp"
#include "core/layer_data.hpp"
#include "core/text.hpp"

namespace attn {

namespace {

// A plugin string, copied at once; a null pointer or a non-text one is named.
std::string plugin_text(const char* text, std::size_t limit = 4096) {
  if (text == nullptr) return {};
  std::size_t n = strnlen(text, limit);
  return printable(std::string_view(text, n));
}

attn_problem to_c(const Problem& p, const std::string& text) {
  attn_problem c{};
  c.batch = p.batch;
  c.heads_q = p.heads_q;
  c.heads_kv = p.heads_kv;
  c.seq_q = p.seq_q;
  c.seq_k = p.seq_k;
  c.head_dim = p.head_dim;
  c.head_dim_v = p.head_dim_v;
  c.scale = p.scale;
  c.causal = p.causal == Causal::none ? ATTN_CAUSAL_NONE
             : p.causal == Causal::top_left ? ATTN_CAUSAL_TOP_LEFT
                                            : ATTN_CAUSAL_BOTTOM_RIGHT;
  switch (p.dtype) {
    case DType::f64: c.dtype = ATTN_F64; break;
    case DType::f32: c.dtype = ATTN_F32; break;
    case DType::f16: c.dtype = ATTN_F16; break;
    case DType::bf16: c.dtype = ATTN_BF16; break;
  }
  c.layout = p.layout == Layout::bhsd ? ATTN_LAYOUT_BHSD : ATTN_LAYOUT_BSHD;
  c.has_kv_len = p.kv_len ? 1 : 0;
  c.mask = {p.mask.present ? 1 : 0, p.mask.batch, p.mask.heads, p.mask.rows};
  c.bias = {p.bias.present ? 1 : 0, p.bias.batch, p.bias.heads, p.bias.rows};
  c.text = text.c_str();
  c.align = p.align == Align::top_left ? ATTN_ALIGN_TOP_LEFT : ATTN_ALIGN_BOTTOM_RIGHT;
  c.window_left = p.window_left;
  c.window_right = p.window_right;
  c.softcap = p.softcap;
  c.alibi = p.alibi ? 1 : 0;
  c.sinks = p.sinks ? 1 : 0;
  c.ragged = p.ragged ? 1 : 0;
  c.page_size = p.page_size;
  c.num_pages = p.num_pages;
  for (const char t : {'q', 'k', 'v'}) {
    const QuantSpec& spec = p.quant(t);
    attn_quant& to = t == 'q' ? c.q_quant : t == 'k' ? c.k_quant : c.v_quant;
    to.encoding = static_cast<std::int32_t>(spec.encoding);
    to.descale = static_cast<std::int32_t>(spec.descale);
    for (int a = 0; a < 4; ++a) to.scale[a] = spec.scale[static_cast<std::size_t>(a)];
    to.zero_point = spec.zero_point ? 1 : 0;
  }
  return c;
}

// The C ABI's encodings and descales are the SDK's own values.
static_assert(ATTN_ENCODING_E4M3 == static_cast<int>(Encoding::e4m3) && ATTN_ENCODING_E5M2 == static_cast<int>(Encoding::e5m2) &&
              ATTN_ENCODING_S8 == static_cast<int>(Encoding::s8) && ATTN_ENCODING_U8 == static_cast<int>(Encoding::u8) &&
              ATTN_ENCODING_S4 == static_cast<int>(Encoding::s4) && ATTN_ENCODING_U4 == static_cast<int>(Encoding::u4) &&
              ATTN_ENCODING_Q8_0 == static_cast<int>(Encoding::q8_0) && ATTN_ENCODING_Q4_0 == static_cast<int>(Encoding::q4_0) &&
              ATTN_ENCODING_BIT(ATTN_ENCODING_Q4_0) == encoding_bit(Encoding::q4_0));
static_assert(ATTN_DESCALE_TENSOR == static_cast<int>(Descale::tensor) &&
              ATTN_DESCALE_ENTRY_HEAD == static_cast<int>(Descale::entry_head));

attn_codes codes_to_c(const QuantView& q) {
  attn_codes c{};
  if (q.empty()) return c;
  c.codes = q.codes;
  for (int a = 0; a < 3; ++a) c.strides[a] = q.strides[static_cast<std::size_t>(a)];
  c.row_bytes = encoded_row_bytes(q.encoding, q.dim);
  c.scale = q.scale;
  for (int a = 0; a < 3; ++a) c.scale_strides[a] = q.scale_strides[static_cast<std::size_t>(a)];
  c.group = q.group;
  c.zero_point = q.zero_point;
  c.descale = q.descale;
  c.descale_strides[0] = q.descale_batch_stride;
  c.descale_strides[1] = q.descale_head_stride;
  return c;
}

// attn_backend as ABI version 1 laid it out (its prefix is version 2's): the
// stride of a version 1 plugin's backends[].
struct BackendV1 {
  const char* name;
  const char* description;
  const char* capabilities;
  void* user;
  const char* (*available)(void*);
  const char* (*supports)(void*, const attn_problem*);
  void* (*prepare)(void*, const attn_problem*, const attn_io*, int32_t, const char**);
  int32_t (*run)(void*, const char**);
  void (*destroy)(void*);
  int32_t has_lse;
};
static_assert(offsetof(BackendV1, has_lse) == offsetof(attn_backend, has_lse));
static_assert(sizeof(BackendV1) < sizeof(attn_backend));
// And as version 2 laid it out: version 3 appended the backward pass.
struct BackendV2 {
  BackendV1 v1;
  std::uint32_t dtypes, features;
  std::int32_t (*plan_has_lse)(void*);
};
static_assert(offsetof(BackendV2, plan_has_lse) == offsetof(attn_backend, plan_has_lse));
static_assert(sizeof(BackendV2) < sizeof(attn_backend));
static_assert(offsetof(attn_backend, prepare_backward) == sizeof(BackendV2));
// And as version 3 laid it out: version 4 appended the encodings, which fit
// in what was version 3's tail padding (the sizes may be equal: the version
// says which fields are there, and a version 3 plugin's padding is not read).
constexpr std::size_t kBackendV3Size =
    (offsetof(attn_backend, encodings) + alignof(attn_backend) - 1) / alignof(attn_backend) * alignof(attn_backend);
// And as version 4 laid it out: version 5 appended batch_invariant and
// bitwise_relations.
constexpr std::size_t kBackendV4Size =
    (offsetof(attn_backend, batch_invariant) + alignof(attn_backend) - 1) / alignof(attn_backend) * alignof(attn_backend);
static_assert(kBackendV4Size < sizeof(attn_backend));
// And as version 5 laid it out: version 6 appended the layer's functions.
constexpr std::size_t kBackendV5Size = offsetof(attn_backend, supports_layer);
static_assert(kBackendV5Size < sizeof(attn_backend));
// attn_io as versions 2 and 3 laid it out (version 4 appended the codes), and
// attn_backward_io around it: a version 3 backward reads dout and the
// gradients right after that attn_io.
struct alignas(attn_io) IoV3 {
  unsigned char bytes[offsetof(attn_io, q_codes)];
};
struct BackwardIoV3 {
  IoV3 forward;
  attn_tensor dout;
  void* dq;
  std::int64_t dq_strides[4];
  void* dk;
  std::int64_t dk_strides[4];
  void* dv;
  std::int64_t dv_strides[4];
  void* dbias;
  std::int64_t dbias_strides[4];
  double* dsinks;
};
// Version 3's attn_io ended at seq_lens, with nothing after it; its backward
// io puts dout right after it, as version 4's does after the longer one.
static_assert(sizeof(IoV3) == offsetof(attn_io, seq_lens) + sizeof(const std::int64_t*));
static_assert(offsetof(BackwardIoV3, dout) == sizeof(IoV3) && offsetof(attn_backward_io, dout) == sizeof(attn_io));
static_assert(sizeof(attn_backward_io) - sizeof(attn_io) == sizeof(BackwardIoV3) - sizeof(IoV3));

// The size of attn_backend in each version this attn speaks (0: not one).
std::size_t backend_size(std::uint32_t version) {
  switch (version) {
    case 1: return sizeof(BackendV1);
    case 2: return sizeof(BackendV2);
    case 3: return kBackendV3Size;
    case 4: return kBackendV4Size;
    case 5: return kBackendV5Size;
    case ATTN_PLUGIN_ABI_VERSION: return sizeof(attn_backend);
    default: return 0;
  }
}

// The C ABI's dtype and feature bits are the SDK's own (attnbench/cpp_plugin.hpp
// passes them through as they are): unknown bits are dropped.
static_assert(ATTN_DTYPE_BIT(ATTN_F64) == dtype_bit(DType::f64) && ATTN_DTYPE_BIT(ATTN_F32) == dtype_bit(DType::f32) &&
              ATTN_DTYPE_BIT(ATTN_F16) == dtype_bit(DType::f16) && ATTN_DTYPE_BIT(ATTN_BF16) == dtype_bit(DType::bf16));
constexpr bool same_bit(attn_feature c, Feature cpp) { return static_cast<unsigned>(c) == static_cast<unsigned>(cpp); }
// The relation bits too.
constexpr bool same_bit(attn_relation c, Relation cpp) { return static_cast<unsigned>(c) == static_cast<unsigned>(cpp); }
static_assert(same_bit(ATTN_RELATION_V_SCALE, kRelationVScale) && same_bit(ATTN_RELATION_Q_SCALE, kRelationQScale) &&
              same_bit(ATTN_RELATION_HEAD_PERMUTATION, kRelationHeadPermutation) &&
              same_bit(ATTN_RELATION_KEY_PERMUTATION, kRelationKeyPermutation) &&
              same_bit(ATTN_RELATION_SCORE_SHIFT, kRelationScoreShift) && same_bit(ATTN_RELATION_LAYOUT, kRelationLayout) &&
              same_bit(ATTN_RELATION_DOUT_SCALE, kRelationDoutScale));
static_assert(same_bit(ATTN_FEATURE_WINDOW, kFeatureWindow) && same_bit(ATTN_FEATURE_SOFTCAP, kFeatureSoftcap) &&
              same_bit(ATTN_FEATURE_ALIBI, kFeatureAlibi) && same_bit(ATTN_FEATURE_SINKS, kFeatureSinks) &&
              same_bit(ATTN_FEATURE_RAGGED, kFeatureRagged) && same_bit(ATTN_FEATURE_PAGED, kFeaturePaged));
unsigned dtypes_of(std::uint32_t bits) { return bits & kAllDTypes; }
unsigned features_of(std::uint32_t bits) { return bits & kAllFeatures; }

void copy_strides(std::int64_t* to, const Dims4& from) {
  for (int a = 0; a < 4; ++a) to[a] = from[a];
}

class PluginPlan final : public Plan {
 public:
  PluginPlan(const attn_backend* b, void* plan, std::string name) : b_(b), plan_(plan), name_(std::move(name)) {}
  ~PluginPlan() override {
    if (b_->destroy != nullptr) b_->destroy(plan_);
  }
  void run() override {
    const char* error = nullptr;
    if (b_->run(plan_, &error) != 0) {
      throw Error(fmt::format("plugin backend {}: run failed: {}", name_, error ? plugin_text(error) : "(no reason given)"));
    }
  }
  bool has_lse() const override {
    return b_->plan_has_lse != nullptr ? b_->plan_has_lse(plan_) != 0 : b_->has_lse != 0;
  }

 private:
  const attn_backend* b_;
  void* plan_;
  std::string name_;
};

class PluginBackwardPlan final : public BackwardPlan {
 public:
  PluginBackwardPlan(const attn_backend* b, void* plan, std::string name) : b_(b), plan_(plan), name_(std::move(name)) {}
  ~PluginBackwardPlan() override {
    if (b_->destroy_backward != nullptr) b_->destroy_backward(plan_);
  }
  void run() override {
    const char* error = nullptr;
    if (b_->run_backward(plan_, &error) != 0) {
      throw Error(fmt::format("plugin backend {}: backward run failed: {}", name_,
                              error ? plugin_text(error) : "(no reason given)"));
    }
  }

 private:
  const attn_backend* b_;
  void* plan_;
  std::string name_;
};

attn_io io_to_c(const AttentionIO& io) {
  attn_io cio{};
  cio.q.data = io.q.data;
  copy_strides(cio.q.strides, io.q.strides);
  cio.k.data = io.k.data;
  copy_strides(cio.k.strides, io.k.strides);
  cio.v.data = io.v.data;
  copy_strides(cio.v.strides, io.v.strides);
  cio.mask = io.mask.data;
  copy_strides(cio.mask_strides, io.mask.strides);
  cio.bias.data = io.bias.data;
  copy_strides(cio.bias.strides, io.bias.strides);
  cio.kv_len = io.kv_len;
  cio.out = io.out.data;
  copy_strides(cio.out_strides, io.out.strides);
  cio.lse = io.lse;
  cio.alibi_slopes = io.alibi_slopes;
  cio.sinks = io.sinks;
  cio.cu_seqlens_q = io.cu_seqlens_q;
  cio.cu_seqlens_k = io.cu_seqlens_k;
  cio.page_table = io.page_table;
  cio.seq_lens = io.seq_lens;
  cio.q_codes = codes_to_c(io.q_codes);
  cio.k_codes = codes_to_c(io.k_codes);
  cio.v_codes = codes_to_c(io.v_codes);
  return cio;
}

// A layer as the C ABI passes it: pointers into the LayerData (float64,
// row-major, as the verifier holds them), and float copies of the slopes and
// sinks (the ABI's type for them, exact: the reader checked).
struct LayerToC {
  explicit LayerToC(const LayerData& l)
      : slopes(l.masking.alibi_slopes.begin(), l.masking.alibi_slopes.end()),
        sinks(l.masking.sinks.begin(), l.masking.sinks.end()) {
    auto data = [](const std::vector<double>& v) { return v.empty() ? nullptr : v.data(); };
    c.model_dim = l.model_dim;
    c.kdim = l.k_in();
    c.vdim = l.v_in();
    c.x_q = data(l.x_q), c.x_k = data(l.x_k), c.x_v = data(l.x_v);
    c.w_q = data(l.w_q), c.w_k = data(l.w_k), c.w_v = data(l.w_v), c.w_o = data(l.w_o);
    c.b_q = data(l.b_q), c.b_k = data(l.b_k), c.b_v = data(l.b_v), c.b_o = data(l.b_o);
    c.mask = l.masking.mask.empty() ? nullptr : l.masking.mask.data();
    c.bias = data(l.masking.bias);
    c.kv_len = l.masking.kv_len.empty() ? nullptr : l.masking.kv_len.data();
    c.alibi_slopes = slopes.empty() ? nullptr : slopes.data();
    c.sinks = sinks.empty() ? nullptr : sinks.data();
  }
  std::vector<float> slopes, sinks;
  attn_layer c{};
};

class PluginBackend final : public Backend, public BackendExtensions {
 public:
  PluginBackend(const attn_backend* b, std::uint32_t version, std::string path)
      : b_(b),
        version_(version),
        path_(std::move(path)),
        name_(plugin_text(b->name, 64)),
        description_(plugin_text(b->description)) {
    if (description_.empty()) description_ = fmt::format("plugin {}", path_);
    else description_ += fmt::format(" (plugin {})", path_);
  }
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return description_; }
  // Read from the declaration (version 1: every dtype, no version 2 addition).
  Capabilities capabilities() const override {
    return {.dtypes = dtypes_of(b_->dtypes),
            .features = features_of(b_->features),
            .lse = b_->has_lse != 0,
            .backward = b_->prepare_backward != nullptr,
            .nondeterministic_dq = b_->nondeterministic_dq != 0,
            .encodings = b_->encodings & kAllEncodings,
            .batch_invariant = b_->batch_invariant != 0,
            .bitwise_relations = b_->bitwise_relations & kAllRelations};
  }
  Status available() const override {
    if (b_->available == nullptr) return Status::yes();
    const char* why = b_->available(b_->user);
    return why == nullptr ? Status::yes() : Status::no(plugin_text(why));
  }
  Status supports(const Problem& p) const override {
    std::string text = p.to_string();
    attn_problem c = to_c(p, text);
    const char* why = b_->supports(b_->user, &c);
    return why == nullptr ? Status::yes() : Status::no(plugin_text(why));
  }
  std::unique_ptr<Plan> prepare(const Problem& p, const AttentionIO& io, const RunOptions& options) const override {
    std::string text = p.to_string();
    attn_problem c = to_c(p, text);
    attn_io cio = io_to_c(io);
    const char* error = nullptr;
    void* plan = b_->prepare(b_->user, &c, &cio, options.threads, &error);
    if (plan == nullptr) {
      throw Error(fmt::format("plugin backend {}: prepare failed: {}", name_, error ? plugin_text(error) : "(no reason given)"));
    }
    return std::make_unique<PluginPlan>(b_, plan, name_);
  }
  // Version 6: a layer of its own.
  const BackendExtensions* extensions() const override { return b_->layer != nullptr ? this : nullptr; }
  bool runs_layers() const override { return b_->layer != nullptr; }
  Status supports_layer(const Problem& p, const LayerData& layer) const override {
    if (b_->supports_layer == nullptr) return Status::yes();
    const std::string text = p.to_string();
    const attn_problem c = to_c(p, text);
    const LayerToC l(layer);
    const char* why = b_->supports_layer(b_->user, &c, &l.c);
    return why == nullptr ? Status::yes() : Status::no(plugin_text(why));
  }
  std::vector<double> run_layer(const LayerData& layer, const RunOptions& options) const override {
    const Problem& p = layer.problem;
    const std::string text = p.to_string();
    const attn_problem c = to_c(p, text);
    const LayerToC l(layer);
    std::vector<double> y(static_cast<std::size_t>(p.batch * p.seq_q * layer.model_dim), 0.0);
    const char* error = nullptr;
    if (b_->layer(b_->user, &c, &l.c, y.data(), options.threads, &error) != 0) {
      throw Error(fmt::format("plugin backend {}: layer failed: {}", name_, error ? plugin_text(error) : "(no reason given)"));
    }
    return y;
  }
  LayerGradients run_layer_backward(const LayerData& layer, const std::vector<double>& dout, bool bias_gradient,
                                    const RunOptions& options) const override {
    if (b_->layer_backward == nullptr) throw Unsupported("its plugin's layer has no backward (plugin ABI version 6)");
    const Problem& p = layer.problem;
    const std::string text = p.to_string();
    const attn_problem c = to_c(p, text);
    const LayerToC l(layer);
    LayerGradients g;
    attn_layer_gradients cg{};
    // Each gradient the layer has, in its shape; the others stay NULL.
    double* attn_layer_gradients::*slots[] = {&attn_layer_gradients::dx_q, &attn_layer_gradients::dx_k,
                                              &attn_layer_gradients::dx_v, &attn_layer_gradients::dw_q,
                                              &attn_layer_gradients::dw_k, &attn_layer_gradients::dw_v,
                                              &attn_layer_gradients::dw_o, &attn_layer_gradients::db_q,
                                              &attn_layer_gradients::db_k, &attn_layer_gradients::db_v,
                                              &attn_layer_gradients::db_o, &attn_layer_gradients::dbias,
                                              &attn_layer_gradients::dsinks};
    static constexpr std::string_view names[] = {"dx_q", "dx_k", "dx_v", "dw_q", "dw_k", "dw_v", "dw_o",
                                                 "db_q", "db_k", "db_v", "db_o", "dbias", "dsinks"};
    static_assert(std::size(slots) == std::size(names));
    const std::vector<LayerGradientPart> parts = layer_gradient_parts(layer, bias_gradient);
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (i >= std::size(names) || parts[i].name != names[i]) {
        throw Error("plugin layer: the format's gradient list and attn_layer_gradients disagree");
      }
      if (!parts[i].present) continue;
      std::int64_t count = 1;
      for (std::int64_t n : parts[i].file_shape) count *= n;
      // NaN until written: a gradient the plugin leaves unwritten is no silent 0.
      (g.*parts[i].values).assign(static_cast<std::size_t>(count), std::numeric_limits<double>::quiet_NaN());
      cg.*slots[i] = (g.*parts[i].values).data();
    }
    const char* error = nullptr;
    if (b_->layer_backward(b_->user, &c, &l.c, dout.data(), &cg, options.threads, &error) != 0) {
      throw Error(fmt::format("plugin backend {}: layer_backward failed: {}", name_,
                              error ? plugin_text(error) : "(no reason given)"));
    }
    return g;
  }
  std::unique_ptr<BackwardPlan> prepare_backward(const Problem& p, const BackwardIO& io,
                                                 const RunOptions& options) const override {
    if (b_->prepare_backward == nullptr) throw Unsupported("its plugin declares no backward pass (plugin ABI version 3)");
    std::string text = p.to_string();
    attn_problem c = to_c(p, text);
    attn_backward_io cio{};
    cio.forward = io_to_c(io.forward);
    cio.dout.data = io.dout.data;
    copy_strides(cio.dout.strides, io.dout.strides);
    cio.dq = io.dq.data;
    copy_strides(cio.dq_strides, io.dq.strides);
    cio.dk = io.dk.data;
    copy_strides(cio.dk_strides, io.dk.strides);
    cio.dv = io.dv.data;
    copy_strides(cio.dv_strides, io.dv.strides);
    cio.dbias = io.dbias.empty() ? nullptr : io.dbias.data;
    copy_strides(cio.dbias_strides, io.dbias.strides);
    cio.dsinks = io.dsinks;
    const char* error = nullptr;
    // A version 3 plugin reads the structure as its header laid it out.
    BackwardIoV3 v3{};
    if (version_ < 4) {
      std::memcpy(v3.forward.bytes, &cio.forward, sizeof v3.forward.bytes);
      v3.dout = cio.dout;
      v3.dq = cio.dq, v3.dk = cio.dk, v3.dv = cio.dv, v3.dbias = cio.dbias, v3.dsinks = cio.dsinks;
      std::memcpy(v3.dq_strides, cio.dq_strides, sizeof v3.dq_strides);
      std::memcpy(v3.dk_strides, cio.dk_strides, sizeof v3.dk_strides);
      std::memcpy(v3.dv_strides, cio.dv_strides, sizeof v3.dv_strides);
      std::memcpy(v3.dbias_strides, cio.dbias_strides, sizeof v3.dbias_strides);
    }
    const auto* passed = version_ < 4 ? static_cast<const void*>(&v3) : static_cast<const void*>(&cio);
    void* plan = b_->prepare_backward(b_->user, &c, static_cast<const attn_backward_io*>(passed), options.threads, &error);
    if (plan == nullptr) {
      throw Error(fmt::format("plugin backend {}: prepare_backward failed: {}", name_,
                              error ? plugin_text(error) : "(no reason given)"));
    }
    return std::make_unique<PluginBackwardPlan>(b_, plan, name_);
  }

 private:
  const attn_backend* b_;
  std::uint32_t version_;  // the plugin's ABI version
  std::string path_;
  std::string name_, description_;
};

}  // namespace

std::vector<LoadedBackend> load_plugin_library(const std::string& path) {
  const std::string shown = printable(path);
  // dlopen searches the library path for a bare name; a plugin is a file.
  std::string file = path.find('/') == std::string::npos ? "./" + path : path;
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw Error(fmt::format("plugin {}: cannot load it: {}", shown, why ? printable(why) : "unknown reason"));
  }
  // Plugins stay loaded until exit: their backends may be used until then.
  auto version_fn = reinterpret_cast<attn_plugin_abi_version_fn>(dlsym(handle, "attn_plugin_abi_version"));
  auto get_fn = reinterpret_cast<attn_plugin_get_fn>(dlsym(handle, "attn_plugin_get"));
  if (version_fn == nullptr || get_fn == nullptr) {
    throw Error(fmt::format("plugin {}: not an attnbench plugin (it exports no attn_plugin_abi_version and "
                            "attn_plugin_get; see include/attnbench/plugin.h)",
                            shown));
  }
  // Each version appended to the last one's structures: attn speaks them all.
  const std::uint32_t version = version_fn();
  if (backend_size(version) == 0) {
    throw Error(fmt::format("plugin {}: built for plugin ABI version {}, but this attn speaks versions 1 to {}; "
                            "rebuild it against this attnbench's attnbench/plugin.h",
                            shown, version, ATTN_PLUGIN_ABI_VERSION));
  }
  const attn_plugin* plugin = get_fn();
  if (plugin == nullptr) throw Error(fmt::format("plugin {}: attn_plugin_get() returned nothing", shown));
  const std::size_t known = backend_size(version);
  if (plugin->abi_version != version || plugin->backend_size != known) {
    throw Error(fmt::format("plugin {}: its declaration says ABI version {} with backends of {} bytes; its "
                            "attn_plugin_abi_version() says {}, whose backends take {} bytes",
                            shown, plugin->abi_version, plugin->backend_size, version, known));
  }
  if (plugin->count <= 0 || plugin->count > 256 || plugin->backends == nullptr) {
    throw Error(fmt::format("plugin {}: declares {} backends (1 to 256 expected)", shown, plugin->count));
  }
  // Each declaration, copied into this version's layout (plugins stay loaded,
  // so the copies may point into them): version 1 declares every dtype, no
  // version 2 feature and lse per backend; versions 1 and 2 no backward;
  // versions 1 to 3 no encoding; versions 1 to 4 no invariance or bitwise
  // relation; versions 1 to 5 no layer.
  static std::deque<attn_backend> declared;
  std::vector<LoadedBackend> loaded;
  for (std::int32_t i = 0; i < plugin->count; ++i) {
    const auto* at = reinterpret_cast<const unsigned char*>(plugin->backends) + static_cast<std::size_t>(i) * plugin->backend_size;
    attn_backend b{};
    std::memcpy(&b, at, known);
    if (version < 4) b.encodings = 0;
    if (version < 5) b.batch_invariant = 0, b.bitwise_relations = 0;
    if (version < 6) b.supports_layer = nullptr, b.layer = nullptr, b.layer_backward = nullptr;
    if ((b.supports_layer != nullptr || b.layer_backward != nullptr) && b.layer == nullptr) {
      throw Error(fmt::format("plugin {}: backend {} has supports_layer or layer_backward but no layer", shown,
                              plugin_text(b.name, 64)));
    }
    if (version == 1) {
      b.dtypes = kAllDTypes;
      b.features = 0;
      b.plan_has_lse = nullptr;
    }
    if (b.prepare_backward != nullptr && b.run_backward == nullptr) {
      throw Error(fmt::format("plugin {}: backend {} has prepare_backward but no run_backward", shown,
                              plugin_text(b.name, 64)));
    }
    if (b.name == nullptr || b.supports == nullptr || b.prepare == nullptr || b.run == nullptr) {
      throw Error(fmt::format("plugin {}: backend {} lacks a name, supports, prepare or run", shown, i));
    }
    if (dtypes_of(b.dtypes) == 0) {
      throw Error(fmt::format("plugin {}: backend {} declares no dtype it computes in (attn_backend.dtypes holds "
                              "ATTN_DTYPE_BIT of each)",
                              shown, plugin_text(b.name, 64)));
    }
    const attn_backend* kept = &declared.emplace_back(b);
    std::string name(kept->name, strnlen(kept->name, 65));
    loaded.push_back({name, [kept, version, shown] { return std::make_unique<PluginBackend>(kept, version, shown); },
                      fmt::format("plugin {}", shown)});
  }
  return loaded;
}

}  // namespace attn
