/* attnbench plugin ABI, version 6: a shared library that provides attention
 * backends to `attn` at run time (`attn ... --plugin PATH.so`, or the
 * ATTN_PLUGINS environment variable, ':'-separated).
 *
 * Plain C, no C++ types across the boundary, so a plugin may be built by any
 * compiler, with any flags, against only this header. The library exports two
 * functions:
 *
 *   uint32_t attn_plugin_abi_version(void);       returns ATTN_PLUGIN_ABI_VERSION
 *   const attn_plugin* attn_plugin_get(void);    called only when attn speaks that version
 *
 * The semantics are those of the fixture format (docs/format/v1.md, v2.md):
 * logical [batch, heads, seq, dim] tensors with element strides, a uint8 mask
 * (non-zero = attend) and an additive bias seen as [batch, heads_q, seq_q, seq_k]
 * with stride 0 on broadcast axes, keys j >= kv_len[b] hidden, rows with no
 * visible key exactly 0 (lse -inf), GQA kv head = h / (heads_q / heads_kv).
 * float16 and bfloat16 elements are raw 16-bit patterns (uint16_t).
 *
 * Strings a plugin returns (reasons, errors) must stay valid until the next
 * call into the same backend; attn copies them at once. attn calls a backend
 * from one thread at a time.
 *
 * Versions. Each version only appends: fields at the end of attn_problem,
 * attn_io and attn_backend (marked "version 2", "version 3"), so a plugin
 * built against an earlier version keeps loading and reads the prefix it
 * knows. Version 1: attn gives it every dtype, lse per backend and no version
 * 2 addition (those cases SKIP). A version 2 backend declares its dtypes and
 * format version 2 features, and may say per plan whether it writes lse. A
 * version 3 backend may implement the backward pass (docs/format/v3.md);
 * without it, or in earlier versions, gradient cases SKIP. A version 4
 * backend declares the encodings of quantised q, k and v it reads
 * (docs/format/v4.md) and gets their codes and scales; other quantised
 * cases, and all of them in earlier versions, SKIP. A version 5 backend may
 * declare batch invariance and the metamorphic relations it keeps bit for bit
 * (docs/verification/invariance.md, relations.md); earlier versions declare
 * neither. A version 6 backend may run whole layers of its own (fixtures of
 * kind mha: projections, its attention, the output projection) and their
 * backward; without them, or in earlier versions, attn computes a layer's
 * projections around the backend's attention. */
#ifndef ATTNBENCH_PLUGIN_H
#define ATTNBENCH_PLUGIN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ATTN_PLUGIN_ABI_VERSION 6u

enum attn_dtype { ATTN_F64 = 0, ATTN_F32 = 1, ATTN_F16 = 2, ATTN_BF16 = 3 };
enum attn_causal { ATTN_CAUSAL_NONE = 0, ATTN_CAUSAL_TOP_LEFT = 1, ATTN_CAUSAL_BOTTOM_RIGHT = 2 };
enum attn_layout { ATTN_LAYOUT_BHSD = 0, ATTN_LAYOUT_BSHD = 1 };
/* Version 2: the diagonal of windows and ALiBi when causal is NONE. */
enum attn_align { ATTN_ALIGN_TOP_LEFT = 0, ATTN_ALIGN_BOTTOM_RIGHT = 1 };
/* Version 2: attn_backend.dtypes holds ATTN_DTYPE_BIT of each dtype it computes in. */
#define ATTN_DTYPE_BIT(dtype) (1u << (unsigned)(dtype))
/* Version 2: attn_backend.features, the format version 2 additions it implements. */
enum attn_feature {
  ATTN_FEATURE_WINDOW = 1 << 0,  /* window_left / window_right */
  ATTN_FEATURE_SOFTCAP = 1 << 1, /* softcap */
  ATTN_FEATURE_ALIBI = 1 << 2,   /* alibi, io.alibi_slopes */
  ATTN_FEATURE_SINKS = 1 << 3,   /* sinks, io.sinks */
  ATTN_FEATURE_RAGGED = 1 << 4,  /* ragged, io.cu_seqlens_q / cu_seqlens_k */
  ATTN_FEATURE_PAGED = 1 << 5    /* page_size > 0, io.page_table / seq_lens */
};
/* Version 5: attn_backend.bitwise_relations (docs/verification/relations.md). */
enum attn_relation {
  ATTN_RELATION_V_SCALE = 1 << 0,          /* V x 2^k: out x 2^k, lse unchanged */
  ATTN_RELATION_Q_SCALE = 1 << 1,          /* Q x 2^k, scale / 2^k: unchanged */
  ATTN_RELATION_HEAD_PERMUTATION = 1 << 2, /* kv heads with their query groups permuted */
  ATTN_RELATION_KEY_PERMUTATION = 1 << 3,  /* keys and values permuted together */
  ATTN_RELATION_SCORE_SHIFT = 1 << 4,      /* + c on every score: out unchanged, lse + c */
  ATTN_RELATION_LAYOUT = 1 << 5,           /* bhsd and bshd give the same results */
  ATTN_RELATION_DOUT_SCALE = 1 << 6        /* backward: dO x 2^k, every gradient x 2^k */
};

