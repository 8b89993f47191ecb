/* example-c: an attention backend in plain C, loaded by `attn --plugin`.
 *
 * It implements format version 1 (every dtype, masks, bias, kv_len, both
 * causal alignments, GQA, any strides, lse) and the version 2 additions that
 * keep one batch entry per tensor row (sliding windows, softcap, ALiBi, sinks;
 * not ragged or paged layouts) the simplest way: per row, scores in double,
 * max-subtracted softmax, weights times V, the result rounded once.
 * Build it against an installed attnbench (see CMakeLists.txt here).
 *
 * The version 2 additions are read through the helpers below, so the same
 * source also builds against a plugin ABI version 1 header, as a plugin
 * written before version 2 was: it then implements format version 1 only
 * (cmake.installed_package builds it both ways). With ABI version 6 it also
 * runs whole layers of its own (kind mha fixtures), forward and backward. */
#include <attnbench/plugin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static double half_to_double(uint16_t h) {
  int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0) return sign * ldexp(mantissa, -24);
  if (exponent == 31) return mantissa ? NAN : sign * INFINITY;
  return sign * ldexp(mantissa | 0x400, exponent - 25);
}

static uint16_t double_to_half(double x) {
  uint16_t sign = signbit(x) ? 0x8000 : 0;
  double a = fabs(x);
  if (isnan(x)) return 0x7e00;
  if (a >= 65520.0) return sign | 0x7c00; /* rounds to infinity */
  int e;
  frexp(a, &e); /* a = f * 2^e, f in [0.5, 1) */
  int exponent = e - 1;
  if (exponent < -14) exponent = -14; /* subnormal range: fixed quantum 2^-24 */
  double quantum = ldexp(1.0, exponent - 10);
  double q = nearbyint(a / quantum); /* round to nearest even (default mode) */
  double r = q * quantum;
  if (r == 0) return sign;
  frexp(r, &e);
  int biased = e - 1 + 15;
  if (biased <= 0) return sign | (uint16_t)q; /* subnormal */
  uint16_t m = (uint16_t)(ldexp(r, -(e - 1)) * 1024.0 - 1024.0);
  return sign | (uint16_t)(biased << 10) | m;
}

static double load(int32_t dtype, const void* base, int64_t at) {
  switch (dtype) {
    case ATTN_F64: return ((const double*)base)[at];
    case ATTN_F32: return ((const float*)base)[at];
    case ATTN_F16: return half_to_double(((const uint16_t*)base)[at]);
    default: {
      uint32_t bits = (uint32_t)((const uint16_t*)base)[at] << 16;
      float f;
      memcpy(&f, &bits, sizeof f);
      return f;
    }
  }
}

static void store(int32_t dtype, void* base, int64_t at, double x) {
  switch (dtype) {
    case ATTN_F64: ((double*)base)[at] = x; return;
    case ATTN_F32: ((float*)base)[at] = (float)x; return;
    case ATTN_F16: ((uint16_t*)base)[at] = double_to_half(x); return;
    default: { /* bfloat16: round the float's bits to nearest even */
      float f = (float)x;
      uint32_t bits;
      memcpy(&bits, &f, sizeof bits);
      if (isnan(f)) bits = 0x7fc00000u;
      else bits += 0x7fffu + ((bits >> 16) & 1u);
      ((uint16_t*)base)[at] = (uint16_t)(bits >> 16);
    }
  }
}

