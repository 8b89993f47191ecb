// attn merge: the verify JSON of many shards (and hosts) combined into one
// verdict. Shards of one host must form a whole run: indexes 1..N, each once,
// of one suite, commit and set of options; anything else is reported (and,
// for suites, commits and options, refused unless allow_mixed).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "verify/report.hpp"
#include "verify/verifier.hpp"

namespace attn {

struct MergeOptions {
  bool allow_mixed = false;  // shards of different suites, commits or options
};

struct Merged {
  nlohmann::json doc;     // the merged verify JSON (schemas/verify.schema.json)
  VerifySummary summary;  // the outcomes as the JUnit writer and the table need them
  RunInfo run;            // of the first file, for the JUnit properties
  // Problems of the set of shards (a missing or duplicated shard, mixed
  // suites): also in summary.input_errors, so the exit code is 2.
  std::vector<std::string> problems;
};

// InputError for a file that is not readable verify JSON of a shard.
Merged merge_shards(const std::vector<std::filesystem::path>& files, const MergeOptions& options);

}  // namespace attn