/* Version 4: what a quantised q, k or v is stored as (docs/format/v4.md);
 * attn_backend.encodings holds ATTN_ENCODING_BIT of each it reads. */
enum attn_encoding {
  ATTN_ENCODING_NONE = 0, /* the dtype, as in versions 1-3 */
  ATTN_ENCODING_E4M3 = 1, /* float8_e4m3fn */
  ATTN_ENCODING_E5M2 = 2, /* float8_e5m2 */
  ATTN_ENCODING_S8 = 3,   /* int8 */
  ATTN_ENCODING_U8 = 4,   /* uint8 */
  ATTN_ENCODING_S4 = 5,   /* int4, element 2n in the low nibble of byte n */
  ATTN_ENCODING_U4 = 6,   /* uint4, likewise */
  ATTN_ENCODING_Q8_0 = 7, /* ggml blocks of 32: half d, 32 int8 (34 bytes) */
  ATTN_ENCODING_Q4_0 = 8  /* ggml blocks of 32: half d, 16 bytes (element n low nibble, n + 16 high) */
};
#define ATTN_ENCODING_BIT(encoding) (1u << (unsigned)(encoding))
enum attn_descale { ATTN_DESCALE_NONE = 0, ATTN_DESCALE_TENSOR = 1, ATTN_DESCALE_ENTRY_HEAD = 2 };

/* Version 4: how one of q, k, v is stored. value = (decode(code) - zero_point)
 * * scale * descale, each factor absent unless declared. */
typedef struct attn_quant {
  int32_t encoding;  /* enum attn_encoding */
  int32_t descale;   /* enum attn_descale: one per tensor, or per (batch entry, kv head) */
  int64_t scale[4];  /* shape [batch, heads, seq, groups] of the scale (each of the first three 1 or
                        the stored tensor's size); all 0: no scale */
  int32_t zero_point; /* int32 zero points of the scale's shape */
} attn_quant;

/* Version 4: a quantised tensor's codes and what dequantises them; codes
 * NULL when the tensor is not quantised (then its attn_tensor holds it). */
