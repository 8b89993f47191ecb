#include "verify/merge.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "attnbench/error.hpp"

namespace attn {

namespace {

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot read it", path.string()));
  nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
  if (doc.is_discarded()) throw InputError(fmt::format("{}: not JSON", path.string()));
  if (!doc.is_object() || !doc.contains("schema")) {
    throw InputError(fmt::format("{}: not attn verify --json output (no \"schema\")", path.string()));
  }
  if (doc.value("schema", "") != kVerifySchema) {
    // Shards come from one attn: an older one wrote another schema (attn-verify-1 had no per-tensor scores).
    throw InputError(fmt::format("{}: schema \"{}\", not \"{}\": written by another attn version; verify every shard "
                                 "with this one", path.string(), doc["schema"].is_string() ? doc["schema"].get<std::string>() : "?",
                                 kVerifySchema));
  }
  for (const char* key : {"tool", "host", "run", "results", "input_errors", "warnings"}) {
    if (!doc.contains(key)) throw InputError(fmt::format("{}: has no \"{}\"", path.string(), key));
  }
  if (!doc["run"].contains("shard") || !doc["run"]["shard"].is_object()) {
    throw InputError(fmt::format("{}: is not a shard (run attn verify with --shard K/N, or under "
                                 "GTEST_SHARD_INDEX/GTEST_TOTAL_SHARDS or a Slurm array)",
                                 path.string()));
  }
  return doc;
}

Verdict verdict_of(const std::string& name, const std::filesystem::path& path) {
  for (Verdict v : {Verdict::pass, Verdict::fail, Verdict::skip, Verdict::mistrusted, Verdict::differs}) {
    if (verdict_name(v) == name) return v;
  }
  throw InputError(fmt::format("{}: a result has verdict '{}'", path.string(), name));
}

// What the table, the budget and the JUnit writer read of an outcome.
CaseOutcome outcome_of(const nlohmann::json& r, const std::filesystem::path& path, bool layout_given) {
  CaseOutcome o;
  o.backend = r.value("backend", "");
  o.file = r.value("file", "");
  o.fixture = r.value("fixture", "");
  o.problem = r.value("problem", "");
  o.comparison.verdict = verdict_of(r.value("verdict", ""), path);
  o.comparison.reason = r.value("reason", "");
  o.seconds = r.value("seconds", 0.0);
  o.warning = r.value("warning", "");
  if (const auto q = r.find("quantisation_error"); q != r.end() && q->is_object()) {
    o.quantisation = QuantisationError{q->value("max", 0.0), q->value("relative", 0.0)};
  }
  o.config.threads = r.value("threads", 0);
  const std::string layout = r.value("layout", "bhsd");
  if (layout_given || layout != "bhsd") o.config.layout = layout == "bshd" ? Layout::bshd : Layout::bhsd;
  o.direction = r.value("direction", "forward") == "backward" ? Direction::backward : Direction::forward;
  if (const std::string check = r.value("check", "golden"); check != "golden") o.check = check;
  if (const auto it = r.find("tensors"); it != r.end() && it->is_array()) {
    for (const auto& t : *it) o.comparison.tensors.push_back(tensor_from_json(t));
  }
  o.comparison.compared = !o.comparison.tensors.empty();
  return o;
}

std::string options_of(const nlohmann::json& doc) {
  return nlohmann::json{{"threads", doc["run"].value("threads", nlohmann::json())},
                        {"layouts", doc["run"].value("layouts", nlohmann::json())},
                        {"backends", doc["run"].value("backends", nlohmann::json())}}
      .dump();
}

}  // namespace