#if ATTN_PLUGIN_ABI_VERSION >= 2
/* The diagonal that causal, windows and ALiBi are measured from. */
static int top_left_diagonal(const attn_problem* p) {
  return p->causal == ATTN_CAUSAL_TOP_LEFT || (p->causal == ATTN_CAUSAL_NONE && p->align == ATTN_ALIGN_TOP_LEFT);
}
/* Distances from the diagonal: a window up to INT64_MAX cannot overflow. */
static int window_shows(const attn_problem* p, int64_t diag, int64_t j) {
  return (p->window_left < 0 || diag - j <= p->window_left) && (p->window_right < 0 || j - diag <= p->window_right);
}
static double capped(const attn_problem* p, double score) {
  return p->softcap > 0 ? p->softcap * tanh(score / p->softcap) : score;
}
static double alibi(const attn_problem* p, const attn_io* io, int64_t h, int64_t diag, int64_t j) {
  return p->alibi ? -io->alibi_slopes[h] * fabs((double)(diag - j)) : 0.0;
}
/* A sink is one more logit in the denominator that carries no value. */
static double sink_of(const attn_problem* p, const attn_io* io, int64_t h) { return p->sinks ? io->sinks[h] : -INFINITY; }
#else
static int top_left_diagonal(const attn_problem* p) { return p->causal == ATTN_CAUSAL_TOP_LEFT; }
static int window_shows(const attn_problem* p, int64_t diag, int64_t j) { (void)p, (void)diag, (void)j; return 1; }
static double capped(const attn_problem* p, double score) { (void)p; return score; }
static double alibi(const attn_problem* p, const attn_io* io, int64_t h, int64_t diag, int64_t j) {
  (void)p, (void)io, (void)h, (void)diag, (void)j;
  return 0.0;
}
static double sink_of(const attn_problem* p, const attn_io* io, int64_t h) { (void)p, (void)io, (void)h; return -INFINITY; }
#endif

typedef struct plan {
  attn_problem p;
  attn_io io;
  double* scores; /* one row */
} plan;

static const char* available(void* user) { (void)user; return NULL; }

static const char* supports(void* user, const attn_problem* p) {
  (void)user;
  (void)p;
  return NULL; /* everything the format defines */
}

static void* prepare(void* user, const attn_problem* p, const attn_io* io, int32_t threads, const char** error) {
  (void)user;
  (void)threads;
  plan* pl = calloc(1, sizeof *pl);
  if (pl == NULL) {
    *error = "out of memory";
    return NULL;
  }
  pl->p = *p;
  pl->p.text = NULL; /* only valid during the call */
  pl->io = *io;
  pl->scores = malloc(sizeof(double) * (size_t)(p->seq_k > 0 ? p->seq_k : 1));
  if (pl->scores == NULL) {
    free(pl);
    *error = "out of memory";
    return NULL;
  }
  return pl;
}

/* Row (b, h, i)'s weights, unnormalised: scores[j] = exp(score_j - top) (0
 * where hidden), their sum with the sink's in *total (0: no visible key, no
 * sink), the largest logit in *top. */
static void row_weights(const attn_problem* p, const attn_io* io, int64_t b, int64_t h, int64_t i, double* scores,
                        double* top_out, double* total_out) {
  const int64_t g = h / (p->heads_q / p->heads_kv);
  const int64_t kv_len = io->kv_len ? io->kv_len[b] : p->seq_k;
  const int64_t diag = top_left_diagonal(p) ? i : i + p->seq_k - p->seq_q;
  const double sink = sink_of(p, io, h);
  double top = sink;
  for (int64_t j = 0; j < p->seq_k; ++j) {
    int visible = j < kv_len && window_shows(p, diag, j);
    if (p->causal != ATTN_CAUSAL_NONE) visible = visible && j <= diag;
    if (visible && io->mask) {
      const int64_t* s = io->mask_strides;
      visible = io->mask[b * s[0] + h * s[1] + i * s[2] + j * s[3]] != 0;
    }
    double score = -INFINITY;
    if (visible) {
      double dot = 0;
      for (int64_t d = 0; d < p->head_dim; ++d) {
        const int64_t* qs = io->q.strides;
        const int64_t* ks = io->k.strides;
        dot += load(p->dtype, io->q.data, b * qs[0] + h * qs[1] + i * qs[2] + d * qs[3]) *
               load(p->dtype, io->k.data, b * ks[0] + g * ks[1] + j * ks[2] + d * ks[3]);
      }
      score = capped(p, p->scale * dot) + alibi(p, io, h, diag, j);
      if (io->bias.data) {
        const int64_t* s = io->bias.strides;
        score += load(p->dtype, io->bias.data, b * s[0] + h * s[1] + i * s[2] + j * s[3]);
      }
    }
    scores[j] = score;
    if (score > top) top = score;
  }
  double total = 0;
  if (top > -INFINITY) {
    for (int64_t j = 0; j < p->seq_k; ++j) {
      scores[j] = exp(scores[j] - top);
      total += scores[j];
    }
    total += exp(sink - top); /* 0 without a sink */
  }
  *top_out = top;
  *total_out = total;
}