typedef struct attn_codes {
  const uint8_t* codes;   /* rows of row_bytes; row (b, h, s) at b * strides[0] + h * strides[1] + s * strides[2] */
  int64_t strides[3];     /* bytes; the stored tensor's [batch, heads, seq] (pages when paged) */
  int64_t row_bytes;      /* the encoding's bytes for a row of the head dim */
  const float* scale;     /* scale[b * scale_strides[0] + h * scale_strides[1] + s * scale_strides[2]
                             + d / group]; 0 strides on broadcast axes; NULL: 1 */
  int64_t scale_strides[3];
  int64_t group;          /* elements of a row sharing one scale */
  const int32_t* zero_point; /* indexed as scale; NULL: 0 */
  const float* descale;   /* descale[entry * descale_strides[0] + kv_head * descale_strides[1]]; NULL: 1.
                             A query head h reads kv head h / (heads_q / heads_kv); a paged
                             key's entry is its sequence's, not its page's */
  int64_t descale_strides[2];
} attn_codes;

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
  /* Version 2 (docs/format/v2.md); a backend sees a problem using one only
   * when it declared the feature. Absent: align BOTTOM_RIGHT, windows -1,
   * softcap 0, the flags 0, page_size 0. */
  int32_t align;                     /* enum attn_align */
  int64_t window_left, window_right; /* keys at most this far left / right of the diagonal; -1: unbounded */
  double softcap;                    /* > 0: scores become softcap * tanh(score / softcap) before the bias */
  int32_t alibi;                     /* io.alibi_slopes: adds -slope[h] * |diagonal(i) - j| */
  int32_t sinks;                     /* io.sinks: a logit per query head joins each row's denominator */
  int32_t ragged;                    /* batch packed sequences; q, out [1, heads_q, seq_q, .], k, v [1, heads_kv, seq_k, .] */
  int64_t page_size;                 /* > 0: k, v are [num_pages, heads_kv, page_size, .] pages */
  int64_t num_pages;
  /* Version 4; a backend sees a quantised tensor only with its encoding declared. */
  attn_quant q_quant, k_quant, v_quant;
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
  /* Version 2; NULL when the problem does not use them. */
  const float* alibi_slopes;   /* [heads_q] */
  const float* sinks;          /* [heads_q], natural-log units like the scores */
  const int64_t* cu_seqlens_q; /* [batch + 1] when ragged */
  const int64_t* cu_seqlens_k; /* [batch + 1] when ragged */
  const int64_t* page_table;   /* [batch, seq_k / page_size] when paged */
  const int64_t* seq_lens;     /* [batch] when paged */
  /* Version 4: the codes of quantised q, k, v (the attn_tensor's data is NULL then). */
  attn_codes q_codes, k_codes, v_codes;
} attn_io;

/* Version 3: the backward pass of L = sum(dout * out) (docs/format/v3.md). */
typedef struct attn_backward_io {
  /* The forward's io, read-only here: out (and lse when this plan's forward
   * wrote it, else NULL) hold this backend's own forward results. */
  attn_io forward;
  attn_tensor dout;          /* shape and strides of out, in the dtype */
  void* dq;                  /* shape of q, in the dtype; every element written */
  int64_t dq_strides[4];
  void* dk;                  /* shape of k: summed over the query heads of each kv head */
  int64_t dk_strides[4];
  void* dv;                  /* shape of v, likewise */
  int64_t dv_strides[4];
  void* dbias;               /* [bias.batch, bias.heads, bias.rows, seq_k], summed over the
                                broadcast axes; NULL when the bias needs no gradient */
  int64_t dbias_strides[4];
  double* dsinks;            /* [heads_q] when the problem has sinks, else NULL */
} attn_backward_io;

/* Version 6: a whole multi-head attention layer (docs/format/v1.md, "Layer
 * cases"; its gradients: docs/format/v3.md, "Layers"). Every array is
 * row-major and contiguous, in float64 (the file's values, unrounded: a
 * backend rounds them to problem->dtype as its products do). The attention
 * inside is the problem's: heads_q * head_dim columns of Q (head h owns
 * columns h*head_dim .. (h+1)*head_dim - 1), likewise K and V with heads_kv;
 * problem->layout is irrelevant here. */
typedef struct attn_layer {
  int64_t model_dim;       /* the width of x_q and of y */
  int64_t kdim, vdim;      /* the widths of x_k and x_v (model_dim unless the file says otherwise) */
  const double* x_q;       /* [batch, seq_q, model_dim] */
  const double* x_k;       /* [batch, seq_k, kdim] */
  const double* x_v;       /* [batch, seq_k, vdim] */
  const double* w_q;       /* [model_dim, heads_q * head_dim]: Q = x_q @ w_q + b_q */
  const double* w_k;       /* [kdim, heads_kv * head_dim] */
  const double* w_v;       /* [vdim, heads_kv * head_dim_v] */
  const double* w_o;       /* [heads_q * head_dim_v, model_dim]: y = O @ w_o + b_o */
  const double* b_q;       /* [heads_q * head_dim]; NULL: the layer has no such bias */
  const double* b_k;       /* [heads_kv * head_dim]; NULL likewise */
  const double* b_v;       /* [heads_kv * head_dim_v]; NULL likewise */
  const double* b_o;       /* [model_dim]; NULL likewise */
  const uint8_t* mask;     /* [mask.batch, mask.heads, mask.rows, seq_k] as problem->mask says; NULL when none */
  const double* bias;      /* [bias.batch, bias.heads, bias.rows, seq_k] likewise; NULL when none */
  const int64_t* kv_len;   /* [batch]; NULL when none */
  const float* alibi_slopes; /* [heads_q] when problem->alibi */
  const float* sinks;        /* [heads_q] when problem->sinks */
} attn_layer;

