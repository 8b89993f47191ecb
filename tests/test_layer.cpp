// The multi-head attention layer: reference, file round trip, verification
// around every backend, and the weights view (table and heatmap).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <fstream>
#include <functional>

#include "attnbench/error.hpp"
#include "core/extensions.hpp"
#include "core/registry.hpp"
#include "core/rng.hpp"
#include "fixtures/h5.hpp"
#include "fixtures/layer.hpp"
#include "fixtures/suite.hpp"
#include "impls/naive/naive.hpp"
#include "tests/mutants/catalogue.hpp"
#include "reference/layer.hpp"
#include "tests/declared.hpp"
#include "verify/conventions.hpp"
#include "verify/fuzz.hpp"
#include "verify/layer_backward.hpp"
#include "verify/layer.hpp"
#include "verify/run_case.hpp"
#include "verify/tolerance.hpp"
#include "verify/verifier.hpp"
#include "verify/weights.hpp"

using namespace attn;
namespace fs = std::filesystem;

namespace {

const fs::path kGolden = fs::path(ATTN_SOURCE_DIR) / "fixtures" / "golden";

std::string run_cli(const std::string& args, int* code) {
  FILE* pipe = popen((std::string(ATTN_CLI) + " " + args + " 2>&1").c_str(), "r");
  std::string output;
  std::array<char, 4096> buffer;
  while (std::size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe)) output.append(buffer.data(), n);
  int status = pclose(pipe);
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return output;
}

fs::path scratch_dir() {
  fs::path dir = fs::temp_directory_path() / ("attn_layer_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

// The standard suite's case of that name; nullptr when it has none.
const CaseSpec* suite_case(const std::string& name) {
  for (const auto& s : standard_suite()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

// model_dim 2, one head of 2, identity projections: the layer is plain attention on x.
LayerData identity_layer() {
  LayerData l;
  l.problem = Problem::parse("dtype=f64,b=1,hq=1,hkv=1,sq=2,sk=3,d=2,scale=1");
  l.model_dim = 2;
  l.x_q = {1, 0, 0, 1};
  l.x_k = {1, 0, 0, 1, 1, 1};
  l.x_v = {1, 0, 0, 2, 4, 0};
  l.w_q = l.w_k = l.w_v = l.w_o = {1, 0, 0, 1};
  l.masking.problem = l.problem;
  return l;
}

}  // namespace

TEST(LayerReference, IdentityProjectionsGiveThePlainAttentionWorkedOutByHand) {
  LayerData l = identity_layer();
  // Scores of q0 = [1, 0]: [1, 0, 1]; of q1 = [0, 1]: [0, 1, 1].
  const double e = std::exp(1.0), z = 2 * e + 1;
  std::vector<double> y = reference_layer(l).y;
  const double expected[] = {(e + 4 * e) / z, (2.0) / z, (1 + 4 * e) / z, (2 * e) / z};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[i], expected[i], 1e-15) << i;
  l.b_o = {1, -2};
  l.b_q = {0, 0};
  std::vector<double> shifted = reference_layer(l).y;
  EXPECT_NEAR(shifted[0], expected[0] + 1, 1e-15);
  EXPECT_NEAR(shifted[1], expected[1] - 2, 1e-15);
}

TEST(LayerReference, ProjectionsSplitHeadsByColumnBlocks) {
  // Two heads of width 1: head h owns column h of the projection.
  std::vector<double> x = {1, 2};  // one row, model_dim 2
  std::vector<double> w = {1, 10, 100, 1000};  // [2, 2]
  std::vector<double> q = reference_projection(x, 1, 2, w, 2, {0.5, 0.25});
  EXPECT_DOUBLE_EQ(q[0], 1 + 200 + 0.5);
  EXPECT_DOUBLE_EQ(q[1], 10 + 2000 + 0.25);
  EXPECT_EQ(split_heads({1, 2, 3, 4}, 1, 2, 2, 1), (std::vector<double>{1, 3, 2, 4}));
  EXPECT_EQ(merge_heads(split_heads({1, 2, 3, 4, 5, 6}, 1, 3, 2, 1), 1, 2, 3, 1), (std::vector<double>{1, 2, 3, 4, 5, 6}));
}

TEST(LayerFixtures, RoundTripAndClearErrors) {
  fs::path dir = scratch_dir();
  const CaseSpec* spec = suite_case("layer/gqa_self_b2_s10_bf16");
  ASSERT_NE(spec, nullptr);
  LayerFixture written = generate_layer_fixture(*spec);
  write_layer_fixture(written, dir / "layer.h5");
  LayerFixture read = read_layer_fixture(dir / "layer.h5");
  EXPECT_EQ(read.header.model_dim, 64);
  EXPECT_EQ(read.problem(), written.problem());
  EXPECT_EQ(read.data.w_k, written.data.w_k);
  EXPECT_EQ(read.data.b_o, written.data.b_o);
  EXPECT_EQ(read.y, written.y);
  EXPECT_EQ(read.data.w_k.size(), 64u * 2 * 8);  // GQA: only heads_kv * head_dim columns
  // The sdpa reader points at the layer reader, and a layer missing w_o is refused.
  try {
    read_fixture(dir / "layer.h5");
    FAIL() << "an mha file read as sdpa";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("layer case"), std::string::npos);
  }
  written.data.w_o.clear();
  {
    h5::File file = h5::File::create(dir / "broken.h5");
    file.write_attribute("format", std::string("attn-fixture"));
  }
  try {
    read_layer_fixture(dir / "broken.h5");
    FAIL() << "a broken file loaded";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("missing root attribute"), std::string::npos);
  }
  fs::remove_all(dir);
}

