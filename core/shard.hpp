// Splitting a run into shards that a CI job matrix or a Slurm job array runs
// side by side: deterministic (a pure function of the units' keys and costs,
// whatever order they come in and whatever machine computes it), balanced by
// estimated cost, and exact (every unit in exactly one shard, so the union of
// the shards is the unsharded run). attnbench schedules nothing itself.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace attn {

struct Shard {
  int index = 1;  // 1-based
  int count = 1;
  std::string text() const;  // "2/4"
};

// "K/N" with 1 <= K <= N <= 10000; InputError otherwise.
Shard parse_shard(const std::string& text);

// The shard asked for: `flag` when given ("K/N"), else GoogleTest's
// GTEST_SHARD_INDEX (0-based) and GTEST_TOTAL_SHARDS, else Slurm's
// SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_MIN (default 0) and
// SLURM_ARRAY_TASK_COUNT; nullopt when none is set. `source` says which.
std::optional<Shard> shard_from(const std::string& flag, std::string* source = nullptr);

struct ShardUnit {
  std::string key;  // stable across machines, e.g. "naive|basic/b1_h2...|dtype=f32,..."
  double cost = 1;  // estimated seconds or work, > 0
};

// The shard (1-based) of every unit, in the units' order: the units sorted by
// cost (largest first, then by key), each given to the least loaded shard
// (the lowest index on ties). Keys must be distinct.
std::vector<int> assign_shards(const std::vector<ShardUnit>& units, int count);

// A short fingerprint of the whole set of keys (order-independent): shards of
// one run share it, so a merge can tell shards of different suites apart.
std::string suite_fingerprint(std::vector<std::string> keys);

}  // namespace attn