/* Version 6: where a layer's backward writes the gradients of
 * L = sum(dout * y), each the shape of what it is the gradient of, float64,
 * row-major; a NULL one is not asked for (a bias the layer does not have,
 * dbias unless the attention bias requires a gradient, dsinks without sinks). */
typedef struct attn_layer_gradients {
  double* dx_q; double* dx_k; double* dx_v;
  double* dw_q; double* dw_k; double* dw_v; double* dw_o;
  double* db_q; double* db_k; double* db_v; double* db_o;
  double* dbias;   /* [bias.batch, bias.heads, bias.rows, seq_k], summed over the broadcast axes */
  double* dsinks;  /* [heads_q] */
} attn_layer_gradients;

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
  int32_t has_lse;   /* every plan writes io.lse (unless plan_has_lse says otherwise) */
  /* Version 2. */
  uint32_t dtypes;   /* ATTN_DTYPE_BIT of each dtype it computes in; 0 is refused */
  uint32_t features; /* enum attn_feature bits it implements; other version 2 cases SKIP */
  /* Whether this plan writes io.lse; NULL: has_lse for every plan. */
  int32_t (*plan_has_lse)(void* plan);
  /* Version 3: the backward pass; prepare_backward NULL: none (gradient cases
   * SKIP). As prepare, run and destroy, for a backward plan: prepare is untimed,
   * run computes every gradient of io. */
  void* (*prepare_backward)(void* user, const attn_problem* problem, const attn_backward_io* io, int32_t threads,
                            const char** error);
  int32_t (*run_backward)(void* plan, const char** error);
  void (*destroy_backward)(void* plan);
  /* Non-zero: its dQ may differ between runs (atomic accumulation), which is
   * reported, not failed; dK, dV, dbias and dsinks must be bitwise identical. */
  int32_t nondeterministic_dq;
  /* Version 4: ATTN_ENCODING_BIT of each encoding of quantised q, k or v it
   * reads; 0: none (quantised cases SKIP). Quantised cases have no backward. */
  uint32_t encodings;
  /* Version 5. Non-zero: each batch entry's results are the same bits whatever
   * else is in the batch; the batch invariance check FAILs any variation. */
  int32_t batch_invariant;
  /* enum attn_relation bits of the relations it keeps bit for bit; others are
   * judged within the relation's bound. */
  uint32_t bitwise_relations;
  /* Version 6: a layer of its own; layer NULL: none (attn computes the
   * projections around this backend's attention). supports_layer: NULL when
   * it runs the layer, else the reason (NULL function: every layer its
   * attention supports). layer writes y [batch, seq_q, model_dim]; returns 0,
   * or non-zero with *error set. layer_backward NULL: the layer's backward is
   * SKIP. Neither is timed. */
  const char* (*supports_layer)(void* user, const attn_problem* problem, const attn_layer* layer);
  int32_t (*layer)(void* user, const attn_problem* problem, const attn_layer* layer, double* y, int32_t threads,
                   const char** error);
  int32_t (*layer_backward)(void* user, const attn_problem* problem, const attn_layer* layer, const double* dout,
                            const attn_layer_gradients* gradients, int32_t threads, const char** error);
} attn_backend;

typedef struct attn_plugin {
  uint32_t abi_version;  /* ATTN_PLUGIN_ABI_VERSION */
  uint32_t backend_size; /* sizeof(attn_backend): the stride of backends[] */
  int32_t count;
  const attn_backend* backends;
} attn_plugin;

typedef uint32_t (*attn_plugin_abi_version_fn)(void);
typedef const attn_plugin* (*attn_plugin_get_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* ATTNBENCH_PLUGIN_H */
