// The multi-head attention layer: reference, file round trip, verification
// around every backend, and the weights view (table and heatmap).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <fstream>

#include "attnbench/error.hpp"
#include "core/registry.hpp"
#include "fixtures/h5.hpp"
#include "fixtures/layer.hpp"
#include "fixtures/suite.hpp"
#include "impls/naive/naive.hpp"
#include "tests/mutants/catalogue.hpp"
#include "reference/layer.hpp"
#include "tests/declared.hpp"
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
  const CaseSpec* spec = nullptr;
  for (const auto& s : standard_suite()) {
    if (s.name == "layer/gqa_self_b2_s10_bf16") spec = &s;
  }
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