static int32_t run(void* opaque, const char** error) {
  (void)error;
  const plan* pl = opaque;
  const attn_problem* p = &pl->p;
  const attn_io* io = &pl->io;
  const int64_t group = p->heads_q / p->heads_kv;
  for (int64_t b = 0; b < p->batch; ++b) {
    for (int64_t h = 0; h < p->heads_q; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < p->seq_q; ++i) {
        double top, total;
        row_weights(p, io, b, h, i, pl->scores, &top, &total);
        const int64_t* os = io->out_strides;
        for (int64_t d = 0; d < p->head_dim_v; ++d) {
          double acc = 0;
          if (total > 0) {
            const int64_t* vs = io->v.strides;
            for (int64_t j = 0; j < p->seq_k; ++j) {
              if (pl->scores[j] != 0) acc += pl->scores[j] * load(p->dtype, io->v.data, b * vs[0] + g * vs[1] + j * vs[2] + d * vs[3]);
            }
            acc /= total;
          }
          store(p->dtype, io->out, b * os[0] + h * os[1] + i * os[2] + d * os[3], acc);
        }
        /* A row with no visible key: out 0, lse the sink (-inf without one). */
        if (io->lse) io->lse[(b * p->heads_q + h) * p->seq_q + i] = total > 0 ? top + log(total) : -INFINITY;
      }
    }
  }
  return 0;
}

static void destroy(void* opaque) {
  plan* pl = opaque;
  free(pl->scores);
  free(pl);
}

#if ATTN_PLUGIN_ABI_VERSION >= 6
/* A whole layer (ABI 6): the projections and the output projection in
 * double, around this backend's own attention run on them as a float64
 * problem; the backward by the chain rule (docs/format/v3.md, "Layers"), with
 * the textbook attention backward in double. */

/* out[r, c] = sum_k a[r, k] b[k, c] (+ bias[c]); a transposed (a[k, r]) or b
 * transposed (b[c, k]) as the flags say. */
static void matmul(const double* a, int a_t, const double* b, int b_t, int64_t rows, int64_t inner, int64_t cols,
                   const double* bias, double* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      double acc = bias ? bias[c] : 0.0;
      for (int64_t k = 0; k < inner; ++k) {
        acc += (a_t ? a[k * rows + r] : a[r * inner + k]) * (b_t ? b[c * inner + k] : b[k * cols + c]);
      }
      out[r * cols + c] = acc;
    }
}

/* The column sums of d [rows, cols] into out (a bias's gradient). */
static void column_sums(const double* d, int64_t rows, int64_t cols, double* out) {
  for (int64_t c = 0; c < cols; ++c) {
    double acc = 0;
    for (int64_t r = 0; r < rows; ++r) acc += d[r * cols + c];
    out[c] = acc;
  }
}

/* Row-major strides of a [n0, n1, n2, n3] tensor broadcast to the problem's
 * [batch, heads, rows, seq_k] (0 on an axis of size 1). */
static void broadcast_strides(const attn_broadcast* s, int64_t seq_k, int64_t* strides) {
  strides[3] = 1;
  strides[2] = s->rows == 1 ? 0 : seq_k;
  strides[1] = s->heads == 1 ? 0 : s->rows * seq_k;
  strides[0] = s->batch == 1 ? 0 : s->heads * s->rows * seq_k;
}

