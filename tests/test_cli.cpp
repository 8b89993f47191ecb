// End to end: the attn binary as a user or CI runs it, exit codes included.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fixtures/fixture.hpp"

namespace fs = std::filesystem;

namespace {

struct CliRun {
  int code;
  std::string output;
};

CliRun run_attn(const std::string& args) {
  std::string command = std::string(ATTN_CLI) + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  std::array<char, 4096> buffer;
  while (std::size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe)) output.append(buffer.data(), n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

const std::string kGolden = std::string(ATTN_SOURCE_DIR) + "/fixtures/golden";

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("attn_cli_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

}  // namespace

TEST_F(Cli, ListShowsEveryBackendAndItsAvailability) {
  CliRun r = run_attn("list");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.output.find("naive"), std::string::npos);
  EXPECT_NE(r.output.find("supports:"), std::string::npos);
}

TEST_F(Cli, VerifyPassesAndWritesJsonAndJunit) {
  CliRun r = run_attn("verify " + kGolden + "/basic " + kGolden + "/edge --backend naive --json " + (dir_ / "v.json").string() +
               " --junit " + (dir_ / "v.xml").string());
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("PASS"), std::string::npos);
  EXPECT_NE(r.output.find("err/bound"), std::string::npos);
  auto doc = nlohmann::json::parse(std::ifstream(dir_ / "v.json"));
  EXPECT_EQ(doc["results"].size(), 6u);
  EXPECT_TRUE(fs::exists(dir_ / "v.xml"));
}

TEST_F(Cli, AWrongGoldenIsAnInputErrorNamingTheFile) {
  attn::Fixture f = attn::read_fixture(kGolden + "/basic/b1_h2_q4_k4_d8_f32.h5");
  f.out[5] += 0.01;
  fs::path wrong = dir_ / "wrong.h5";
  attn::write_fixture(f, wrong);
  CliRun r = run_attn("verify " + wrong.string() + " --junit " + (dir_ / "v.xml").string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("input error: " + wrong.string()), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("FAIL ("), std::string::npos) << "no backend is blamed: " << r.output;
  std::ifstream xml_file(dir_ / "v.xml");
  std::string xml((std::istreambuf_iterator<char>(xml_file)), {});
  EXPECT_NE(xml.find("<error message="), std::string::npos) << xml;
}

TEST_F(Cli, AFailureExitsOneWithAReproduceCommand) {
  // A correct golden whose own tolerance no float32 backend can meet.
  attn::Fixture f = attn::read_fixture(kGolden + "/basic/b1_h2_q4_k4_d8_f32.h5");
  f.header.atol = 1e-300;
  fs::path wrong = dir_ / "wrong.h5";
  attn::write_fixture(f, wrong);
  CliRun r = run_attn("verify " + wrong.string() + " --junit " + (dir_ / "f.xml").string());
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("outside the fixture's own atol/rtol"), std::string::npos) << r.output;
  std::ifstream xml_file(dir_ / "f.xml");
  std::string xml((std::istreambuf_iterator<char>(xml_file)), {});
  EXPECT_NE(xml.find("reproduce: "), std::string::npos) << xml;
  EXPECT_NE(xml.find(" verify " + fs::absolute(wrong).string() + " --backend naive"), std::string::npos) << xml;
  // Several thread counts and layouts: each failure's command reproduces its own run.
  CliRun matrix = run_attn("verify " + wrong.string() + " --backend naive --threads 1,8 --layout bhsd,bshd");
  EXPECT_EQ(matrix.code, 1) << matrix.output;
  EXPECT_NE(matrix.output.find(fs::absolute(wrong).string() + " --backend naive --threads 8 --layout bshd"),
            std::string::npos) << matrix.output;
  EXPECT_NE(matrix.output.find("--threads 1 --layout bhsd"), std::string::npos) << matrix.output;
  EXPECT_NE(r.output.find("FAIL"), std::string::npos);
  EXPECT_NE(r.output.find("To reproduce"), std::string::npos);
  EXPECT_NE(r.output.find("verify " + wrong.string() + " --backend naive"), std::string::npos) << r.output;
}

