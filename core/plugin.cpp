#include "core/plugin.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstring>
#include <memory>

#include "attnbench/plugin.h"
#include "attnbench/error.hpp"
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
  return c;
}

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
  bool has_lse() const override { return b_->has_lse != 0; }

 private:
  const attn_backend* b_;
  void* plan_;
  std::string name_;
};

class PluginBackend final : public Backend {
 public:
  PluginBackend(const attn_backend* b, std::string path)
      : b_(b),
        path_(std::move(path)),
        name_(plugin_text(b->name, 64)),
        description_(plugin_text(b->description)) {
    if (description_.empty()) description_ = fmt::format("plugin {}", path_);
    else description_ += fmt::format(" (plugin {})", path_);
  }
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return description_; }
  // ABI version 1 declares lse per backend and no dtypes or version 2 additions.
  Capabilities capabilities() const override { return {kAllDTypes, 0, b_->has_lse != 0}; }
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
    const char* error = nullptr;
    void* plan = b_->prepare(b_->user, &c, &cio, options.threads, &error);
    if (plan == nullptr) {
      throw Error(fmt::format("plugin backend {}: prepare failed: {}", name_, error ? plugin_text(error) : "(no reason given)"));
    }
    return std::make_unique<PluginPlan>(b_, plan, name_);
  }

 private:
  const attn_backend* b_;
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
  std::uint32_t version = version_fn();
  if (version != ATTN_PLUGIN_ABI_VERSION) {
    throw Error(fmt::format("plugin {}: built for plugin ABI version {}, but this attn speaks version {}; rebuild it "
                            "against this attnbench's attnbench/plugin.h",
                            shown, version, ATTN_PLUGIN_ABI_VERSION));
  }
  const attn_plugin* plugin = get_fn();
  if (plugin == nullptr) throw Error(fmt::format("plugin {}: attn_plugin_get() returned nothing", shown));
  if (plugin->abi_version != ATTN_PLUGIN_ABI_VERSION || plugin->backend_size != sizeof(attn_backend)) {
    throw Error(fmt::format("plugin {}: its declaration says ABI version {} with backends of {} bytes; this attn "
                            "expects version {} and {} bytes",
                            shown, plugin->abi_version, plugin->backend_size, ATTN_PLUGIN_ABI_VERSION,
                            sizeof(attn_backend)));
  }
  if (plugin->count <= 0 || plugin->count > 256 || plugin->backends == nullptr) {
    throw Error(fmt::format("plugin {}: declares {} backends (1 to 256 expected)", shown, plugin->count));
  }
  std::vector<LoadedBackend> loaded;
  for (std::int32_t i = 0; i < plugin->count; ++i) {
    const attn_backend* b = &plugin->backends[i];
    if (b->name == nullptr || b->supports == nullptr || b->prepare == nullptr || b->run == nullptr) {
      throw Error(fmt::format("plugin {}: backend {} lacks a name, supports, prepare or run", shown, i));
    }
    std::string name(b->name, strnlen(b->name, 65));
    loaded.push_back({name, [b, shown] { return std::make_unique<PluginBackend>(b, shown); },
                      fmt::format("plugin {}", shown)});
  }
  return loaded;
}

}  // namespace attn