/* Q, K, V (merged [batch, seq, heads * dim]), O likewise, and the float64
 * problem and io that view them as [batch, heads, seq, dim]. */
typedef struct layer_state {
  attn_problem p;
  attn_io io;
  double *q, *k, *v, *o;
  double* scores;
} layer_state;

static void layer_free(layer_state* s) {
  free(s->q), free(s->k), free(s->v), free(s->o), free(s->scores);
}

static int layer_forward(const attn_problem* problem, const attn_layer* l, layer_state* s) {
  const attn_problem* p = problem;
  const int64_t qw = p->heads_q * p->head_dim, kw = p->heads_kv * p->head_dim, vw = p->heads_kv * p->head_dim_v,
                ow = p->heads_q * p->head_dim_v;
  memset(s, 0, sizeof *s);
  s->q = malloc(sizeof(double) * (size_t)(p->batch * p->seq_q * qw + 1));
  s->k = malloc(sizeof(double) * (size_t)(p->batch * p->seq_k * kw + 1));
  s->v = malloc(sizeof(double) * (size_t)(p->batch * p->seq_k * vw + 1));
  s->o = malloc(sizeof(double) * (size_t)(p->batch * p->seq_q * ow + 1));
  s->scores = malloc(sizeof(double) * (size_t)(p->seq_k + 1));
  if (!s->q || !s->k || !s->v || !s->o || !s->scores) return 0;
  matmul(l->x_q, 0, l->w_q, 0, p->batch * p->seq_q, l->model_dim, qw, l->b_q, s->q);
  matmul(l->x_k, 0, l->w_k, 0, p->batch * p->seq_k, l->kdim, kw, l->b_k, s->k);
  matmul(l->x_v, 0, l->w_v, 0, p->batch * p->seq_k, l->vdim, vw, l->b_v, s->v);
  s->p = *p;
  s->p.dtype = ATTN_F64;
  s->p.layout = ATTN_LAYOUT_BSHD;
  /* [batch, heads, seq, dim] strides of a merged [batch, seq, heads * dim] array. */
  const int64_t q_strides[4] = {p->seq_q * qw, p->head_dim, qw, 1}, k_strides[4] = {p->seq_k * kw, p->head_dim, kw, 1},
                v_strides[4] = {p->seq_k * vw, p->head_dim_v, vw, 1}, o_strides[4] = {p->seq_q * ow, p->head_dim_v, ow, 1};
  s->io.q.data = s->q, memcpy(s->io.q.strides, q_strides, sizeof q_strides);
  s->io.k.data = s->k, memcpy(s->io.k.strides, k_strides, sizeof k_strides);
  s->io.v.data = s->v, memcpy(s->io.v.strides, v_strides, sizeof v_strides);
  s->io.out = s->o, memcpy(s->io.out_strides, o_strides, sizeof o_strides);
  s->io.mask = l->mask;
  if (l->mask) broadcast_strides(&p->mask, p->seq_k, s->io.mask_strides);
  s->io.bias.data = l->bias; /* float64, as the problem now is */
  if (l->bias) broadcast_strides(&p->bias, p->seq_k, s->io.bias.strides);
  s->io.kv_len = l->kv_len;
  s->io.alibi_slopes = l->alibi_slopes;
  s->io.sinks = l->sinks;
  plan pl = {s->p, s->io, s->scores};
  run(&pl, NULL);
  return 1;
}

static int32_t layer(void* user, const attn_problem* p, const attn_layer* l, double* y, int32_t threads,
                     const char** error) {
  (void)user, (void)threads;
  layer_state s;
  if (!layer_forward(p, l, &s)) {
    layer_free(&s);
    *error = "out of memory";
    return 1;
  }
  matmul(s.o, 0, l->w_o, 0, p->batch * p->seq_q, p->heads_q * p->head_dim_v, l->model_dim, l->b_o, y);
  layer_free(&s);
  return 0;
}