TEST(LayerVerification, EveryBackendPassesAndAFlawedOneFails) {
  auto files = find_fixture_files({kGolden / "layer", fs::path(ATTN_SOURCE_DIR) / "tests/data/h5py_pytorch_style_layer.h5"});
  ASSERT_EQ(files.size(), 22u);
  const auto backends = make_backends(std::vector<std::string>{"naive", "blocked", "streaming", "openblas", "onednn"});
  VerifySummary all = verify(files, backends, {});
  for (const auto& o : all.outcomes) {
    // onednn has no sinks (its softmax primitive cannot take one): the version 2 layers are its SKIP.
    for (const auto& b : backends) {
      if (b->name() == o.backend) {
        attn::testing::expect_pass_unless_undeclared(o, b->capabilities(), read_layer_fixture(o.file).data.problem);
      }
    }
  }
  std::vector<std::unique_ptr<Backend>> flawed;
  for (const auto& m : attn::testing::mutants()) {
    if (m.name == "naive_no_scale" || m.name == "naive_gqa_modulo") flawed.push_back(m.make());
  }
  ASSERT_EQ(flawed.size(), 2u);
  VerifySummary bad = verify(files, flawed, {});
  int no_scale = 0, gqa = 0;
  for (const auto& o : bad.outcomes) {
    if (o.comparison.verdict != Verdict::fail) continue;
    no_scale += o.backend == "naive_no_scale";
    gqa += o.backend == "naive_gqa_modulo" && o.fixture.find("gqa") != std::string::npos;
  }
  EXPECT_GE(no_scale, 10);
  EXPECT_EQ(gqa, 3);  // every GQA layer case
}

namespace {

// L = sum(dout * y) of the float64 reference, for finite differences.
double layer_loss(const LayerData& l, const std::vector<double>& dout) {
  const std::vector<double> y = reference_layer(l).y;
  double loss = 0;
  for (std::size_t e = 0; e < y.size(); ++e) loss += dout[e] * y[e];
  return loss;
}

// A small float64 layer with every parameter: GQA 4:2, a padded key, biases,
// keys 4 and values 2 wide into a model of 3 (kdim, vdim).
LayerData gradient_layer(Rng& rng) {
  LayerData l;
  l.problem = Problem::parse("dtype=f64,b=2,hq=4,hkv=2,sq=3,sk=4,d=2,kv_len");
  l.model_dim = 3;
  l.kdim = 4;
  l.vdim = 2;
  auto draw = [&](std::vector<double>& v, std::int64_t n) {
    v.resize(static_cast<std::size_t>(n));
    for (double& x : v) x = rng.normal();
  };
  draw(l.x_q, 2 * 3 * 3), draw(l.x_k, 2 * 4 * 4), draw(l.x_v, 2 * 4 * 2);
  draw(l.w_q, 3 * l.q_width()), draw(l.w_k, 4 * l.k_width()), draw(l.w_v, 2 * l.v_width()), draw(l.w_o, l.o_width() * 3);
  draw(l.b_q, l.q_width()), draw(l.b_k, l.k_width()), draw(l.b_v, l.v_width()), draw(l.b_o, 3);
  l.masking.problem = l.problem;
  l.masking.kv_len = {4, 2};
  return l;
}

// A framework's own layer (test side): naive's layer backward, then one flaw.
class FlawedLayer final : public Backend, public BackendExtensions {
 public:
  enum class Flaw { dw_o_transposed, b_v_gradient_left_out, key_padding_ignored_in_dw_k };
  explicit FlawedLayer(Flaw flaw) : flaw_(flaw) {}
  std::string_view name() const override {
    switch (flaw_) {
      case Flaw::dw_o_transposed: return "layer_dw_o_transposed";
      case Flaw::b_v_gradient_left_out: return "layer_b_v_gradient_left_out";
      case Flaw::key_padding_ignored_in_dw_k: return "layer_key_padding_ignored_in_dw_k";
    }
    return "";
  }
  std::string_view description() const override { return "test-side flawed layer backward"; }
  Capabilities capabilities() const override { return naive_.capabilities(); }
  Status supports(const Problem& p) const override { return naive_.supports(p); }
  Status supports_backward(const Problem& p) const override { return naive_.supports_backward(p); }
  std::unique_ptr<Plan> prepare(const Problem& p, const AttentionIO& io, const RunOptions& o) const override {
    return naive_.prepare(p, io, o);
  }
  std::unique_ptr<BackwardPlan> prepare_backward(const Problem& p, const BackwardIO& io, const RunOptions& o) const override {
    return naive_.prepare_backward(p, io, o);
  }
  const BackendExtensions* extensions() const override { return this; }
  bool runs_layers() const override { return true; }
  Status supports_layer(const Problem&, const LayerData&) const override { return Status::yes(); }
  std::vector<double> run_layer(const LayerData& layer, const RunOptions& options) const override {
    return attn::run_layer(naive_, layer, options).y;
  }
  LayerGradients run_layer_backward(const LayerData& layer, const std::vector<double>& dout, bool bias_gradient,
                                    const RunOptions& options) const override {
    LayerGradients g = attn::run_layer_backward(naive_, layer, dout, bias_gradient, options);
    switch (flaw_) {
      case Flaw::dw_o_transposed:  // [model, o_width] where [o_width, model] belongs: same count, wrong places
        g.dw_o = transposed(g.dw_o, layer.model_dim, layer.o_width());
        break;
      case Flaw::b_v_gradient_left_out:
        g.db_v.clear();
        break;
      case Flaw::key_padding_ignored_in_dw_k: {
        LayerData unpadded = layer;
        unpadded.problem.kv_len = false;
        unpadded.masking.problem.kv_len = false;
        unpadded.masking.kv_len.clear();
        g.dw_k = attn::run_layer_backward(naive_, unpadded, dout, bias_gradient, options).dw_k;
        break;
      }
    }
    return g;
  }

