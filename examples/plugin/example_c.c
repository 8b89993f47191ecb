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
 * (cmake.installed_package builds it both ways). */
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

static int32_t run(void* opaque, const char** error) {
  (void)error;
  const plan* pl = opaque;
  const attn_problem* p = &pl->p;
  const attn_io* io = &pl->io;
  const int64_t group = p->heads_q / p->heads_kv;
  for (int64_t b = 0; b < p->batch; ++b) {
    const int64_t kv_len = io->kv_len ? io->kv_len[b] : p->seq_k;
    for (int64_t h = 0; h < p->heads_q; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < p->seq_q; ++i) {
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
          pl->scores[j] = score;
          if (score > top) top = score;
        }
        double total = 0;
        if (top > -INFINITY) {
          for (int64_t j = 0; j < p->seq_k; ++j) {
            pl->scores[j] = exp(pl->scores[j] - top);
            total += pl->scores[j];
          }
          total += exp(sink - top); /* 0 without a sink */
        }
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

static const attn_backend backends[] = {{
    .name = "example-c",
    .description = "a plain C plugin: scores in double, max-subtracted softmax, one rounding",
    .capabilities = "every dtype, mask, bias, kv_len, causal alignment and GQA; window, softcap, ALiBi, sinks (ABI 2); lse",
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
}};

static const attn_plugin plugin = {ATTN_PLUGIN_ABI_VERSION, sizeof(attn_backend), 1, backends};

__attribute__((visibility("default"))) uint32_t attn_plugin_abi_version(void) { return ATTN_PLUGIN_ABI_VERSION; }
__attribute__((visibility("default"))) const attn_plugin* attn_plugin_get(void) { return &plugin; }