TEST_F(Cli, OptionsNeverTakeThePathsAfterThem) {
  std::ofstream(dir_ / "broken.h5") << "garbage";
  // Before: --tag took the folder as a second tag, and the run verified the
  // golden smoke cases, exit 0, without looking at it.
  CliRun r = run_attn("verify --tag smoke " + dir_.string() + " --backend naive");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find((dir_ / "broken.h5").string()), std::string::npos) << r.output;
  CliRun t = run_attn("verify --threads 1 " + kGolden + "/basic -b naive");
  EXPECT_EQ(t.code, 0) << t.output;
  CliRun lists = run_attn("verify -b naive,streaming --tag smoke,edge " + kGolden + "/basic " + kGolden + "/edge");
  EXPECT_EQ(lists.code, 0) << lists.output;
  EXPECT_NE(lists.output.find("streaming    basic/b1_h2_q4_k4_d8_f32"), std::string::npos) << lists.output;
  EXPECT_NE(lists.output.find("naive        edge/seq_k_0_f32"), std::string::npos) << lists.output;
}

TEST_F(Cli, ARunWhereEverythingSkippedIsNotGreen) {
  const std::string f64 = kGolden + "/basic/b1_h2_q4_k4_d8_f64.h5";  // blocked has no float64
  CliRun r = run_attn("verify " + f64 + " -b blocked");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("nothing was verified"), std::string::npos) << r.output;
  EXPECT_EQ(run_attn("verify " + f64 + " -b blocked --allow-all-skipped").code, 0);
  EXPECT_EQ(run_attn("verify " + f64 + " -b blocked -b naive").code, 0);
}

TEST_F(Cli, UsageAndInputErrorsExitTwo) {
  EXPECT_EQ(run_attn("verify " + (dir_ / "missing").string()).code, 2);
  CliRun unknown = run_attn("verify " + kGolden + "/basic --backend nosuch");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.output.find("unknown backend 'nosuch'"), std::string::npos);
  EXPECT_EQ(run_attn("verify --no-such-flag").code, 2);
  EXPECT_EQ(run_attn("").code, 2);
  std::ofstream(dir_ / "broken.h5") << "garbage";
  CliRun broken = run_attn("verify " + (dir_ / "broken.h5").string());
  EXPECT_EQ(broken.code, 2);
  EXPECT_NE(broken.output.find("not an HDF5 file"), std::string::npos);
  CliRun no_tag = run_attn("verify " + kGolden + "/basic --tag no-such-tag");
  EXPECT_EQ(no_tag.code, 2);
}

TEST_F(Cli, FixturesShowPrintsTheCaseAndItsWeights) {
  CliRun r = run_attn("fixtures show " + kGolden + "/basic/b1_h2_q4_k4_d8_f16.h5");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.output.find("dtype=f16,b=1,hq=2,hkv=2,sq=4,sk=4,d=8"), std::string::npos);
  EXPECT_NE(r.output.find("attention weights"), std::string::npos);
  EXPECT_NE(r.output.find("q3"), std::string::npos);
  CliRun masked = run_attn("fixtures show " + kGolden + "/causal_top_left/q65_k17_f64.h5");
  EXPECT_EQ(masked.code, 0);
  EXPECT_EQ(run_attn("fixtures show " + (dir_ / "nothing.h5").string()).code, 2);
}

TEST_F(Cli, GenerateReproducesTheCommittedFilesBitForBit) {
  CliRun r = run_attn("fixtures generate --out " + dir_.string() + " --tag smoke");
  ASSERT_EQ(r.code, 0) << r.output;
  int compared = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir_)) {
    if (!entry.is_regular_file()) continue;
    fs::path golden = fs::path(kGolden) / fs::relative(entry.path(), dir_);
    std::ifstream a(entry.path(), std::ios::binary), b(golden, std::ios::binary);
    std::string bytes_a((std::istreambuf_iterator<char>(a)), {}), bytes_b((std::istreambuf_iterator<char>(b)), {});
    EXPECT_EQ(bytes_a, bytes_b) << golden;
    ++compared;
  }
  EXPECT_GE(compared, 10);
}