 private:
  Flaw flaw_;
  std::unique_ptr<Backend> naive_holder_ = make_naive_backend();
  const Backend& naive_ = *naive_holder_;
};

}  // namespace

// A framework's own layer that declares the mean of V on rows with no
// visible key (Keras: a masked score becomes -1e9) gives, on such a query,
// W_O times the mean of its float32-projected V plus b_O, with float32's
// rounding in every product: that y row follows the convention (within a
// bound of its own, not the format's row of 0, whose bound is b_O's
// rounding: TensorFlow 2.21 FAILed this case), and the same row one part
// in 10^4 off follows neither.
TEST(LayerVerification, AFloat32MeanOfVOnAFullyMaskedQueryFollowsTheDeclaredConvention) {
  const LayerFixture fixture = read_layer_fixture(kGolden / "layer_backward" / "mask_rows_cross_q5_k4_f32.h5");
  const LayerData& layer = fixture.data;
  const Problem& p = layer.problem;
  const LayerReference reference = reference_layer(layer);
  const std::vector<double> bound = derive_layer_bounds(layer, reference);
  // The attention of the float32 projections (naive), then the convention's
  // rows: the mean of V over every key, summed in float.
  const CaseData inputs = layer_attention_inputs(layer);
  const std::unique_ptr<Backend> naive = make_naive_backend();
  std::vector<double> out = run_backend(*naive, inputs, {}).out;
  std::int64_t empty = 0;
  for (std::int64_t row = 0; row < p.rows(); ++row) {
    if (reference.stats.visible[static_cast<std::size_t>(row)] != 0) continue;
    ++empty;
    const std::int64_t b = row / (p.heads_q * p.seq_q), g = row / p.seq_q % p.heads_q / p.group_size();
    for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
      float sum = 0;
      for (std::int64_t j = 0; j < p.seq_k; ++j) {
        sum += static_cast<float>(inputs.v[static_cast<std::size_t>(((b * p.heads_kv + g) * p.seq_k + j) * p.head_dim_v + d)]);
      }
      out[static_cast<std::size_t>(row * p.head_dim_v + d)] = sum / static_cast<float>(p.seq_k);
    }
  }
  ASSERT_GT(empty, 0) << "the case should have fully masked rows";
  const std::vector<double> merged = merge_heads(out, p.batch, p.heads_q, p.seq_q, p.head_dim_v);
  const std::vector<double> y = project_in_dtype(merged, p.batch * p.seq_q, layer.o_width(), layer.w_o, layer.model_dim,
                                                 layer.b_o, p.dtype);
  const std::vector<Convention> mean_v = {{ConventionKind::empty_rows_mean_v, "a test's"}};
  std::vector<double> followed = y;
  const ConventionOutcome o = apply_layer_conventions(mean_v, layer, reference, bound, followed);
  EXPECT_TRUE(o.failure.empty()) << o.failure;
  EXPECT_GT(o.rows_followed, 0);
  EXPECT_EQ(o.rows_followed, o.empty_rows);
  // One element of the first such query's y, a part in 10^4 off.
  std::vector<double> wrong = y;
  for (std::int64_t q = 0; q < p.batch * p.seq_q; ++q) {
    const std::int64_t b = q / p.seq_q, i = q % p.seq_q;
    if (reference.stats.visible[static_cast<std::size_t>((b * p.heads_q) * p.seq_q + i)] != 0) continue;
    wrong[static_cast<std::size_t>(q * layer.model_dim)] *= 1 + 1e-4;
    break;
  }
  EXPECT_FALSE(apply_layer_conventions(mean_v, layer, reference, bound, wrong).failure.empty());
}

