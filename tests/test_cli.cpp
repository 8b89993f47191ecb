// End to end: the attn binary as a user or CI runs it, exit codes included.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <nlohmann/json.hpp>

#include "fixtures/fixture.hpp"
#include "tests/cli_run.hpp"

namespace fs = std::filesystem;

namespace {

using attn::test::CliRun;
using attn::test::run_attn;
using attn::test::run_attn_env;
using attn::test::run_attn_with;

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

// Long descriptions and reasons wrap under their own column: no line runs past
// the width, and continuation lines start at the text column.
TEST_F(Cli, ListWrapsLongTextUnderItsColumn) {
  CliRun r = run_attn_env("COLUMNS=72", "list");
  ASSERT_EQ(r.code, 0) << r.output;
  std::istringstream lines(r.output);
  std::string line;
  int continued = 0;
  std::size_t column = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("backend ", 0) == 0) column = line.find("description");
    if (column == 0 || line.empty()) continue;  // the host line above the table
    // Only a word longer than the column may pass the width, on a line of its own.
    if (line.size() > 72u) {
      EXPECT_EQ(line.find(' ', line.find_first_not_of(' ', column)), std::string::npos) << line;
    }
    if (line.find_first_not_of(' ') == column) ++continued;
  }
  ASSERT_GT(column, 0u) << r.output;
  EXPECT_GT(continued, 3) << r.output;
}