static int32_t layer_backward(void* user, const attn_problem* p, const attn_layer* l, const double* dout,
                              const attn_layer_gradients* g, int32_t threads, const char** error) {
  (void)user, (void)threads;
  const int64_t qw = p->heads_q * p->head_dim, kw = p->heads_kv * p->head_dim, vw = p->heads_kv * p->head_dim_v,
                ow = p->heads_q * p->head_dim_v, q_rows = p->batch * p->seq_q, k_rows = p->batch * p->seq_k;
  layer_state s;
  double* d_o = malloc(sizeof(double) * (size_t)(q_rows * ow + 1));
  double* dq = calloc((size_t)(q_rows * qw + 1), sizeof(double));
  double* dk = calloc((size_t)(k_rows * kw + 1), sizeof(double));
  double* dv = calloc((size_t)(k_rows * vw + 1), sizeof(double));
  double* dp = malloc(sizeof(double) * (size_t)(p->seq_k + 1));
  if (!layer_forward(p, l, &s) || !d_o || !dq || !dk || !dv || !dp) {
    layer_free(&s), free(d_o), free(dq), free(dk), free(dv), free(dp);
    *error = "out of memory";
    return 1;
  }
  /* The output projection: dO = dout w_o^T, dw_o = O^T dout, db_o. */
  matmul(dout, 0, l->w_o, 1, q_rows, l->model_dim, ow, NULL, d_o);
  matmul(s.o, 1, dout, 0, ow, q_rows, l->model_dim, NULL, g->dw_o);
  if (g->db_o) column_sums(dout, q_rows, l->model_dim, g->db_o);
  if (g->dbias) {
    memset(g->dbias, 0, sizeof(double) * (size_t)(p->bias.batch * p->bias.heads * p->bias.rows * p->seq_k));
  }
  if (g->dsinks) memset(g->dsinks, 0, sizeof(double) * (size_t)p->heads_q);
  /* The attention: P recomputed, dP = dO V^T, D = sum P dP, dS = P (dP - D). */
  const int64_t group = p->heads_q / p->heads_kv;
  for (int64_t b = 0; b < p->batch; ++b)
    for (int64_t h = 0; h < p->heads_q; ++h)
      for (int64_t i = 0; i < p->seq_q; ++i) {
        double top, total;
        row_weights(&s.p, &s.io, b, h, i, s.scores, &top, &total);
        if (total == 0) continue; /* no visible key and no sink: nothing flows */
        const int64_t g_kv = h / group;
        const double* d_oi = d_o + (b * p->seq_q + i) * ow + h * p->head_dim_v;
        double delta = 0;
        for (int64_t j = 0; j < p->seq_k; ++j) {
          s.scores[j] /= total;
          const double* vj = s.v + (b * p->seq_k + j) * vw + g_kv * p->head_dim_v;
          double acc = 0;
          for (int64_t d = 0; d < p->head_dim_v; ++d) acc += d_oi[d] * vj[d];
          dp[j] = acc;
          delta += s.scores[j] * acc;
        }
        if (g->dsinks) g->dsinks[h] -= exp(s.io.sinks[h] - top) / total * delta;
        const double* qi = s.q + (b * p->seq_q + i) * qw + h * p->head_dim;
        double* dqi = dq + (b * p->seq_q + i) * qw + h * p->head_dim;
        for (int64_t j = 0; j < p->seq_k; ++j) {
          const double pj = s.scores[j];
          if (pj == 0) continue;
          const double ds = pj * (dp[j] - delta);
          const double* kj = s.k + (b * p->seq_k + j) * kw + g_kv * p->head_dim;
          /* Through the softcap: the slope 1 - tanh^2 of the scaled score. */
          double ds_score = ds;
          if (p->softcap > 0) {
            double dot = 0;
            for (int64_t d = 0; d < p->head_dim; ++d) dot += qi[d] * kj[d];
            const double t = tanh(p->scale * dot / p->softcap);
            ds_score = ds * (1 - t * t);
          }
          double* dkj = dk + (b * p->seq_k + j) * kw + g_kv * p->head_dim;
          double* dvj = dv + (b * p->seq_k + j) * vw + g_kv * p->head_dim_v;
          for (int64_t d = 0; d < p->head_dim; ++d) {
            dqi[d] += p->scale * ds_score * kj[d];
            dkj[d] += p->scale * ds_score * qi[d];
          }
          for (int64_t d = 0; d < p->head_dim_v; ++d) dvj[d] += pj * d_oi[d];
          if (g->dbias) { /* summed over the bias's broadcast axes: its strides, 0 there */
            const int64_t* st = s.io.bias.strides;
            g->dbias[b * st[0] + h * st[1] + i * st[2] + j] += ds;
          }
        }
      }
  /* The input projections: dw = x^T d, db = column sums of d, dx = d w^T. */
  matmul(l->x_q, 1, dq, 0, l->model_dim, q_rows, qw, NULL, g->dw_q);
  matmul(l->x_k, 1, dk, 0, l->kdim, k_rows, kw, NULL, g->dw_k);
  matmul(l->x_v, 1, dv, 0, l->vdim, k_rows, vw, NULL, g->dw_v);
  if (g->db_q) column_sums(dq, q_rows, qw, g->db_q);
  if (g->db_k) column_sums(dk, k_rows, kw, g->db_k);
  if (g->db_v) column_sums(dv, k_rows, vw, g->db_v);
  matmul(dq, 0, l->w_q, 1, q_rows, qw, l->model_dim, NULL, g->dx_q);
  matmul(dk, 0, l->w_k, 1, k_rows, kw, l->kdim, NULL, g->dx_k);
  matmul(dv, 0, l->w_v, 1, k_rows, vw, l->vdim, NULL, g->dx_v);
  layer_free(&s), free(d_o), free(dq), free(dk), free(dv), free(dp);
  return 0;
}
#endif