// The layer's gradients under a declared mean of V (Keras' layer, whose
// masked softmax fills hidden scores with -1e9): computed here apart from
// the verifier, the attention's chain written out with uniform weights on
// the rows that see no key, no gradient to their (filled) scores, or, for
// an additive -1e9, the uniform weights' own dS. Each passes the truth that
// conventional_layer_truth builds for its way, fails the other's and the
// format's. (TensorFlow 2.21's Keras layer: DIFFERS on this case.)
TEST(LayerGradients, AMeanOfVConventionIsCarriedThroughTheProjections) {
  const LayerFixture fixture = read_layer_fixture(kGolden / "layer_backward" / "mask_rows_cross_q5_k4_f32.h5");
  const LayerData& layer = fixture.data;
  const Problem& p = layer.problem;
  const LayerReference reference = reference_layer(layer);
  const CaseData& a = reference.attention;
  const std::vector<double> d_o = layer_attention_dout(layer, fixture.dout, reference_matmul);
  auto by_hand = [&](bool additive) {
    std::vector<double> out(static_cast<std::size_t>(p.rows() * p.head_dim_v), 0.0), dq(a.q.size(), 0.0),
        dk(a.k.size(), 0.0), dv(a.v.size(), 0.0);
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t h = 0; h < p.heads_q; ++h)
        for (std::int64_t i = 0; i < p.seq_q; ++i) {
          const std::int64_t row = (b * p.heads_q + h) * p.seq_q + i, g = h / p.group_size();
          auto qi = [&](std::int64_t d) { return static_cast<std::size_t>(row * p.head_dim + d); };
          auto kj = [&](std::int64_t j, std::int64_t d, std::int64_t w) {
            return static_cast<std::size_t>(((b * p.heads_kv + g) * p.seq_k + j) * w + d);
          };
          std::vector<double> s(static_cast<std::size_t>(p.seq_k)), w(s.size()), dp(s.size());
          bool any = false;
          for (std::int64_t j = 0; j < p.seq_k; ++j) any = any || reference_visible(a, b, h, i, j);
          double top = -INFINITY, total = 0;
          for (std::int64_t j = 0; j < p.seq_k; ++j) {
            double x = 0;
            for (std::int64_t d = 0; d < p.head_dim; ++d) x += a.q[qi(d)] * a.k[kj(j, d, p.head_dim)];
            s[static_cast<std::size_t>(j)] = p.scale * x;
            if (any && reference_visible(a, b, h, i, j)) top = std::max(top, s[static_cast<std::size_t>(j)]);
          }
          for (std::int64_t j = 0; j < p.seq_k; ++j) {
            const double e = !any ? 1.0 : reference_visible(a, b, h, i, j) ? std::exp(s[static_cast<std::size_t>(j)] - top) : 0.0;
            w[static_cast<std::size_t>(j)] = e, total += e;
          }
          double delta = 0;
          for (std::int64_t j = 0; j < p.seq_k; ++j) {
            const double pj = w[static_cast<std::size_t>(j)] / total;
            w[static_cast<std::size_t>(j)] = pj;
            double x = 0;
            for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
              out[static_cast<std::size_t>(row * p.head_dim_v + d)] += pj * a.v[kj(j, d, p.head_dim_v)];
              dv[kj(j, d, p.head_dim_v)] += pj * d_o[static_cast<std::size_t>(row * p.head_dim_v + d)];
              x += d_o[static_cast<std::size_t>(row * p.head_dim_v + d)] * a.v[kj(j, d, p.head_dim_v)];
            }
            dp[static_cast<std::size_t>(j)] = x, delta += pj * x;
          }
          if (!any && !additive) continue;  // filled scores: nothing reaches Q and K
          for (std::int64_t j = 0; j < p.seq_k; ++j) {
            const double ds = p.scale * w[static_cast<std::size_t>(j)] * (dp[static_cast<std::size_t>(j)] - delta);
            for (std::int64_t d = 0; d < p.head_dim; ++d) {
              dq[qi(d)] += ds * a.k[kj(j, d, p.head_dim)];
              dk[kj(j, d, p.head_dim)] += ds * a.q[qi(d)];
            }
          }
        }
    return layer_gradients(layer, fixture.dout, out, dq, dk, dv, {}, {}, reference_matmul);
  };
  const LayerGradientTruth format = layer_gradient_truth(layer, reference, fixture.dout, fixture.bias_requires_grad);
  std::int64_t rows = 0;
  const LayerGradientTruth filled = conventional_layer_truth(layer, reference, fixture.dout, false, format, false, rows);
  EXPECT_GT(rows, 0);
  const LayerGradientTruth additive = conventional_layer_truth(layer, reference, fixture.dout, false, format, true, rows);
  const LayerGradients fill_got = by_hand(false), additive_got = by_hand(true);
  EXPECT_EQ(judge_layer_backward(layer, false, filled, fill_got).verdict, Verdict::pass)
      << judge_layer_backward(layer, false, filled, fill_got).reason;
  EXPECT_EQ(judge_layer_backward(layer, false, additive, additive_got).verdict, Verdict::pass)
      << judge_layer_backward(layer, false, additive, additive_got).reason;
  EXPECT_EQ(judge_layer_backward(layer, false, filled, additive_got).verdict, Verdict::fail);
  EXPECT_EQ(judge_layer_backward(layer, false, additive, fill_got).verdict, Verdict::fail);
  EXPECT_EQ(judge_layer_backward(layer, false, format, fill_got).verdict, Verdict::fail);
}

