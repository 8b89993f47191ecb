// How verification results are shown: a fmt table on the terminal, JSON for
// reports and JUnit XML for CI systems.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "verify/verifier.hpp"

namespace attn {

void print_outcome_header(std::FILE* out);
void print_outcome(std::FILE* out, const CaseOutcome& outcome);
// Totals per backend and, for every failure, the command that reproduces it.
void print_summary(std::FILE* out, const VerifySummary& summary, const std::string& attn_command);

// How much of each limit the backends use, per backend and dtype: the
// distribution (min, median, p99, max) of err/bound and err/baseline over
// the cases that ran.
struct Distribution {
  double min = 0, median = 0, p99 = 0, max = 0;
  std::int64_t count = 0;
};
struct BudgetUse {
  std::string backend;
  std::string dtype;
  Direction direction = Direction::forward;
  Distribution over_bound, over_baseline;  // over every tensor scored in that direction
};
std::vector<BudgetUse> budget_use(const VerifySummary& summary);

// What the JSON says about the run itself (schemas/verify.schema.json).
struct RunInfo {
  std::string version, commit;  // of attn
  std::string hostname, cpu;    // where it ran (cpu: the model name)
  std::string kernels;          // the CPU kernel set the fast backends use
  std::string started;          // UTC, ISO 8601 ("2026-12-01T16:40:00")
  std::vector<int> threads;     // the thread counts asked for (0: the backend's default)
  std::vector<std::string> layouts;
  std::vector<std::pair<std::string, std::string>> backends;  // name, description
  std::string shard_source;  // sharded runs: what chose the shard (--shard, GTEST_*, SLURM_*)
};
RunInfo this_run(std::string version, std::string commit);  // fills hostname and cpu
// What a verify run was asked: the CPU kernel set, thread counts and layouts
// (the defaults written out), and each backend with its description.
void describe_run(RunInfo& run, const VerifyOptions& options, const std::vector<std::unique_ptr<Backend>>& backends);

// One tensor's score as a result's "tensors" entry (schemas/verify.schema.json),
// and back (attn merge reads the shards' results).
nlohmann::json tensor_json(const TensorScore& score);
TensorScore tensor_from_json(const nlohmann::json& entry);
// The "input_errors" part: [{"file": ..., "message": ...}].
nlohmann::json input_errors_json(const std::vector<InputErrorRecord>& errors);

// The "summary" and "budget" parts of the verify JSON (also for attn merge).
nlohmann::json summary_json(const VerifySummary& summary);
nlohmann::json budget_json(const VerifySummary& summary);

// Follows schemas/verify.schema.json ("schema": kVerifySchema): the text,
// and the file written whole.
inline constexpr const char* kVerifySchema = "attn-verify-2";
std::string verify_json(const VerifySummary& summary, const RunInfo& run = {});
void write_json(const VerifySummary& summary, const std::filesystem::path& path, const RunInfo& run = {});
// `attn_command` (the attn binary) goes into each failure's reproduce command.
// Follows schemas/junit.xsd.
void write_junit(const VerifySummary& summary, const std::filesystem::path& path,
                 const std::string& attn_command = "attn", const RunInfo& run = {});
// The command that reruns one outcome alone: absolute fixture path, backend,
// threads, layout and ATTN_CPU_ISA when set.
std::string reproduce_command(const CaseOutcome& outcome, const std::string& attn_command);

}  // namespace attn
