/* TEST ONLY: the plugin ABI version 1 header exactly as plugins were built
 * against it (include/attnbench/plugin.h before version 2). The cmake.installed_package
 * test builds examples/plugin/example_c.c against it to prove that such
 * plugins keep loading. Never edit. */
/* attnbench plugin ABI, version 1: a shared library that provides attention
 * backends to `attn` at run time (`attn ... --plugin PATH.so`, or the
 * ATTN_PLUGINS environment variable, ':'-separated).
 *
 * Plain C, no C++ types across the boundary, so a plugin may be built by any
 * compiler, with any flags, against only this header. The library exports two
 * functions:
 *
 *   uint32_t attn_plugin_abi_version(void);       returns ATTN_PLUGIN_ABI_VERSION
 *   const attn_plugin* attn_plugin_get(void);    called only when the version matches
 *
 * The semantics are those of the fixture format (docs: README "Adding a backend"):
 * logical [batch, heads, seq, dim] tensors with element strides, a uint8 mask
 * (non-zero = attend) and an additive bias seen as [batch, heads_q, seq_q, seq_k]
 * with stride 0 on broadcast axes, keys j >= kv_len[b] hidden, rows with no
 * visible key exactly 0 (lse -inf), GQA kv head = h / (heads_q / heads_kv).
 * float16 and bfloat16 elements are raw 16-bit patterns (uint16_t).
 *
 * Strings a plugin returns (reasons, errors) must stay valid until the next
 * call into the same backend; attn copies them at once. attn calls a backend
 * from one thread at a time. */
#ifndef ATTNBENCH_PLUGIN_H
#define ATTNBENCH_PLUGIN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ATTN_PLUGIN_ABI_VERSION 1u

enum attn_dtype { ATTN_F64 = 0, ATTN_F32 = 1, ATTN_F16 = 2, ATTN_BF16 = 3 };
enum attn_causal { ATTN_CAUSAL_NONE = 0, ATTN_CAUSAL_TOP_LEFT = 1, ATTN_CAUSAL_BOTTOM_RIGHT = 2 };
enum attn_layout { ATTN_LAYOUT_BHSD = 0, ATTN_LAYOUT_BSHD = 1 };

/* An optional mask or bias of shape [batch, heads, rows, seq_k]; each of the
 * first three is 1 (broadcast) or the full size. */
typedef struct attn_broadcast {
  int32_t present;
  int64_t batch, heads, rows;
} attn_broadcast;

typedef struct attn_problem {
  int64_t batch, heads_q, heads_kv, seq_q, seq_k, head_dim, head_dim_v;
  double scale;      /* multiplies q.k before the bias is added */
  int32_t causal;    /* enum attn_causal */
  int32_t dtype;     /* enum attn_dtype: q, k, v, bias and out */
  int32_t layout;    /* enum attn_layout: how q, k, v and out are stored */
  int32_t has_kv_len;
  attn_broadcast mask, bias;
  const char* text;  /* the canonical problem string, e.g. "dtype=f32,b=1,hq=2,..." */
} attn_problem;

typedef struct attn_tensor {
  const void* data;  /* NULL when absent */
  int64_t strides[4];
} attn_tensor;

typedef struct attn_io {
  attn_tensor q, k, v;     /* [batch, heads_q|heads_kv, seq_q|seq_k, head_dim|head_dim_v] */
  const uint8_t* mask;     /* NULL when the problem has none */
  int64_t mask_strides[4];
  attn_tensor bias;        /* data NULL when absent */
  const int64_t* kv_len;   /* [batch], NULL when absent */
  void* out;               /* [batch, heads_q, seq_q, head_dim_v] */
  int64_t out_strides[4];
  double* lse;             /* [batch, heads_q, seq_q] contiguous; NULL when not wanted */
} attn_io;

typedef struct attn_backend {
  const char* name;          /* unique, e.g. "mylib-flash" */
  const char* description;   /* one line */
  const char* capabilities;  /* one line for `attn list` */
  void* user;                /* passed back to every call */
  /* NULL when the backend can run on this machine, else the reason. */
  const char* (*available)(void* user);
  /* NULL when it handles the problem, else the reason (no side effects). */
  const char* (*supports)(void* user, const attn_problem* problem);
  /* Everything that must not be timed; returns a plan, or NULL with *error set.
   * threads: 0 = the backend's default. The io buffers outlive the plan. */
  void* (*prepare)(void* user, const attn_problem* problem, const attn_io* io, int32_t threads, const char** error);
  /* Computes io.out (and io.lse when has_lse and io.lse != NULL); the timed part.
   * Returns 0, or non-zero with *error set. */
  int32_t (*run)(void* plan, const char** error);
  void (*destroy)(void* plan);
  int32_t has_lse;
} attn_backend;

typedef struct attn_plugin {
  uint32_t abi_version;  /* ATTN_PLUGIN_ABI_VERSION */
  uint32_t backend_size; /* sizeof(attn_backend) */
  int32_t count;
  const attn_backend* backends;
} attn_plugin;

typedef uint32_t (*attn_plugin_abi_version_fn)(void);
typedef const attn_plugin* (*attn_plugin_get_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* ATTNBENCH_PLUGIN_H */