Merged merge_shards(const std::vector<std::filesystem::path>& files, const MergeOptions& options) {
  if (files.empty()) throw InputError("attn merge: give the verify --json files of the shards");
  struct Part {
    std::filesystem::path path;
    nlohmann::json doc;
  };
  std::vector<Part> parts;
  for (const auto& f : files) parts.push_back({f, read_json(f)});

  Merged merged;
  auto problem = [&](std::string text) { merged.problems.push_back(std::move(text)); };
  const nlohmann::json& first = parts.front().doc;
  // The same commit, suite and options everywhere, unless told otherwise.
  for (const Part& p : parts) {
    const auto& shard = p.doc["run"]["shard"];
    auto differs = [&](const std::string& what, const std::string& a, const std::string& b) {
      if (a != b && !options.allow_mixed) {
        problem(fmt::format("{}: {} {} differs from {}'s {} (--allow-mixed merges them anyway)", p.path.string(), what, a,
                            parts.front().path.string(), b));
      }
    };
    differs("commit", p.doc["tool"].value("commit", ""), first["tool"].value("commit", ""));
    differs("suite", shard.value("suite", ""), first["run"]["shard"].value("suite", ""));
    differs("options", options_of(p.doc), options_of(first));
  }
  // Per host, the shards must be 1..N, each once.
  std::map<std::pair<std::string, int>, std::map<int, std::vector<std::string>>> seen;
  for (const Part& p : parts) {
    const auto& shard = p.doc["run"]["shard"];
    seen[{p.doc["host"].value("hostname", ""), shard.value("count", 0)}][shard.value("index", 0)].push_back(p.path.string());
  }
  std::set<std::string> hosts;
  for (const auto& [group, indexes] : seen) {
    const auto& [host, count] = group;
    hosts.insert(host);
    for (int k = 1; k <= count; ++k) {
      const auto it = indexes.find(k);
      if (it == indexes.end()) {
        problem(fmt::format("host {}: shard {}/{} is missing: its units were not verified", host, k, count));
      } else if (it->second.size() > 1) {
        problem(fmt::format("host {}: shard {}/{} is given {} times ({})", host, k, count, it->second.size(),
                            fmt::join(it->second, ", ")));
      }
    }
    for (const auto& [k, where] : indexes) {
      if (k < 1 || k > count) problem(fmt::format("host {}: shard {}/{} cannot exist ({})", host, k, count, where.front()));
    }
  }

  // Results, in the order given; input errors and warnings once each.
  nlohmann::json results = nlohmann::json::array();
  std::vector<InputErrorRecord> input_errors;
  std::vector<std::string> warnings;
  auto add_once = [](auto& to, const auto& item) {
    if (std::find(to.begin(), to.end(), item) == to.end()) to.push_back(item);
  };
  nlohmann::json shards = nlohmann::json::array();
  for (const Part& p : parts) {
    const auto& run = p.doc["run"];
    const bool layout_given = run.contains("layouts") && run["layouts"].size() > 1;
    for (nlohmann::json r : p.doc["results"]) {
      merged.summary.outcomes.push_back(outcome_of(r, p.path, layout_given));
      if (hosts.size() > 1) r["host"] = p.doc["host"].value("hostname", "");
      results.push_back(std::move(r));
    }
    for (const auto& e : p.doc["input_errors"]) {
      if (!e.is_object()) throw InputError(fmt::format("{}: an input error is not {{\"file\", \"message\"}}", p.path.string()));
      add_once(input_errors, InputErrorRecord{e.value("file", ""), e.value("message", "")});
    }
    for (const auto& w : p.doc["warnings"]) add_once(warnings, w.get<std::string>());
    shards.push_back({{"file", p.path.string()},
                      {"hostname", p.doc["host"].value("hostname", "")},
                      {"index", run["shard"].value("index", 0)},
                      {"count", run["shard"].value("count", 0)},
                      {"units_run", run["shard"].value("units_run", 0)}});
  }
  for (const auto& text : merged.problems) add_once(input_errors, InputErrorRecord{"", text});
  merged.summary.input_errors = input_errors;
  merged.summary.warnings = warnings;

  merged.doc = first;
  merged.doc["results"] = results;
  merged.doc["input_errors"] = input_errors_json(input_errors);
  merged.doc["warnings"] = warnings;
  merged.doc["summary"] = summary_json(merged.summary);
  merged.doc["budget"] = budget_json(merged.summary);
  merged.doc["run"]["shard"] = nullptr;
  merged.doc["run"]["merged"] = {{"shards", shards}, {"hosts", std::vector<std::string>(hosts.begin(), hosts.end())}};

  RunInfo& info = merged.run;
  info.version = first["tool"].value("version", "");
  info.commit = first["tool"].value("commit", "");
  info.hostname = hosts.size() == 1 ? *hosts.begin() : fmt::format("{} hosts", hosts.size());
  info.cpu = first["host"].value("cpu", "");
  info.kernels = first["host"].value("kernels", "");
  info.started = first["run"].value("started", "");
  for (const auto& t : first["run"].value("threads", nlohmann::json::array())) info.threads.push_back(t.get<int>());
  for (const auto& l : first["run"].value("layouts", nlohmann::json::array())) info.layouts.push_back(l.get<std::string>());
  const nlohmann::json backends = first["run"].value("backends", nlohmann::json::object());  // kept alive for items()
  for (const auto& [name, description] : backends.items()) {
    info.backends.emplace_back(name, description.is_string() ? description.get<std::string>() : std::string());
  }
  return merged;
}

}  // namespace attn
