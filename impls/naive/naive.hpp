// The naive backend: the textbook algorithm (materialised score row, softmax
// with max subtraction, P V) in the case's precision, accumulating in float32
// for 16-bit types and float64 for float64. Every rule of the fixture format.
//
// `NaiveFlaws` exists for the verifier's own tests: each flag plants one bug
// that real backends have shipped, and the tests assert that the standard
// suite catches every one. The real backend runs with no flaw set.
#pragma once

#include <memory>
#include <string>

#include "core/backend.hpp"

namespace attn {

struct NaiveFlaws {
  bool no_scale = false;              // forgets to multiply q.k by scale
  bool scale_sqrt_head_dim_v = false; // uses 1/sqrt(head_dim_v) instead of scale
  bool scale_on_bias = false;         // scale * (q.k + bias)
  bool no_max_subtraction = false;    // exp(s) overflows for large logits
  bool causal_off_by_one = false;     // j < i instead of j <= i
  bool causal_swapped = false;        // top_left and bottom_right exchanged
  bool gqa_modulo = false;            // kv head h % heads_kv instead of h / group
  bool mask_ignores_query_axis = false;  // reads mask row 0 for every query
  bool f16_accumulation = false;      // P V accumulated in float16
  bool masked_row_mean = false;       // a row with no visible key returns mean(v)
  bool drop_last_key = false;         // loop stops one key early
};

std::unique_ptr<Backend> make_naive_backend();
std::unique_ptr<Backend> make_flawed_naive_backend(std::string name, const NaiveFlaws& flaws);

}  // namespace attn