TEST_F(Cli, VerifyPassesAndWritesJsonAndJunit) {
  CliRun r = run_attn("verify " + kGolden + "/basic " + kGolden + "/edge --backend naive --json " + (dir_ / "v.json").string() +
               " --junit " + (dir_ / "v.xml").string());
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("PASS"), std::string::npos);
  EXPECT_NE(r.output.find("err/bound"), std::string::npos);
  auto doc = nlohmann::json::parse(std::ifstream(dir_ / "v.json"));
  // One golden row per fixture, and the relations' rows of their own beside them.
  std::size_t golden = 0, relations = 0;
  for (const auto& result : doc["results"]) {
    const std::string check = result["check"];
    golden += check == "golden";
    relations += check.rfind("relation ", 0) == 0;
  }
  EXPECT_EQ(golden, 6u);
  EXPECT_GE(relations, 6u);
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
  CliRun matrix = run_attn("verify " + wrong.string() + " --backend blocked --threads 1,8 --layout bhsd,bshd");
  EXPECT_EQ(matrix.code, 1) << matrix.output;
  EXPECT_NE(matrix.output.find(fs::absolute(wrong).string() + " --backend blocked --threads 8 --layout bshd"),
            std::string::npos) << matrix.output;
  EXPECT_NE(matrix.output.find("--threads 1 --layout bhsd"), std::string::npos) << matrix.output;
  EXPECT_NE(r.output.find("FAIL"), std::string::npos);
  EXPECT_NE(r.output.find("To reproduce"), std::string::npos);
  EXPECT_NE(r.output.find("verify " + wrong.string() + " --backend naive"), std::string::npos) << r.output;
  // Variables that shaped the run travel in the command, and a path with a
  // space is quoted: the printed line, pasted into a shell, fails the same way.
  const fs::path spaced = dir_ / "with space" / "wrong case.h5";
  fs::create_directories(spaced.parent_path());
  fs::copy_file(wrong, spaced);
  CliRun env = run_attn_env("ATTN_CPU_ISA=portable ATTN_MAX_WORK=1e12",
                            "verify '" + spaced.string() + "' -b blocked --threads 2 --quiet");
  EXPECT_EQ(env.code, 1) << env.output;
  const auto at = env.output.find("ATTN_CPU_ISA=portable ");
  ASSERT_NE(at, std::string::npos) << env.output;
  const std::string line = env.output.substr(at, env.output.find('\n', at) - at);
  EXPECT_NE(line.find("ATTN_MAX_WORK=1e12 "), std::string::npos) << line;
  EXPECT_NE(line.find("'" + spaced.string() + "' --backend blocked --threads 2"), std::string::npos) << line;
  const int again = std::system((line + " > /dev/null 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(again), 1) << "the reproduce command reproduces the failure: " << line;
  // A kernel set that does not exist is refused before anything runs.
  CliRun isa = run_attn_env("ATTN_CPU_ISA=sse9", "list");
  EXPECT_EQ(isa.code, 2) << isa.output;
  EXPECT_NE(isa.output.find("ATTN_CPU_ISA=sse9: expected amx, avx512_vbmi, avx512 or portable"), std::string::npos) << isa.output;
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
  EXPECT_NE(lists.output.find("streaming      basic/b1_h2_q4_k4_d8_f32"), std::string::npos) << lists.output;
  EXPECT_NE(lists.output.find("naive          edge/seq_k_0_f32"), std::string::npos) << lists.output;
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

// ---- Outputs written whole or not at all (core/output_file.hpp) ----------------

namespace {

CliRun run_shell(const std::string& script) {
  FILE* pipe = popen(("bash -c '" + script + "' 2>&1").c_str(), "r");
  std::string output;
  std::array<char, 4096> buffer;
  while (std::size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe)) output.append(buffer.data(), n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

int entries(const fs::path& dir) {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

}  // namespace

TEST_F(Cli, AFullDiskIsExit2AndLeavesNoHalfFile) {
  const std::string small = kGolden + "/basic/b1_h2_q4_k4_d8_f32.h5";
  // /dev/full: written in place (a device is not renamed over), and the failure is seen.
  CliRun full = run_attn("verify " + small + " --backend naive --json /dev/full");
  EXPECT_EQ(full.code, 2) << full.output;
  EXPECT_NE(full.output.find("/dev/full: cannot write"), std::string::npos) << full.output;
  // A file size limit makes the JSON's write fail part way: nothing under the name, no temporary left.
  const fs::path out = dir_ / "v.json";
  CliRun limited = run_shell("ulimit -f 1; trap \"\" XFSZ; exec " + std::string(ATTN_CLI) + " verify " + small + " " +
                             kGolden + "/mha --backend naive,blocked --json " + out.string());
  EXPECT_EQ(limited.code, 2) << limited.output;
  EXPECT_NE(limited.output.find("cannot write"), std::string::npos) << limited.output;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(entries(dir_), 0) << "a temporary was left behind";
}

TEST_F(Cli, AKilledRunLeavesNoOutputThatLooksCurrent) {
  const fs::path out = dir_ / "v.json", xml = dir_ / "v.xml";
  std::ofstream(out) << "{\"results\": []}\n";  // an earlier run's
  std::ofstream(xml) << "<testsuites/>\n";
  CliRun r = run_shell(std::string(ATTN_CLI) + " verify --threads 1,8 --json " + out.string() + " --junit " +
                       xml.string() + " > /dev/null & pid=$!; sleep 2; kill -9 $pid; wait $pid; echo killed");
  EXPECT_NE(r.output.find("killed"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out)) << "the earlier JSON still looks like this run's";
  EXPECT_FALSE(fs::exists(xml));
  EXPECT_EQ(entries(dir_), 0);
}

TEST_F(Cli, OutputsThatCollideWithEachOtherOrAnInputAreRefused) {
  const std::string small = kGolden + "/basic/b1_h2_q4_k4_d8_f32.h5";
  const std::string same = (dir_ / "x").string();
  CliRun twice = run_attn("verify " + small + " --backend naive --json " + same + " --junit " + same);
  EXPECT_EQ(twice.code, 2);
  EXPECT_NE(twice.output.find("named as two outputs"), std::string::npos) << twice.output;
  fs::copy_file(small, dir_ / "case.h5");
  CliRun input = run_attn("verify " + (dir_ / "case.h5").string() + " --backend naive --json " + (dir_ / "case.h5").string());
  EXPECT_EQ(input.code, 2);
  EXPECT_NE(input.output.find("is the input"), std::string::npos) << input.output;
  EXPECT_TRUE(fs::exists(dir_ / "case.h5"));
  CliRun inside = run_attn("verify " + dir_.string() + " --backend naive --junit " + (dir_ / "out.h5").string());
  EXPECT_EQ(inside.code, 2);
  EXPECT_NE(inside.output.find("would be read as a fixture"), std::string::npos) << inside.output;
}

TEST_F(Cli, GenerateRefusesAFolderInUseAndReplaceRemovesWhatTheSuiteNoLongerHas) {
  const fs::path stale = dir_ / "old" / "gone.h5";
  fs::create_directories(stale.parent_path());
  fs::copy_file(kGolden + "/basic/b1_h2_q4_k4_d8_f32.h5", stale);
  CliRun refused = run_attn("fixtures generate --out " + dir_.string());
  EXPECT_EQ(refused.code, 2);
  EXPECT_NE(refused.output.find("is not empty"), std::string::npos) << refused.output;
  EXPECT_TRUE(fs::exists(stale));
  CliRun some = run_attn("fixtures generate --out " + dir_.string() + " --replace --match basic/");
  EXPECT_EQ(some.code, 0) << some.output;
  EXPECT_TRUE(fs::exists(stale)) << "a filtered generate must not remove the rest";
  EXPECT_TRUE(fs::exists(dir_ / "basic" / "b1_h2_q4_k4_d8_f16.h5"));
  for (const auto& e : fs::recursive_directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  }
}

TEST_F(Cli, InvalidUtf8AndControlCharactersInANameKeepTheJsonAndTheJUnitWellFormed) {
  attn::Fixture f = attn::read_fixture(kGolden + "/basic/b1_h2_q4_k4_d8_f32.h5");
  f.header.name = "bad\xff\xfe name\x1b[31m";
  attn::write_fixture(f, dir_ / "bad.h5");
  const fs::path json = dir_ / "v.json", xml = dir_ / "v.xml";
  CliRun r = run_attn("verify " + (dir_ / "bad.h5").string() + " --backend naive --skip-check invariance,relations --json " +
                      json.string() + " --junit " + xml.string());
  EXPECT_EQ(r.code, 0) << r.output;
  std::ifstream in(json);
  nlohmann::json doc = nlohmann::json::parse(in);  // throws on a broken file
  EXPECT_EQ(doc["results"].size(), 1u);
  std::ifstream x(xml);
  std::string text((std::istreambuf_iterator<char>(x)), {});
  EXPECT_EQ(text.find('\xff'), std::string::npos);
  EXPECT_EQ(text.find('\x1b'), std::string::npos);
  EXPECT_NE(text.find("\\xff"), std::string::npos) << text;
}

TEST_F(Cli, VersionThreadLimitsAndQuiet) {
  CliRun v = run_attn("--version");
  EXPECT_EQ(v.code, 0);
  EXPECT_NE(v.output.find("attn (attnbench) "), std::string::npos) << v.output;
  EXPECT_NE(v.output.find("commit "), std::string::npos) << v.output;
  for (const char* bad : {"bench --threads 0", "bench --threads 1000", "peak --threads -1", "verify --threads 300",
                          "fuzz --cases 0"}) {
    CliRun r = run_attn(bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.output;
    EXPECT_LT(r.output.size(), 400u) << bad << " printed a wall of text";
  }
  CliRun q = run_attn("verify " + kGolden + "/basic --backend naive --quiet");
  EXPECT_EQ(q.code, 0) << q.output;
  EXPECT_EQ(q.output.find("max_abs"), std::string::npos) << "--quiet printed the table header:\n" << q.output;
}

TEST_F(Cli, AFolderScanReportsDanglingLinksAndFifosAndReadsHdf5Files) {
  fs::copy_file(kGolden + "/basic/b1_h2_q4_k4_d8_f32.h5", dir_ / "other_tool.hdf5");
  fs::create_symlink(dir_ / "missing.h5", dir_ / "dangling.h5");
  ASSERT_EQ(::mkfifo((dir_ / "pipe.h5").c_str(), 0600), 0);
  CliRun r = run_attn("verify " + dir_.string() + " --backend naive");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("dangling.h5: a link to nothing"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("pipe.h5: not a regular file"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("basic/b1_h2_q4_k4_d8_f32"), std::string::npos) << "the .hdf5 file was not verified\n" << r.output;
  CliRun folder = run_attn("fixtures show " + dir_.string());
  EXPECT_EQ(folder.code, 2);
  EXPECT_NE(folder.output.find("is a folder"), std::string::npos) << folder.output;
}

TEST_F(Cli, TagsMeanAnyOfTheListEverywhereAndAnUnknownOneListsTheKnown) {
  CliRun unknown = run_attn("fixtures list --tag nosuch");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_NE(unknown.output.find("the tags there are: "), std::string::npos) << unknown.output;
  EXPECT_NE(unknown.output.find("smoke"), std::string::npos) << unknown.output;
  CliRun both = run_attn("fixtures list -t smoke,edge " + kGolden);
  EXPECT_EQ(both.code, 0);
  EXPECT_NE(both.output.find("smoke"), std::string::npos);
  EXPECT_NE(both.output.find("edge"), std::string::npos);
  CliRun generated = run_attn("fixtures generate --out " + (dir_ / "g").string() + " -t edge --match seq_k_0");
  EXPECT_EQ(generated.code, 0) << generated.output;
}

TEST_F(Cli, AReportNeverReplacesAFolderOfOtherFiles) {
  std::ofstream(dir_ / "notes.txt") << "mine\n";
  const std::string results = std::string(ATTN_SOURCE_DIR) + "/reports/samples/bench_standard.json";
  CliRun r = run_attn("report " + results + " --out " + dir_.string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("holds notes.txt"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(dir_ / "notes.txt"));
  CliRun here = run_shell("cd " + dir_.string() + " && " + std::string(ATTN_CLI) + " report " + results + " --out .");
  EXPECT_EQ(here.code, 2) << here.output;
  EXPECT_TRUE(fs::exists(dir_ / "notes.txt"));
}

// The skip of a benchmark is decided once, before its repetitions: every
// repetition of a benchmark is skipped or none is, the run never aborts, and
// its JSON is whole. A filter that matches nothing is an error, not a green run.
TEST_F(Cli, BenchDecidesASkipOnceAndAFilterMatchingNothingIsAnError) {
  // Whatever the estimate says, it is said once: with a limit every estimate
  // is above, all repetitions are skipped; with one every estimate is under,
  // none is (no timing assumption: the limits are 1 ns and 1000 s).
  for (const char* limit : {"1e-9", "1000"}) {
    const fs::path out = dir_ / (std::string("b") + limit + ".json");
    CliRun r = run_attn(std::string("bench --preset quick -b blocked,streaming --no-peak '--benchmark_filter=dtype=f32,.*,sq=1024,' "
                                    "--benchmark_repetitions=3 --benchmark_min_time=0.01 --max-seconds ") +
                        limit + " --out " + out.string());
    ASSERT_EQ(r.code, 0) << r.output;
    auto doc = nlohmann::json::parse(std::ifstream(out));
    std::map<std::string, std::pair<int, int>> runs;  // run_name: repetitions, skipped
    for (const auto& b : doc["benchmarks"]) {
      if (b["run_type"] != "iteration") continue;
      auto& [count, skipped] = runs[b["run_name"].get<std::string>()];
      ++count;
      skipped += b.value("error_occurred", false) ? 1 : 0;
    }
    ASSERT_EQ(runs.size(), 2u) << r.output;
    const bool all = std::string(limit) == "1e-9";
    for (const auto& [name, counts] : runs) {
      EXPECT_EQ(counts.first, 3) << name;
      EXPECT_EQ(counts.second, all ? 3 : 0) << name << " with --max-seconds " << limit;
    }
  }
  CliRun none = run_attn("bench --preset quick -b naive --no-peak --benchmark_filter=nothing_is_called_this --out " +
                         (dir_ / "none.json").string());
  EXPECT_EQ(none.code, 2) << none.output;
  EXPECT_NE(none.output.find("matches the filter"), std::string::npos) << none.output;
  EXPECT_FALSE(fs::exists(dir_ / "none.json"));
}

// attn show and fixtures show on cases of every size and kind.
TEST_F(Cli, ShowBoundsLongTablesDrawsIntoNewFoldersAndShowsLayers) {
  const std::string long_case = kGolden + "/long/q16_k16384_hq4_hkv1_d16_f16.h5";
  CliRun table = run_attn("show " + long_case);
  EXPECT_EQ(table.code, 0) << table.output;
  EXPECT_LT(table.output.size(), 8000u) << "a 16384-key row is summarised, not printed whole";
  EXPECT_NE(table.output.find("k16383"), std::string::npos) << "the last key is shown";
  EXPECT_NE(table.output.find("--all prints every weight"), std::string::npos);
  EXPECT_EQ(table.output.find(" 0.000 "), std::string::npos) << "weights of 1/16384 do not read as zeros";
  CliRun all = run_attn("show " + long_case + " --all");
  EXPECT_EQ(all.code, 0);
  EXPECT_GT(all.output.size(), 16u * 16384u * 7u);
  const fs::path image = dir_ / "new" / "folder" / "h.png";
  CliRun heatmap = run_attn("show " + kGolden + "/basic/b1_h2_q4_k4_d8_f16.h5 --heatmap " + image.string());
  EXPECT_EQ(heatmap.code, 0) << heatmap.output;
  EXPECT_GT(fs::file_size(image), 1000u);
  CliRun bad = run_attn("show " + kGolden + "/basic/b1_h2_q4_k4_d8_f16.h5 --heatmap " + (dir_ / "h.txt").string());
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.output.find("written as .png, .svg or .pdf"), std::string::npos) << bad.output;
  EXPECT_EQ(bad.output.find("Traceback"), std::string::npos) << bad.output;
  CliRun layer = run_attn("fixtures show " + kGolden + "/layer/padding_b2_s10_f32.h5");
  EXPECT_EQ(layer.code, 0) << layer.output;
  EXPECT_NE(layer.output.find("w_o  [64, 64] + b_o"), std::string::npos) << layer.output;
  EXPECT_NE(layer.output.find("attention weights [0, 0] of the projected inputs"), std::string::npos);
  EXPECT_EQ(layer.output.find("read_layer_fixture"), std::string::npos) << "no internal names: " << layer.output;
  CliRun folder = run_attn("fixtures show " + kGolden + "/basic");
  EXPECT_EQ(folder.code, 2);
  EXPECT_NE(folder.output.find("is a folder, not a fixture file"), std::string::npos) << folder.output;
  EXPECT_EQ(run_attn("show " + kGolden + "/basic/b1_h2_q4_k4_d8_f16.h5 -b blocked --threads 999").code, 2);
}

// Four shards run side by side, merged: exactly the unsharded run (every
// result, with its verdict and its error). A shard chosen by GoogleTest's or
// Slurm's variables is the same shard. A missing, duplicated or foreign shard
// is exit 2 with the reason.
TEST_F(Cli, FourShardsMergeIntoTheUnshardedRun) {
  const std::string inputs = kGolden + "/basic " + kGolden + "/mha " + kGolden + "/layer " + kGolden + "/edge";
  const std::string common = " -b naive,blocked --threads 1,2 -q";
  CliRun whole = run_attn("verify " + inputs + common + " --json " + (dir_ / "whole.json").string());
  ASSERT_EQ(whole.code, 0) << whole.output;
  std::vector<std::string> shards;
  for (int k = 1; k <= 4; ++k) {
    const std::string out = (dir_ / ("s" + std::to_string(k) + ".json")).string();
    CliRun r = run_attn("verify " + inputs + common + " --shard " + std::to_string(k) + "/4 --json " + out);
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("shard " + std::to_string(k) + "/4 (--shard)"), std::string::npos) << r.output;
    shards.push_back(out);
  }
  const std::string all = shards[0] + " " + shards[1] + " " + shards[2] + " " + shards[3];
  CliRun merged = run_attn("merge " + all + " --json " + (dir_ / "merged.json").string() + " --junit " +
                           (dir_ / "merged.xml").string());
  ASSERT_EQ(merged.code, 0) << merged.output;
  auto results_of = [](const fs::path& path) {
    std::multiset<std::string> keys;
    const auto doc = nlohmann::json::parse(std::ifstream(path));  // alive for the loop
    for (const auto& r : doc["results"]) {
      keys.insert(r["backend"].dump() + r["fixture"].dump() + r["threads"].dump() + r["layout"].dump() +
                  r["verdict"].dump() + r["tensors"].dump());
    }
    return keys;
  };
  const auto expected = results_of(dir_ / "whole.json");
  EXPECT_GT(expected.size(), 100u);
  EXPECT_EQ(results_of(dir_ / "merged.json"), expected);
  std::size_t sum = 0;
  for (const auto& s : shards) sum += results_of(s).size();
  EXPECT_EQ(sum, expected.size()) << "no result in two shards";
  // The same shard from the variables CI systems set.
  CliRun gtest = run_attn_env("GTEST_SHARD_INDEX=2 GTEST_TOTAL_SHARDS=4",
                              "verify " + inputs + common + " --json " + (dir_ / "g3.json").string());
  EXPECT_EQ(gtest.code, 0) << gtest.output;
  EXPECT_EQ(results_of(dir_ / "g3.json"), results_of(shards[2]));
  CliRun slurm = run_attn_env("SLURM_ARRAY_TASK_ID=3 SLURM_ARRAY_TASK_MIN=1 SLURM_ARRAY_TASK_COUNT=4",
                              "verify " + inputs + common + " --json " + (dir_ / "l3.json").string());
  EXPECT_EQ(slurm.code, 0) << slurm.output;
  EXPECT_EQ(results_of(dir_ / "l3.json"), results_of(shards[2]));
  // A shard missing, one given twice, one of another suite.
  CliRun missing = run_attn("merge " + shards[0] + " " + shards[1] + " " + shards[3]);
  EXPECT_EQ(missing.code, 2) << missing.output;
  EXPECT_NE(missing.output.find("shard 3/4 is missing"), std::string::npos) << missing.output;
  CliRun twice = run_attn("merge " + all + " " + shards[1]);
  EXPECT_EQ(twice.code, 2) << twice.output;
  EXPECT_NE(twice.output.find("shard 2/4 is given 2 times"), std::string::npos) << twice.output;
  CliRun other = run_attn("verify " + kGolden + "/basic" + common + " --shard 3/4 --json " + (dir_ / "o3.json").string());
  ASSERT_EQ(other.code, 0) << other.output;
  const std::string foreign = shards[0] + " " + shards[1] + " " + (dir_ / "o3.json").string() + " " + shards[3];
  CliRun mixed = run_attn("merge " + foreign);
  EXPECT_EQ(mixed.code, 2) << mixed.output;
  EXPECT_NE(mixed.output.find("suite"), std::string::npos) << mixed.output;
  CliRun unsharded = run_attn("merge " + (dir_ / "whole.json").string());
  EXPECT_EQ(unsharded.code, 2) << unsharded.output;
  EXPECT_NE(unsharded.output.find("is not a shard"), std::string::npos) << unsharded.output;
}

// --memory-limit bounds what one case may take, from its declared sizes,
// before any work: beyond it the case is an input error naming the
// estimate (exit 2); a positive number only.
TEST_F(Cli, MemoryLimitRefusesACaseBeyondItBeforeWork) {
  const std::string file = kGolden + "/basic/b1_h2_q4_k4_d8_f32.h5";
  CliRun r = run_attn("verify " + file + " --backend naive --memory-limit 1e-9");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("the case needs about 0.00 GiB, more than the limit of 0.00 GiB"), std::string::npos) << r.output;
  EXPECT_EQ(run_attn("verify " + file + " --backend naive --memory-limit 1").code, 0);
  EXPECT_EQ(run_attn("verify " + file + " --backend naive --memory-limit 0").code, 2);
}