TEST(LayerGradients, TheChainRuleMatchesFiniteDifferencesOfTheLayer) {
  Rng rng(7);
  const LayerData layer = gradient_layer(rng);
  std::vector<double> dout(2 * 3 * 3);
  for (double& x : dout) x = rng.normal();
  const LayerReference reference = reference_layer(layer);
  const LayerGradients g = reference_layer_backward(layer, reference, dout, false).value;
  // Central differences of L for every element of every input and parameter.
  const double h = 1e-5;
  auto check = [&](std::vector<double> LayerData::*input, const std::vector<double>& grad, const char* name) {
    ASSERT_EQ(grad.size(), (layer.*input).size()) << name;
    for (std::size_t e = 0; e < grad.size(); ++e) {
      LayerData plus = layer, minus = layer;
      (plus.*input)[e] += h, (minus.*input)[e] -= h;
      const double numeric = (layer_loss(plus, dout) - layer_loss(minus, dout)) / (2 * h);
      EXPECT_NEAR(grad[e], numeric, 1e-7 * (1 + std::fabs(numeric))) << name << "[" << e << "]";
    }
  };
  check(&LayerData::x_q, g.dx_q, "dx_q");
  check(&LayerData::x_k, g.dx_k, "dx_k");
  check(&LayerData::x_v, g.dx_v, "dx_v");
  check(&LayerData::w_q, g.dw_q, "dw_q");
  check(&LayerData::w_k, g.dw_k, "dw_k");
  check(&LayerData::w_v, g.dw_v, "dw_v");
  check(&LayerData::w_o, g.dw_o, "dw_o");
  check(&LayerData::b_q, g.db_q, "db_q");
  check(&LayerData::b_k, g.db_k, "db_k");
  check(&LayerData::b_v, g.db_v, "db_v");
  check(&LayerData::b_o, g.db_o, "db_o");
  // A key bias moves every score of a row alike: no gradient at all.
  for (double x : g.db_k) EXPECT_NEAR(x, 0.0, 1e-14);
  // The padded keys of entry 1 (positions 2 and 3) reach no gradient of x_k.
  for (std::int64_t j = 2; j < 4; ++j)
    for (std::int64_t c = 0; c < 4; ++c) EXPECT_EQ(g.dx_k[static_cast<std::size_t>((4 + j) * 4 + c)], 0.0) << j;
}

