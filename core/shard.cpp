#include "core/shard.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "attnbench/error.hpp"

namespace attn {

std::string Shard::text() const { return fmt::format("{}/{}", index, count); }

namespace {

bool parse_int(const std::string& text, long long& value) {
  if (text.empty() || text.size() > 9) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  value = std::stoll(text);
  return true;
}

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (!value) return std::nullopt;
  return std::string(value);
}

}  // namespace

Shard parse_shard(const std::string& text) {
  const auto slash = text.find('/');
  long long k = 0, n = 0;
  if (slash == std::string::npos || !parse_int(text.substr(0, slash), k) || !parse_int(text.substr(slash + 1), n) ||
      n < 1 || n > 10000 || k < 1 || k > n) {
    throw InputError(fmt::format("--shard {}: expected K/N with 1 <= K <= N <= 10000 (K is 1-based), e.g. 2/4", text));
  }
  return {static_cast<int>(k), static_cast<int>(n)};
}

std::optional<Shard> shard_from(const std::string& flag, std::string* source) {
  auto said = [&](const char* where) {
    if (source) *source = where;
  };
  if (!flag.empty()) {
    said("--shard");
    return parse_shard(flag);
  }
  const auto g_index = env("GTEST_SHARD_INDEX"), g_total = env("GTEST_TOTAL_SHARDS");
  if (g_index || g_total) {
    long long index = 0, total = 0;
    if (!g_index || !g_total || !parse_int(*g_index, index) || !parse_int(*g_total, total) || total < 1 ||
        index >= total) {
      throw InputError(fmt::format("GTEST_SHARD_INDEX={} GTEST_TOTAL_SHARDS={}: expected 0 <= index < total",
                                   g_index.value_or("(unset)"), g_total.value_or("(unset)")));
    }
    said("GTEST_SHARD_INDEX/GTEST_TOTAL_SHARDS");
    return Shard{static_cast<int>(index) + 1, static_cast<int>(total)};
  }
  const auto s_id = env("SLURM_ARRAY_TASK_ID"), s_count = env("SLURM_ARRAY_TASK_COUNT");
  if (s_id || s_count) {
    const auto s_min = env("SLURM_ARRAY_TASK_MIN");
    long long id = 0, count = 0, first = 0;
    if (!s_id || !s_count || !parse_int(*s_id, id) || !parse_int(*s_count, count) ||
        (s_min && !parse_int(*s_min, first)) || count < 1 || id < first || id - first >= count) {
      throw InputError(fmt::format(
          "SLURM_ARRAY_TASK_ID={} SLURM_ARRAY_TASK_MIN={} SLURM_ARRAY_TASK_COUNT={}: expected a contiguous array "
          "(MIN <= ID < MIN + COUNT); for other arrays give --shard K/N",
          s_id.value_or("(unset)"), s_min.value_or("0"), s_count.value_or("(unset)")));
    }
    said("SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT");
    return Shard{static_cast<int>(id - first) + 1, static_cast<int>(count)};
  }
  return std::nullopt;
}

std::vector<int> assign_shards(const std::vector<ShardUnit>& units, int count) {
  std::vector<std::size_t> order(units.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    if (units[a].cost != units[b].cost) return units[a].cost > units[b].cost;
    return units[a].key < units[b].key;
  });
  std::vector<double> load(static_cast<std::size_t>(std::max(count, 1)), 0.0);
  std::vector<int> shard(units.size(), 1);
  for (std::size_t u : order) {
    const auto least = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[least] += units[u].cost;
    shard[u] = static_cast<int>(least) + 1;
  }
  return shard;
}

std::string suite_fingerprint(std::vector<std::string> keys) {
  std::sort(keys.begin(), keys.end());
  // FNV-1a over the sorted keys: the same set gives the same text everywhere.
  std::uint64_t hash = 1469598103934665603ull;
  for (const auto& key : keys) {
    for (unsigned char c : key + '\n') {
      hash ^= c;
      hash *= 1099511628211ull;
    }
  }
  return fmt::format("{:016x}:{}", hash, keys.size());
}

}  // namespace attn