static const attn_backend backends[] = {{
    .name = "example-c",
    .description = "a plain C plugin: scores in double, max-subtracted softmax, one rounding",
    .capabilities = "every dtype, mask, bias, kv_len, causal alignment and GQA; window, softcap, ALiBi, sinks (ABI 2); lse; "
                    "layers of its own, forward and backward (ABI 6)",
    .user = NULL,
    .available = available,
    .supports = supports,
    .prepare = prepare,
    .run = run,
    .destroy = destroy,
    .has_lse = 1,
#if ATTN_PLUGIN_ABI_VERSION >= 2
    .dtypes = ATTN_DTYPE_BIT(ATTN_F64) | ATTN_DTYPE_BIT(ATTN_F32) | ATTN_DTYPE_BIT(ATTN_F16) | ATTN_DTYPE_BIT(ATTN_BF16),
    .features = ATTN_FEATURE_WINDOW | ATTN_FEATURE_SOFTCAP | ATTN_FEATURE_ALIBI | ATTN_FEATURE_SINKS,
    .plan_has_lse = NULL, /* every plan writes lse */
#endif
#if ATTN_PLUGIN_ABI_VERSION >= 5
    /* Each row on its own, in one order: the same bits in any batch and layout. */
    .batch_invariant = 1,
    .bitwise_relations = ATTN_RELATION_LAYOUT,
#endif
#if ATTN_PLUGIN_ABI_VERSION >= 6
    .supports_layer = NULL, /* every layer its attention supports */
    .layer = layer,
    .layer_backward = layer_backward,
#endif
}};

static const attn_plugin plugin = {ATTN_PLUGIN_ABI_VERSION, sizeof(attn_backend), 1, backends};

__attribute__((visibility("default"))) uint32_t attn_plugin_abi_version(void) { return ATTN_PLUGIN_ABI_VERSION; }
__attribute__((visibility("default"))) const attn_plugin* attn_plugin_get(void) { return &plugin; }