TEST(LayerFixtures, GradientsRoundTripAndClearErrors) {
  fs::path dir = scratch_dir();
  const CaseSpec* spec = suite_case("layer_backward/bias_trainable_b2_s8_bf16");
  ASSERT_NE(spec, nullptr);
  const LayerFixture written = generate_layer_fixture(*spec);
  ASSERT_TRUE(written.gradients.has_value());
  write_layer_fixture(written, dir / "layer.h5");
  const LayerFixture read = read_layer_fixture(dir / "layer.h5");
  EXPECT_EQ(read.header.format_version, 3);
  EXPECT_TRUE(read.bias_requires_grad);
  EXPECT_EQ(read.dout, written.dout);
  EXPECT_EQ(read.gradients->dw_o, written.gradients->dw_o);
  EXPECT_EQ(read.gradients->db_v, written.gradients->db_v);
  EXPECT_EQ(read.gradients->dbias, written.gradients->dbias);
  EXPECT_EQ(read.gradients->dx_k.size(), 2u * 8 * 64);
  // Each refusal names what is wrong: a missing gradient, one the layer has
  // nothing for, an attention case's gradient, a dout the dtype cannot hold.
  auto put = [](hid_t f, const char* name, const std::vector<hsize_t>& dims, const std::vector<double>& values, hid_t type) {
    if (H5Lexists(f, name, H5P_DEFAULT) > 0) H5Ldelete(f, name, H5P_DEFAULT);
    const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t d = H5Dcreate2(f, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
    H5Dclose(d);
    H5Sclose(space);
  };
  auto refused = [&](const std::function<void(hid_t)>& damage, const std::string& expected) {
    const fs::path file = dir / "damaged.h5";
    fs::copy_file(dir / "layer.h5", file, fs::copy_options::overwrite_existing);
    const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    damage(f);
    H5Fclose(f);
    try {
      read_layer_fixture(file);
      ADD_FAILURE() << "loaded: " << expected;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  refused([](hid_t f) { H5Ldelete(f, "dw_o", H5P_DEFAULT); }, "dataset 'dw_o' is missing");
  refused([](hid_t f) { H5Ldelete(f, "b_q", H5P_DEFAULT); }, "dataset 'db_q' is present, but the layer has nothing");
  refused([&](hid_t f) { put(f, "dq", {2, 8, 8, 8}, std::vector<double>(2 * 8 * 8 * 8, 0.0), H5T_IEEE_F64LE); },
          "is an attention case's gradient");
  refused([&](hid_t f) {
    std::vector<double> dout = written.dout;
    dout[5] = 1.0 + 1.0 / 1024;  // not a bfloat16
    put(f, "dout", {2, 8, 64}, dout, H5T_IEEE_F32LE);
  }, "not exactly representable in bfloat16");
  // A file whose declared sizes fit in memory but whose projections (and
  // their gradients) would take 10^12 multiply-adds is refused from its
  // attributes, before a dataset is looked at: model 3072, 48 heads of 64,
  // 2 x 1000 tokens.
  refused([](hid_t f) {
    const std::int64_t b = 2, s = 1000, m = 3072;
    for (auto [name, value] : {std::pair{"batch", b}, std::pair{"seq_q", s}, std::pair{"seq_k", s}, std::pair{"model_dim", m},
                               std::pair{"heads_q", std::int64_t{48}}, std::pair{"heads_kv", std::int64_t{48}},
                               std::pair{"head_dim", std::int64_t{64}}, std::pair{"head_dim_v", std::int64_t{64}}}) {
      H5Adelete(f, name);
      const hid_t space = H5Screate(H5S_SCALAR);
      const hid_t a = H5Acreate2(f, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(a, H5T_NATIVE_INT64, &value);
      H5Aclose(a);
      H5Sclose(space);
    }
    H5Adelete(f, "bias_requires_grad");
    for (const char* name : {"bias", "dbias"}) H5Ldelete(f, name, H5P_DEFAULT);
  }, "multiply-adds, more than the limit");
  // kdim and vdim: a key input of another width without its attribute, one
  // that disagrees with the attribute, and an impossible width.
  const fs::path widths = fs::path(ATTN_SOURCE_DIR) / "tests/data/h5py_pytorch_style_layer_gradients_kdim_vdim.h5";
  const LayerFixture h5py_layer = read_layer_fixture(widths);
  EXPECT_EQ(h5py_layer.data.k_in(), 12);
  EXPECT_EQ(h5py_layer.data.v_in(), 6);
  auto set_width = [](hid_t f, const char* name, std::int64_t value) {
    if (H5Aexists(f, name) > 0) H5Adelete(f, name);
    if (value < 0) return;
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate2(f, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &value);
    H5Aclose(a);
    H5Sclose(space);
  };
  fs::copy_file(widths, dir / "layer.h5", fs::copy_options::overwrite_existing);
  refused([&](hid_t f) { set_width(f, "kdim", -1); }, "dataset 'x_k' is 12 wide, model_dim is 16: a layer whose key input");
  refused([&](hid_t f) { set_width(f, "vdim", 7); }, "dataset 'x_v' has shape [2, 5, 6], expected [2, 5, 7]");
  refused([&](hid_t f) { set_width(f, "kdim", 0); }, "attribute 'kdim' is 0, expected at least 1");
  fs::remove_all(dir);
}

TEST(LayerGradients, EveryBackendPassesAndEachFlawedLayerFails) {
  // The suite's, one h5py wrote from NumPy as a converter from
  // nn.MultiheadAttention with kdim and vdim would, and two whose golden y
  // and gradients Keras and PyTorch computed themselves in float64
  // (tests/data/make_framework_layer_cases.py).
  const fs::path data = fs::path(ATTN_SOURCE_DIR) / "tests/data";
  const auto files = find_fixture_files({kGolden / "layer_backward", data / "h5py_pytorch_style_layer_gradients_kdim_vdim.h5",
                                         data / "keras_layer_gradients_kdim_vdim_padding_f32.h5",
                                         data / "torch_layer_gradients_kdim_vdim_padding_causal_f32.h5"});
  ASSERT_EQ(files.size(), 30u);
  // The mixed-precision cases hold float32 master weights the dtype cannot hold.
  int mixed = 0;
  for (const auto& file : files) {
    if (file.filename().string().find("mixed_f32_weights") == std::string::npos) continue;
    const LayerData l = read_layer_fixture(file).data;
    ++mixed;
    EXPECT_FALSE(std::all_of(l.w_q.begin(), l.w_q.end(), [&](double w) { return is_representable(w, l.problem.dtype); }));
    EXPECT_TRUE(std::all_of(l.x_q.begin(), l.x_q.end(), [&](double x) { return is_representable(x, l.problem.dtype); }));
  }
  EXPECT_EQ(mixed, 2);
  const auto backends = make_backends(std::vector<std::string>{"naive", "blocked", "streaming", "openblas", "onednn"});
  VerifyOptions backward_only;
  backward_only.forward = false;
  const VerifySummary all = verify(files, backends, backward_only);
  int judged = 0;
  for (const auto& o : all.outcomes) {
    ASSERT_EQ(o.direction, Direction::backward);
    judged += o.comparison.verdict == Verdict::pass;
    // A SKIP only where the backend declares it (float64, onednn's sinks).
    for (const auto& b : backends) {
      if (b->name() == o.backend) {
        attn::testing::expect_pass_unless_undeclared(o, b->capabilities(), read_layer_fixture(o.file).data.problem);
      }
    }
  }
  EXPECT_EQ(judged, 29 * 5 - 3 + 1);  // float64: naive alone; sinks: not onednn
  // Each flaw fails where the suite has what it breaks, and nowhere else.
  for (auto flaw : {FlawedLayer::Flaw::dw_o_transposed, FlawedLayer::Flaw::b_v_gradient_left_out,
                    FlawedLayer::Flaw::key_padding_ignored_in_dw_k}) {
    std::vector<std::unique_ptr<Backend>> flawed;
    flawed.push_back(std::make_unique<FlawedLayer>(flaw));
    const VerifySummary bad = verify(files, flawed, backward_only);
    int failed = 0;
    std::string names;
    for (const auto& o : bad.outcomes) {
      if (o.comparison.verdict != Verdict::fail) continue;
      ++failed;
      names += o.fixture + ": " + o.comparison.reason.substr(0, 80) + "\n";
    }
    switch (flaw) {
      case FlawedLayer::Flaw::dw_o_transposed: EXPECT_EQ(failed, 30) << names; break;
      case FlawedLayer::Flaw::b_v_gradient_left_out: EXPECT_EQ(failed, 27) << names; break;  // the cases with biases
      case FlawedLayer::Flaw::key_padding_ignored_in_dw_k: EXPECT_EQ(failed, 6) << names; break;  // kv_len's
    }
  }
}

// The fuzzer draws whole layers (1 case in 16; attn fuzz --layers, only
// them): each flawed layer is found within seed 1's first 100 layer cases,
// shrunk to a layer fixture from which nothing simpler still fails, and the
// file reproduces the failure while naive passes it.
TEST(LayerGradients, TheFuzzerFindsEachFlawedLayerAndShrinksItToALayerFixture) {
  std::vector<std::unique_ptr<Backend>> flawed;
  for (auto flaw : {FlawedLayer::Flaw::dw_o_transposed, FlawedLayer::Flaw::b_v_gradient_left_out,
                    FlawedLayer::Flaw::key_padding_ignored_in_dw_k}) {
    flawed.push_back(std::make_unique<FlawedLayer>(flaw));
  }
  FuzzOptions options;
  options.seed = 1;
  options.cases = 100;
  options.layers_only = true;
  options.out_dir = scratch_dir() / "fuzz";
  const FuzzSummary summary = run_fuzz(flawed, options);
  ASSERT_EQ(summary.failures.size(), flawed.size());
  const auto naive = make_backends(std::vector<std::string>{"naive"});
  for (const FuzzFailure& f : summary.failures) {
    SCOPED_TRACE(f.backend);
    EXPECT_TRUE(f.shrunk.smallest.layer()) << f.shrunk.smallest.describe();
    EXPECT_TRUE(f.shrunk.minimal);
    const Backend& mutant = **std::find_if(flawed.begin(), flawed.end(), [&](const auto& b) { return b->name() == f.backend; });
    for (const FuzzCase& simpler : simpler_fuzz_cases(f.shrunk.smallest)) {
      EXPECT_FALSE(judge_fuzz_case(mutant, simpler, &f.check).failed) << simpler.describe();
    }
    const LayerFixture file = read_layer_fixture(f.file);
    EXPECT_GE(verify_layer_fixture(file, {&mutant}, {}).failed(), 1) << f.file;
    EXPECT_EQ(verify_layer_fixture(file, {naive.front().get()}, {}).failed(), 0) << f.file;
  }
  fs::remove_all(options.out_dir);
}

// The Python contract's layer_backward(), through the bridge: a NumPy layer
// of its own (test side) passes, and each of its flaws fails, named.
TEST(LayerGradients, APythonLayersOwnBackwardIsJudgedThroughTheBridge) {
  const std::string plugin = std::string(ATTN_SOURCE_DIR) + "/tests/plugins/python_layer/numpy_layer.py";
  const std::string cases = (kGolden / "layer_backward/padding_cross_q6_k9_f32.h5").string() + " " +
                            (kGolden / "layer_backward/bias_trainable_b2_s8_bf16.h5").string() + " " +
                            (kGolden / "layer_backward/kdim40_vdim24_padding_q6_k9_f16.h5").string();
  int code = 0;
  std::string out = run_cli("verify --plugin " + plugin + " -b py-numpy-layer " + cases, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("padding_cross_q6_k9_f32 backward"), std::string::npos) << out;
  EXPECT_EQ(out.find("SKIP ("), std::string::npos) << out;
  for (const auto& [flaw, expected] : {std::pair{"dw_o_transposed", "dw_o: RMS error"},
                                       std::pair{"db_v_left_out", "db_v: 0 values returned, expected 64"}}) {
    setenv("ATTN_TEST_LAYER_FLAW", flaw, 1);
    out = run_cli(std::string("verify --plugin ") + plugin + " -b py-numpy-layer " + cases, &code);
    unsetenv("ATTN_TEST_LAYER_FLAW");
    EXPECT_EQ(code, 1) << flaw << "\n" << out;
    EXPECT_NE(out.find(expected), std::string::npos) << flaw << "\n" << out;
  }
}

TEST(WeightsView, TableOfAHandMadeCaseMatchesHandValues) {
  fs::path dir = scratch_dir();
  Fixture f;
  f.header.name = "hand/2x3x4";
  f.data.problem = Problem::parse("dtype=f32,b=1,hq=1,hkv=1,sq=2,sk=3,d=4,scale=0.5,mask=1x1x2");
  f.header.problem = f.data.problem;
  f.data.q = {2, 0, 0, 0, 0, 2, 0, 0};
  f.data.k = {1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0};
  f.data.v = {1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 4, 0};
  f.data.mask = {1, 1, 1, 1, 0, 1};  // q1 cannot see k1
  ReferenceResult r = reference_attention(f.data);
  f.out = r.out;
  write_fixture(f, dir / "hand.h5");
  // q0: scores [1, 0, 1] -> [e, 1, e] / (2e + 1); q1 sees k0 (0) and k2 (1) -> [1, -, e] / (1 + e).
  const double e = std::exp(1.0);
  for (const char* backend : {"", " --backend naive", " --backend streaming"}) {
    int code = 0;
    std::string table = run_cli("show " + (dir / "hand.h5").string() + " --weights" + backend, &code);
    ASSERT_EQ(code, 0) << table;
    char expected0[128], expected1[128];
    std::snprintf(expected0, sizeof expected0, "%-8s %7.3f %7.3f %7.3f", "q0", e / (2 * e + 1), 1 / (2 * e + 1), e / (2 * e + 1));
    std::snprintf(expected1, sizeof expected1, "%-8s %7.3f %7s %7.3f", "q1", 1 / (1 + e), "-", e / (1 + e));
    EXPECT_NE(table.find(expected0), std::string::npos) << table << "\nexpected: " << expected0;
    EXPECT_NE(table.find(expected1), std::string::npos) << table << "\nexpected: " << expected1;
  }
  fs::remove_all(dir);
}

// attn show --gradient: dP is dO . v at every visible key, and each row of
// dS = P (dP - D) sums to 0 (sum_j P_j dP_j = D, the weighted mean); hidden
// keys are '-' and a backend's dS cannot be asked for.
TEST(WeightsView, GradientViewsOfAVersion3Case) {
  const Fixture f = read_fixture(kGolden / "backward/gqa_causal_br_q33_k17_f32.h5");
  const Problem& p = f.problem();
  for (std::int64_t h = 0; h < p.heads_q; ++h) {
    const WeightsView dp = reference_gradient_view(f.data, f.gradients->dout, 0, h, GradientMatrix::dp);
    const WeightsView ds = reference_gradient_view(f.data, f.gradients->dout, 0, h, GradientMatrix::ds);
    const std::int64_t g = h / p.group_size();
    int rows = 0;
    for (std::int64_t i = 0; i < p.seq_q; ++i) {
      double sum = 0, size = 0;
      for (std::int64_t j = 0; j < p.seq_k; ++j) {
        const auto e = static_cast<std::size_t>(i * p.seq_k + j);
        if (ds.hidden[e]) {
          EXPECT_EQ(ds.weights[e], 0.0);
          continue;
        }
        double want = 0;
        for (std::int64_t d = 0; d < p.head_dim_v; ++d) {
          want += f.gradients->dout[static_cast<std::size_t>((h * p.seq_q + i) * p.head_dim_v + d)] *
                  f.data.v[static_cast<std::size_t>((g * p.seq_k + j) * p.head_dim_v + d)];
        }
        EXPECT_NEAR(dp.weights[e], want, 1e-12 * (1 + std::fabs(want)));
        sum += ds.weights[e];
        size += std::fabs(ds.weights[e]);
      }
      if (size == 0) continue;
      ++rows;
      EXPECT_LE(std::fabs(sum), 1e-12 * size) << "head " << h << " row " << i;
    }
    // Bottom-right causal, 33 queries and 17 keys: 16 rows see nothing, and
    // the next sees one key, whose dS is exactly 0 (P = 1, dP = D).
    EXPECT_EQ(rows, 16);
  }
  int code = 0;
  const std::string file = (kGolden / "backward/gqa_causal_br_q33_k17_f32.h5").string();
  std::string table = run_cli("show " + file + " --gradient ds --head 1", &code);
  EXPECT_EQ(code, 0) << table;
  EXPECT_NE(table.find("dS = P (dP - D)"), std::string::npos) << table;
  run_cli("show " + file + " --gradient ds -b naive", &code);
  EXPECT_EQ(code, 2);  // a usage error
  run_cli("show " + (kGolden / "basic/b1_h2_q4_k4_d8_f32.h5").string() + " --gradient dp", &code);
  EXPECT_EQ(code, 2);
}

TEST(WeightsView, HeatmapIsARealPngOfTheExpectedSize) {
  fs::path dir = scratch_dir();
  int code = 0;
  // 8 heads: 4 columns x 2 rows of panels -> (3.2 * 4 + 2.0) x (3.2 * 2 + 1.0) inches at 100 dpi.
  std::string output = run_cli("show " + (kGolden / "layer/self_b2_s10_f32.h5").string() + " --heatmap " +
                                   (dir / "w.png").string(), &code);
  ASSERT_EQ(code, 0) << output;
  std::ifstream png(dir / "w.png", std::ios::binary);
  std::array<unsigned char, 24> head{};
  png.read(reinterpret_cast<char*>(head.data()), head.size());
  const unsigned char signature[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  EXPECT_TRUE(std::equal(signature, signature + 8, head.begin()));
  auto be32 = [&](int at) { return (head[at] << 24) | (head[at + 1] << 16) | (head[at + 2] << 8) | head[at + 3]; };
  EXPECT_EQ(be32(16), 1480);  // IHDR width
  EXPECT_EQ(be32(20), 740);   // IHDR height
  EXPECT_GT(fs::file_size(dir / "w.png"), 20000u);  // drawn, not blank
  // One head only: 1 panel -> 520 x 420.
  run_cli("show " + (kGolden / "layer/self_b2_s10_f32.h5").string() + " --head 3 --heatmap " + (dir / "one.png").string(), &code);
  ASSERT_EQ(code, 0);
  std::ifstream one(dir / "one.png", std::ios::binary);
  one.read(reinterpret_cast<char*>(head.data()), head.size());
  EXPECT_EQ(be32(16), 520);
  EXPECT_EQ(be32(20), 420);
  fs::remove_all(dir);
}
