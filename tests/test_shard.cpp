// Shards that any CI matrix or Slurm array can run: the split is exact (every
// unit in exactly one shard), the same whatever order the units come in (so
// every machine computes the same split), balanced, and the shard asked for is
// read from the flag, then GoogleTest's, then Slurm's variables.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>

#include "attnbench/error.hpp"
#include "core/shard.hpp"
#include "fixtures/suite.hpp"

using namespace attn;

namespace {

// The standard suite's (fixture, backend) units, with costs spread as the
// real ones are (decades apart).
std::vector<ShardUnit> suite_units() {
  std::vector<ShardUnit> units;
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> decades(0.0, 5.0);
  for (const CaseSpec& spec : standard_suite()) {
    for (const char* backend : {"naive", "blocked", "streaming", "openblas", "onednn", "cuda-flash"}) {
      units.push_back({std::string(backend) + "|" + spec.name + "|" + spec.problem, std::pow(10.0, decades(gen))});
    }
  }
  return units;
}

struct Env {
  explicit Env(std::vector<std::pair<const char*, const char*>> vars) : vars_(std::move(vars)) {
    for (const char* name : {"GTEST_SHARD_INDEX", "GTEST_TOTAL_SHARDS", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN",
                             "SLURM_ARRAY_TASK_COUNT"}) {
      ::unsetenv(name);
    }
    for (const auto& [name, value] : vars_) ::setenv(name, value, 1);
  }
  ~Env() {
    for (const auto& [name, value] : vars_) ::unsetenv(name);
  }
  std::vector<std::pair<const char*, const char*>> vars_;
};

}  // namespace

TEST(Shards, EveryUnitIsInExactlyOneShardAndTheSplitIgnoresOrderForNOneToSeven) {
  const std::vector<ShardUnit> units = suite_units();
  ASSERT_GT(units.size(), 1000u);
  double total = 0, largest = 0;
  for (const auto& u : units) total += u.cost, largest = std::max(largest, u.cost);
  for (int n = 1; n <= 7; ++n) {
    const std::vector<int> owner = assign_shards(units, n);
    ASSERT_EQ(owner.size(), units.size());
    std::vector<double> load(static_cast<std::size_t>(n), 0.0);
    std::map<std::string, int> by_key;
    for (std::size_t u = 0; u < units.size(); ++u) {
      ASSERT_GE(owner[u], 1);
      ASSERT_LE(owner[u], n);
      load[static_cast<std::size_t>(owner[u] - 1)] += units[u].cost;
      by_key[units[u].key] = owner[u];
    }
    // The union of the shards is every unit once: the per-shard lists partition them.
    std::size_t counted = 0;
    for (int k = 1; k <= n; ++k) counted += static_cast<std::size_t>(std::count(owner.begin(), owner.end(), k));
    EXPECT_EQ(counted, units.size());
    EXPECT_EQ(by_key.size(), units.size()) << "keys are distinct";
    // Balanced: greedy largest-first leaves no shard above the mean by more than one unit.
    for (double l : load) EXPECT_LE(l, total / n + largest) << "n = " << n;
    // Another machine lists the units in another order: the same split.
    std::vector<ShardUnit> shuffled = units;
    std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(static_cast<unsigned>(n)));
    const std::vector<int> again = assign_shards(shuffled, n);
    for (std::size_t u = 0; u < shuffled.size(); ++u) {
      EXPECT_EQ(again[u], by_key[shuffled[u].key]) << shuffled[u].key << ", n = " << n;
    }
    EXPECT_EQ(suite_fingerprint([&] {
                std::vector<std::string> k;
                for (const auto& x : shuffled) k.push_back(x.key);
                return k;
              }()),
              suite_fingerprint([&] {
                std::vector<std::string> k;
                for (const auto& x : units) k.push_back(x.key);
                return k;
              }()));
  }
  EXPECT_NE(suite_fingerprint({"a", "b"}), suite_fingerprint({"a", "c"}));
}

TEST(Shards, TheShardComesFromTheFlagThenGoogleTestThenSlurm) {
  {
    Env env({});
    EXPECT_FALSE(shard_from(""));
    EXPECT_EQ(parse_shard("2/4").index, 2);
    EXPECT_EQ(parse_shard("2/4").count, 4);
    for (const char* bad : {"0/4", "5/4", "2", "2/0", "-1/3", "a/b", "1/4/2", ""}) {
      EXPECT_THROW(parse_shard(bad), InputError) << bad;
    }
  }
  {
    Env env({{"GTEST_SHARD_INDEX", "2"}, {"GTEST_TOTAL_SHARDS", "5"}, {"SLURM_ARRAY_TASK_ID", "0"},
             {"SLURM_ARRAY_TASK_COUNT", "2"}});
    std::string source;
    const auto s = shard_from("", &source);
    ASSERT_TRUE(s);
    EXPECT_EQ(s->text(), "3/5") << "GoogleTest's index is 0-based, and wins over Slurm's";
    EXPECT_EQ(source, "GTEST_SHARD_INDEX/GTEST_TOTAL_SHARDS");
    EXPECT_EQ(shard_from("1/2", &source)->text(), "1/2") << "the flag wins over both";
    EXPECT_EQ(source, "--shard");
  }
  {
    Env env({{"SLURM_ARRAY_TASK_ID", "7"}, {"SLURM_ARRAY_TASK_MIN", "5"}, {"SLURM_ARRAY_TASK_COUNT", "4"}});
    EXPECT_EQ(shard_from("")->text(), "3/4") << "sbatch --array=5-8: task 7 is the third";
  }
  {
    Env env({{"SLURM_ARRAY_TASK_ID", "9"}, {"SLURM_ARRAY_TASK_MIN", "5"}, {"SLURM_ARRAY_TASK_COUNT", "4"}});
    EXPECT_THROW(shard_from(""), InputError) << "not a contiguous array";
  }
  {
    Env env({{"GTEST_SHARD_INDEX", "5"}, {"GTEST_TOTAL_SHARDS", "5"}});
    EXPECT_THROW(shard_from(""), InputError);
  }
}
