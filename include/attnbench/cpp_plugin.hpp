// A C++ backend (a subclass of attn::Backend, exactly as an in-tree one:
// attnbench/backend.hpp) built out of tree and loaded into attn at run time. This
// header implements the C ABI of attnbench/plugin.h for it; the plugin's one
// source line is
//
//   ATTN_CPP_PLUGIN(make_my_backend, make_my_other_backend)
//
// where each argument is a function returning std::unique_ptr<attn::Backend>.
// Exceptions never cross the boundary: they become the call's error string.
// Link the plugin with attnbench::backend (find_package(attnbench)).
#pragma once

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "attnbench/plugin.h"
#include "attnbench/backend.hpp"

namespace attn::plugin_detail {

struct Held {
  std::unique_ptr<Backend> backend;
  std::string name, description, capabilities;
  Capabilities declared;
  std::string reason;  // the last reason or error handed to attn
};

struct HeldPlan {
  Held* held;
  std::unique_ptr<Plan> plan;
};

struct HeldBackwardPlan {
  Held* held;
  std::unique_ptr<BackwardPlan> plan;
};

inline Problem problem_of(const attn_problem& c) {
  Problem p;
  p.batch = c.batch;
  p.heads_q = c.heads_q;
  p.heads_kv = c.heads_kv;
  p.seq_q = c.seq_q;
  p.seq_k = c.seq_k;
  p.head_dim = c.head_dim;
  p.head_dim_v = c.head_dim_v;
  p.scale = c.scale;
  p.causal = c.causal == ATTN_CAUSAL_TOP_LEFT ? Causal::top_left
             : c.causal == ATTN_CAUSAL_BOTTOM_RIGHT ? Causal::bottom_right
                                                    : Causal::none;
  p.dtype = c.dtype == ATTN_F64 ? DType::f64 : c.dtype == ATTN_F16 ? DType::f16 : c.dtype == ATTN_BF16 ? DType::bf16 : DType::f32;
  p.layout = c.layout == ATTN_LAYOUT_BSHD ? Layout::bshd : Layout::bhsd;
  p.kv_len = c.has_kv_len != 0;
  p.mask = {c.mask.present != 0, c.mask.batch, c.mask.heads, c.mask.rows};
  p.bias = {c.bias.present != 0, c.bias.batch, c.bias.heads, c.bias.rows};
  p.align = c.align == ATTN_ALIGN_TOP_LEFT ? Align::top_left : Align::bottom_right;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.softcap = c.softcap;
  p.alibi = c.alibi != 0;
  p.sinks = c.sinks != 0;
  p.ragged = c.ragged != 0;
  p.page_size = c.page_size;
  p.num_pages = c.num_pages;
  for (const attn_quant* from : {&c.q_quant, &c.k_quant, &c.v_quant}) {
    QuantSpec& to = from == &c.q_quant ? p.q_quant : from == &c.k_quant ? p.k_quant : p.v_quant;
    to.encoding = static_cast<Encoding>(from->encoding);
    to.descale = static_cast<Descale>(from->descale);
    for (int a = 0; a < 4; ++a) to.scale[static_cast<std::size_t>(a)] = from->scale[a];
    to.zero_point = from->zero_point != 0;
  }
  return p;
}

// A quantised tensor's codes as the SDK's QuantView (empty when not quantised).
inline QuantView codes_of(const QuantSpec& spec, const attn_codes& c, std::int64_t dim, std::int64_t descale_group) {
  QuantView q;
  if (c.codes == nullptr) return q;
  q.encoding = spec.encoding;
  q.codes = c.codes;
  q.strides = {c.strides[0], c.strides[1], c.strides[2]};
  q.dim = dim;
  q.scale = c.scale;
  q.scale_strides = {c.scale_strides[0], c.scale_strides[1], c.scale_strides[2]};
  q.group = c.group;
  q.zero_point = c.zero_point;
  q.descale = c.descale;
  q.descale_batch_stride = c.descale_strides[0];
  q.descale_head_stride = c.descale_strides[1];
  q.descale_group = descale_group;
  return q;
}

inline Dims4 dims_of(const std::int64_t* s) { return {s[0], s[1], s[2], s[3]}; }

inline AttentionIO io_of(const Problem& p, const attn_io& c) {
  AttentionIO io;
  // Packed sequences are one batch row; paged K and V are [pages, heads, page_size, .].
  io.q = {c.q.data, p.dtype, {p.q_batch(), p.heads_q, p.seq_q, p.head_dim}, dims_of(c.q.strides)};
  io.k = {c.k.data, p.dtype, {p.kv_batch(), p.heads_kv, p.kv_seq(), p.head_dim}, dims_of(c.k.strides)};
  io.v = {c.v.data, p.dtype, {p.kv_batch(), p.heads_kv, p.kv_seq(), p.head_dim_v}, dims_of(c.v.strides)};
  io.mask = {c.mask, dims_of(c.mask_strides)};
  if (c.bias.data != nullptr) io.bias = {c.bias.data, p.dtype, {p.batch, p.heads_q, p.seq_q, p.seq_k}, dims_of(c.bias.strides)};
  io.kv_len = c.kv_len;
  io.out = {c.out, p.dtype, {p.q_batch(), p.heads_q, p.seq_q, p.head_dim_v}, dims_of(c.out_strides)};
  io.lse = c.lse;
  io.alibi_slopes = c.alibi_slopes;
  io.sinks = c.sinks;
  io.cu_seqlens_q = c.cu_seqlens_q;
  io.cu_seqlens_k = c.cu_seqlens_k;
  io.page_table = c.page_table;
  io.seq_lens = c.seq_lens;
  io.q_codes = codes_of(p.q_quant, c.q_codes, p.head_dim, p.heads_q / p.heads_kv);
  io.k_codes = codes_of(p.k_quant, c.k_codes, p.head_dim, 1);
  io.v_codes = codes_of(p.v_quant, c.v_codes, p.head_dim_v, 1);
  return io;
}

inline const char* keep(Held* h, std::string text) {
  h->reason = std::move(text);
  return h->reason.c_str();
}

inline const char* available(void* user) {
  auto* h = static_cast<Held*>(user);
  try {
    Status s = h->backend->available();
    return s ? nullptr : keep(h, s.reason);
  } catch (const std::exception& e) {
    return keep(h, e.what());
  }
}

inline const char* supports(void* user, const attn_problem* c) {
  auto* h = static_cast<Held*>(user);
  try {
    Status s = backend_accepts(*h->backend, problem_of(*c));
    return s ? nullptr : keep(h, s.reason);
  } catch (const std::exception& e) {
    return keep(h, e.what());
  }
}

inline void* prepare(void* user, const attn_problem* c, const attn_io* cio, std::int32_t threads, const char** error) {
  auto* h = static_cast<Held*>(user);
  try {
    Problem p = problem_of(*c);
    RunOptions options;
    options.threads = threads;
    auto plan = h->backend->prepare(p, io_of(p, *cio), options);
    return new HeldPlan{h, std::move(plan)};
  } catch (const std::exception& e) {
    *error = keep(h, e.what());
    return nullptr;
  }
}

inline std::int32_t run(void* plan, const char** error) {
  auto* hp = static_cast<HeldPlan*>(plan);
  try {
    hp->plan->run();
    hp->plan->read_output();
    return 0;
  } catch (const std::exception& e) {
    *error = keep(hp->held, e.what());
    return 1;
  }
}

inline void destroy(void* plan) { delete static_cast<HeldPlan*>(plan); }

inline std::int32_t plan_has_lse(void* plan) { return static_cast<HeldPlan*>(plan)->plan->has_lse() ? 1 : 0; }

inline MutableTensorView gradient_of(void* data, const Problem& p, const Dims4& shape, const std::int64_t* strides) {
  return {data, p.dtype, shape, dims_of(strides)};
}

inline void* prepare_backward(void* user, const attn_problem* c, const attn_backward_io* cio, std::int32_t threads,
                              const char** error) {
  auto* h = static_cast<Held*>(user);
  try {
    Problem p = problem_of(*c);
    RunOptions options;
    options.threads = threads;
    BackwardIO io;
    io.forward = io_of(p, cio->forward);
    io.dout = {cio->dout.data, p.dtype, {p.q_batch(), p.heads_q, p.seq_q, p.head_dim_v}, dims_of(cio->dout.strides)};
    io.dq = gradient_of(cio->dq, p, {p.q_batch(), p.heads_q, p.seq_q, p.head_dim}, cio->dq_strides);
    io.dk = gradient_of(cio->dk, p, {p.kv_batch(), p.heads_kv, p.kv_seq(), p.head_dim}, cio->dk_strides);
    io.dv = gradient_of(cio->dv, p, {p.kv_batch(), p.heads_kv, p.kv_seq(), p.head_dim_v}, cio->dv_strides);
    if (cio->dbias != nullptr) {
      io.dbias = gradient_of(cio->dbias, p, {p.bias.batch, p.bias.heads, p.bias.rows, p.seq_k}, cio->dbias_strides);
    }
    io.dsinks = cio->dsinks;
    auto plan = h->backend->prepare_backward(p, io, options);
    return new HeldBackwardPlan{h, std::move(plan)};
  } catch (const std::exception& e) {
    *error = keep(h, e.what());
    return nullptr;
  }
}

inline std::int32_t run_backward(void* plan, const char** error) {
  auto* hp = static_cast<HeldBackwardPlan*>(plan);
  try {
    hp->plan->run();
    return 0;
  } catch (const std::exception& e) {
    *error = keep(hp->held, e.what());
    return 1;
  }
}

inline void destroy_backward(void* plan) { delete static_cast<HeldBackwardPlan*>(plan); }

using Factory = std::unique_ptr<Backend> (*)();

inline const attn_plugin* make_plugin(std::vector<Factory> factories) {
  static std::vector<Held> held;
  static std::vector<attn_backend> table;
  static attn_plugin plugin{};
  if (!table.empty()) return &plugin;
  held.reserve(factories.size());
  for (Factory f : factories) {
    Held h;
    h.backend = f();
    h.name = std::string(h.backend->name());
    h.description = std::string(h.backend->description());
    h.declared = h.backend->capabilities();
    h.capabilities = describe_capabilities(h.declared);
    held.push_back(std::move(h));
  }
  for (Held& h : held) {
    attn_backend b{};
    b.name = h.name.c_str();
    b.description = h.description.c_str();
    b.capabilities = h.capabilities.c_str();
    b.user = &h;
    b.available = &available;
    b.supports = &supports;
    b.prepare = &prepare;
    b.run = &run;
    b.destroy = &destroy;
    b.has_lse = h.declared.lse ? 1 : 0;
    // The C ABI's dtype and feature bits are the SDK's (attn checks it when built).
    b.dtypes = h.declared.dtypes;
    b.features = h.declared.features;
    b.plan_has_lse = &plan_has_lse;  // the plan's own answer, as in the tree
    if (h.declared.backward) {
      b.prepare_backward = &prepare_backward;
      b.run_backward = &run_backward;
      b.destroy_backward = &destroy_backward;
    }
    b.nondeterministic_dq = h.declared.nondeterministic_dq ? 1 : 0;
    b.encodings = h.declared.encodings;  // the ABI's encoding bits are the SDK's
    b.batch_invariant = h.declared.batch_invariant ? 1 : 0;
    b.bitwise_relations = h.declared.bitwise_relations;  // and so are its relation bits
    table.push_back(b);
  }
  plugin.abi_version = ATTN_PLUGIN_ABI_VERSION;
  plugin.backend_size = sizeof(attn_backend);
  plugin.count = static_cast<std::int32_t>(table.size());
  plugin.backends = table.data();
  return &plugin;
}

}  // namespace attn::plugin_detail

#define ATTN_CPP_PLUGIN(...)                                                                             \
  extern "C" __attribute__((visibility("default"))) uint32_t attn_plugin_abi_version(void) {             \
    return ATTN_PLUGIN_ABI_VERSION;                                                                      \
  }                                                                                                      \
  extern "C" __attribute__((visibility("default"))) const attn_plugin* attn_plugin_get(void) {          \
    try {                                                                                                \
      return ::attn::plugin_detail::make_plugin({__VA_ARGS__});                                          \
    } catch (...) {                                                                                      \
      return nullptr;                                                                                    \
    }                                                                                                    \
  }
