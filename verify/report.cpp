#include "verify/report.hpp"

#include "core/cpu.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <map>
#include <nlohmann/json.hpp>

#include "attnbench/error.hpp"
#include "core/output_file.hpp"
#include "core/registry.hpp"
#include "core/text.hpp"

namespace attn {

namespace {

// A ratio to a limit: three decimals, or three digits and an exponent where
// it is far past any limit (a bound near 0 gives ratios of 1e300).
std::string ratio_text(double ratio) {
  if (std::isinf(ratio)) return "inf";
  if (std::fabs(ratio) >= 1e6) return fmt::format("{:.3g}", ratio);
  return fmt::format("{:.3f}", ratio);
}

std::string xml_escape(std::string_view raw) {
  std::string out;
  const std::string text = valid_utf8(raw);
  for (char ch : text) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\n':
      case '\t': out += ch; break;
      default:
        // XML 1.0 has no other control characters, not even escaped.
        if (static_cast<unsigned char>(ch) < 0x20) out += fmt::format("\\x{:02x}", static_cast<unsigned char>(ch));
        else out += ch;
    }
  }
  return out;
}


Distribution distribution_of(std::vector<double> values) {
  Distribution d;
  d.count = static_cast<std::int64_t>(values.size());
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  auto at = [&](double q) { return values[static_cast<std::size_t>(std::ceil(q * static_cast<double>(values.size() - 1)))]; };
  d.min = values.front();
  d.median = at(0.5);
  d.p99 = at(0.99);
  d.max = values.back();
  return d;
}

std::string dtype_of(const std::string& problem) {
  const auto comma = problem.find(',');
  const std::string first = problem.substr(0, comma);
  return first.rfind("dtype=", 0) == 0 ? first.substr(6) : first;
}

// The fixture's name, with the run's threads and layout when not the defaults.
std::string fixture_label(const CaseOutcome& o) {
  const std::string config = o.config.label();
  std::string name = o.direction == Direction::backward ? o.fixture + " backward" : o.fixture;
  if (!o.check.empty()) name += fmt::format(" [{}]", o.check);
  return config.empty() ? name : fmt::format("{} @{}", name, config);
}

}  // namespace

std::string reproduce_command(const CaseOutcome& o, const std::string& attn_command) {
  // Every variable that shaped the run: the kernel set, the threads a backend
  // takes by default, OpenBLAS's kernels, the reader's limits.
  std::string environment;
  for (const char* name : {"ATTN_CPU_ISA", "OMP_NUM_THREADS", "OPENBLAS_CORETYPE", "ATTN_MAX_WORK", "ATTN_MAX_CASE_GIB",
                           "ATTN_READ_SECONDS", "ATTN_READ_MEMORY_GIB"}) {
    if (const char* value = std::getenv(name)) environment += fmt::format("{}={} ", name, shell_quote(value));
  }
  std::error_code ec;
  const std::filesystem::path file = std::filesystem::absolute(o.file, ec);
  return fmt::format("{}{} verify {} --backend {}{}{}{}", environment, attn_command,
                     shell_quote((ec ? o.file : file).string()), shell_quote(o.backend), o.config.arguments(),
                     o.arguments, plugin_arguments(o.backend));
}

std::vector<BudgetUse> budget_use(const VerifySummary& summary) {
  std::map<std::tuple<std::string, std::string, Direction>, std::pair<std::vector<double>, std::vector<double>>> values;
  for (const auto& o : summary.outcomes) {
    for (const TensorScore& t : o.comparison.tensors) {
      auto& v = values[{o.backend, dtype_of(o.problem), o.direction}];
      if (t.elements > 0 && std::isfinite(t.worst_ratio)) v.first.push_back(t.worst_ratio);
      if (t.measured && std::isfinite(t.measured->budget)) v.second.push_back(t.measured->budget);
    }
  }
  std::vector<BudgetUse> rows;
  for (auto& [key, v] : values) {
    const auto& [backend, dtype, direction] = key;
    rows.push_back({backend, dtype, direction, distribution_of(std::move(v.first)), distribution_of(std::move(v.second))});
  }
  return rows;
}

void print_outcome_header(std::FILE* out) {
  fmt::print(out, "{:<14} {:<44} {:>10} {:>10} {:>10} {:>9} {:>8} {:<22} {}\n", "backend", "fixture", "max_abs", "max_rel",
             "bound", "err/bound", "err/base", "worst tensor[b,h,i,d]", "verdict");
}

void print_outcome(std::FILE* out, const CaseOutcome& o) {
  const Comparison& c = o.comparison;
  std::string verdict(verdict_name(c.verdict));
  if (!c.reason.empty()) verdict += fmt::format(" ({})", c.reason);
  if (!o.warning.empty() && c.verdict != Verdict::skip) verdict += fmt::format(" [{}]", o.warning);
  if (o.quantisation && c.verdict != Verdict::skip) verdict += fmt::format(" [{}]", o.quantisation->text());
  const TensorScore* w = c.worst();
  if (!w) {  // skipped, or the backend threw: nothing was measured, and no column may read as a result
    fmt::print(out, "{:<14} {:<44} {:>10} {:>10} {:>10} {:>9} {:>8} {:<22} {}\n", printable(o.backend),
               printable(fixture_label(o)), "-", "-", "-", "-", "-", "-", printable(verdict));
    return;
  }
  // Every figure of the row is the worst tensor's, which the worst column names.
  const std::string worst = fmt::format("{}[{}]", w->name, fmt::join(w->worst_at, ","));
  const std::string base = w->measured ? fmt::format("{:.2f}", w->measured->budget) : "-";
  // A NaN or infinite value has no error to print: say which it holds.
  const std::string max_abs = w->nan_elements > 0 ? "NaN" : w->infinite_elements > 0 ? "inf" : fmt::format("{:.3g}", w->max_abs_error);
  const std::string max_rel = w->nan_elements + w->infinite_elements > 0 ? "-" : fmt::format("{:.3g}", w->max_rel_error);
  fmt::print(out, "{:<14} {:<44} {:>10} {:>10} {:>10.3g} {:>9} {:>8} {:<22} {}\n", printable(o.backend),
             printable(fixture_label(o)), max_abs, max_rel, w->bound_at_worst, ratio_text(w->worst_ratio), base, worst,
             printable(verdict));
}

void print_summary(std::FILE* out, const VerifySummary& summary, const std::string& attn_command) {
  struct Counts {
    int pass = 0, fail = 0, skip = 0, mistrusted = 0, differs = 0;
    double worst = 0;
  };
  std::map<std::string, Counts> per_backend;
  for (const auto& o : summary.outcomes) {
    Counts& c = per_backend[o.backend];
    switch (o.comparison.verdict) {
      case Verdict::pass: ++c.pass; break;
      case Verdict::fail: ++c.fail; break;
      case Verdict::skip: ++c.skip; break;
      case Verdict::mistrusted: ++c.mistrusted; break;
      case Verdict::differs: ++c.differs; break;
    }
    if (const TensorScore* w = o.comparison.worst(); w && std::isfinite(w->worst_ratio)) {
      c.worst = std::max(c.worst, w->worst_ratio);
    }
  }
  // The backend column fits the longest name, so that the columns stay aligned.
  std::size_t w = 14;
  for (const auto& entry : per_backend) w = std::max(w, printable(entry.first).size());
  fmt::print(out, "\n{:<{}} {:>6} {:>6} {:>6} {:>11} {:>8} {:>16}\n", "backend", w, "PASS", "FAIL", "SKIP", "MISTRUSTED",
             "DIFFERS", "worst err/bound");
  for (const auto& [name, c] : per_backend) {
    fmt::print(out, "{:<{}} {:>6} {:>6} {:>6} {:>11} {:>8} {:>16}\n", printable(name), w, c.pass, c.fail, c.skip,
               c.mistrusted, c.differs, ratio_text(c.worst));
  }
  const std::vector<BudgetUse> budget = budget_use(summary);
  if (!budget.empty()) {
    fmt::print(out, "\nBudget use per backend, dtype and direction (min / median / p99 / max over every tensor scored):\n");
    fmt::print(out, "{:<{}} {:<5} {:<8} {:>7}  {:<29}  {:<29}\n", "backend", w, "dtype", "dir", "tensors",
               "err/bound (limit 1)",
               fmt::format("err/baseline (limit {}/{})", ToleranceConstants::baseline_factor_16bit,
                                                              ToleranceConstants::baseline_factor_wide));
    auto text = [](const Distribution& d) {
      return d.count == 0 ? std::string("-")
                          : fmt::format("{} {} {} {}", ratio_text(d.min), ratio_text(d.median), ratio_text(d.p99),
                                        ratio_text(d.max));
    };
    for (const auto& b : budget) {
      fmt::print(out, "{:<{}} {:<5} {:<8} {:>7}  {:<29}  {:<29}\n", printable(b.backend), w, b.dtype,
                 direction_name(b.direction), b.over_bound.count, text(b.over_bound), text(b.over_baseline));
    }
  }
  for (const auto& warning : summary.warnings) fmt::print(out, "warning: {}\n", printable(warning));
  for (const auto& error : summary.input_errors) fmt::print(out, "input error: {}\n", printable(error.message));
  bool header = false;
  for (const auto& o : summary.outcomes) {
    if (o.comparison.verdict != Verdict::fail) continue;
    if (!header) fmt::print(out, "\nTo reproduce a failure:\n");
    header = true;
    fmt::print(out, "  {}\n", reproduce_command(o, attn_command));
  }
}

RunInfo this_run(std::string version, std::string commit) {
  RunInfo info;
  info.version = std::move(version);
  info.commit = std::move(commit);
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char stamp[32] = {};
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &utc);
  info.started = stamp;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) info.hostname = host;
  info.cpu = cpu_model_name();
  return info;
}

namespace {

// A figure that is not a finite number is written as null.
nlohmann::json finite_or_null(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

nlohmann::json bias_json(const BiasTest& b) {
  auto side = [](const SignStatistic& s) {
    return nlohmann::json{{"rows", s.rows}, {"mean", s.mean}, {"t", finite_or_null(s.t)}};
  };
  return {{"toward_zero", side(b.toward_zero)}, {"upward", side(b.upward)}, {"biased", b.biased}};
}

double number_or(const nlohmann::json& j, const char* key, double fallback) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

}  // namespace

nlohmann::json input_errors_json(const std::vector<InputErrorRecord>& errors) {
  nlohmann::json list = nlohmann::json::array();
  for (const InputErrorRecord& e : errors) list.push_back({{"file", e.file}, {"message", e.message}});
  return list;
}

nlohmann::json tensor_json(const TensorScore& t) {
  nlohmann::json j = {{"name", t.name},
                      {"elements", t.elements},
                      {"failures", t.failures},
                      {"error_over_bound", finite_or_null(t.worst_ratio)},
                      {"worst_index", t.worst_index >= 0 ? nlohmann::json(t.worst_at) : nlohmann::json(nullptr)},
                      {"got_at_worst", finite_or_null(t.got_at_worst)},
                      {"truth_at_worst", finite_or_null(t.truth_at_worst)},
                      {"bound_at_worst", finite_or_null(t.bound_at_worst)},
                      {"max_abs_error", finite_or_null(t.max_abs_error)},
                      {"max_rel_error", finite_or_null(t.max_rel_error)},
                      {"rms_error", finite_or_null(t.rms_error)},
                      {"informative_fraction", t.informative_fraction},
                      {"decides_trust", t.decides_trust},
                      {"cosine", finite_or_null(t.cosine)},
                      {"norm_ratio", finite_or_null(t.norm_ratio)},
                      {"nan", t.nan_elements},
                      {"inf", t.infinite_elements},
                      {"nonfinite_rows", t.nonfinite_rows},
                      {"nonfinite_at", t.nonfinite_at}};
  j["error_over_baseline"] = t.measured ? finite_or_null(t.measured->budget) : nlohmann::json(nullptr);
  j["max_error_over_baseline"] = t.measured ? finite_or_null(t.measured->over_max) : nlohmann::json(nullptr);
  j["rms_error_over_baseline"] = t.measured ? finite_or_null(t.measured->over_rms) : nlohmann::json(nullptr);
  j["bias"] = t.bias ? bias_json(*t.bias) : nlohmann::json(nullptr);
  j["error_over_fixture_tolerance"] = t.fixture_ratio ? finite_or_null(*t.fixture_ratio) : nlohmann::json(nullptr);
  return j;
}

TensorScore tensor_from_json(const nlohmann::json& j) {
  const double inf = std::numeric_limits<double>::infinity();
  TensorScore t;
  t.name = j.value("name", "");
  t.elements = j.value("elements", std::int64_t{0});
  t.failures = j.value("failures", std::vector<std::string>{});
  // A null figure was not finite: an infinite ratio (a NaN, a hidden row not 0).
  t.worst_ratio = number_or(j, "error_over_bound", inf);
  if (const auto it = j.find("worst_index"); it != j.end() && it->is_array() && it->size() == 4) {
    t.worst_at = it->get<Dims4>();
    t.worst_index = 0;
  }
  t.got_at_worst = number_or(j, "got_at_worst", 0.0);
  t.truth_at_worst = number_or(j, "truth_at_worst", 0.0);
  t.bound_at_worst = number_or(j, "bound_at_worst", 0.0);
  t.max_abs_error = number_or(j, "max_abs_error", 0.0);
  t.max_rel_error = number_or(j, "max_rel_error", 0.0);
  t.rms_error = number_or(j, "rms_error", 0.0);
  t.informative_fraction = number_or(j, "informative_fraction", 0.0);
  t.decides_trust = j.value("decides_trust", true);
  t.nan_elements = j.value("nan", std::int64_t{0});
  t.infinite_elements = j.value("inf", std::int64_t{0});
  if (j.contains("error_over_baseline") && !j["error_over_baseline"].is_null()) {
    t.measured = MeasuredScore{number_or(j, "error_over_baseline", inf), number_or(j, "max_error_over_baseline", inf),
                               number_or(j, "rms_error_over_baseline", inf)};
  }
  if (j.contains("error_over_fixture_tolerance") && !j["error_over_fixture_tolerance"].is_null()) {
    t.fixture_ratio = number_or(j, "error_over_fixture_tolerance", inf);
  }
  return t;
}

nlohmann::json budget_json(const VerifySummary& summary) {
  nlohmann::json budget = nlohmann::json::array();
  auto distribution_json = [](const Distribution& d) {
    return nlohmann::json{{"count", d.count}, {"min", d.min}, {"median", d.median}, {"p99", d.p99}, {"max", d.max}};
  };
  for (const auto& b : budget_use(summary)) {
    budget.push_back({{"backend", b.backend}, {"dtype", b.dtype}, {"direction", direction_name(b.direction)},
                      {"error_over_bound", distribution_json(b.over_bound)},
                      {"error_over_baseline", distribution_json(b.over_baseline)}});
  }
  return budget;
}

nlohmann::json summary_json(const VerifySummary& summary) {
  nlohmann::json counts = nlohmann::json::object();
  for (const auto& o : summary.outcomes) {
    nlohmann::json& c = counts[o.backend];
    if (c.is_null()) c = {{"PASS", 0}, {"FAIL", 0}, {"SKIP", 0}, {"MISTRUSTED", 0}, {"DIFFERS", 0}};
    c[std::string(verdict_name(o.comparison.verdict))] = c[std::string(verdict_name(o.comparison.verdict))].get<int>() + 1;
  }
  return {{"per_backend", counts},
          {"results", summary.outcomes.size()},
          {"failed", summary.failed()},
          {"input_errors", summary.input_errors.size()}};
}

void describe_run(RunInfo& run, const VerifyOptions& options, const std::vector<std::unique_ptr<Backend>>& backends) {
  run.kernels = std::string(cpu_kernel_set());
  run.threads = options.thread_counts.empty() ? std::vector<int>{0} : options.thread_counts;
  run.layouts.clear();
  for (Layout l : options.layouts) run.layouts.emplace_back(layout_name(l));
  if (run.layouts.empty()) run.layouts.emplace_back("bhsd");
  run.backends.clear();
  for (const auto& b : backends) run.backends.emplace_back(std::string(b->name()), std::string(b->description()));
}

std::string verify_json(const VerifySummary& summary, const RunInfo& run) {
  nlohmann::json results = nlohmann::json::array();
  for (const auto& o : summary.outcomes) {
    const Comparison& c = o.comparison;
    nlohmann::json r = {{"backend", o.backend},       {"fixture", o.fixture},
                        {"file", o.file.string()},    {"problem", o.problem},
                        {"verdict", verdict_name(c.verdict)}, {"reason", c.reason},
                        {"seconds", o.seconds},
                        {"threads", o.config.threads},
                        {"layout", o.config.layout ? layout_name(*o.config.layout) : "bhsd"},
                        {"direction", direction_name(o.direction)},
                        {"check", o.check.empty() ? std::string("golden") : o.check}};
    // Nothing was measured when it was skipped or the backend threw: no tensor.
    r["tensors"] = nlohmann::json::array();
    for (const TensorScore& t : c.tensors) r["tensors"].push_back(tensor_json(t));
    if (!o.warning.empty()) r["warning"] = o.warning;
    if (o.quantisation) r["quantisation_error"] = {{"max", o.quantisation->max}, {"relative", o.quantisation->relative}};
    results.push_back(std::move(r));
  }
  nlohmann::json backends = nlohmann::json::object();
  for (const auto& [name, description] : run.backends) backends[name] = description;
  nlohmann::json shard = nullptr;
  if (summary.shard) {
    shard = {{"index", summary.shard->index}, {"count", summary.shard->count}, {"source", run.shard_source},
             {"suite", summary.suite},        {"units", summary.units},        {"units_run", summary.units_run}};
  }
  nlohmann::json doc = {{"schema", kVerifySchema},
                        {"tool", {{"name", "attn"}, {"version", run.version}, {"commit", run.commit}}},
                        {"host", {{"hostname", run.hostname}, {"cpu", run.cpu}, {"kernels", run.kernels}}},
                        {"run", {{"started", run.started}, {"threads", run.threads}, {"layouts", run.layouts},
                                 {"backends", backends}, {"shard", shard}}},
                        {"summary", summary_json(summary)},
                        {"limits",
                         {{"error_over_bound", 1.0},
                          {"error_over_baseline",
                           {{"f16", ToleranceConstants::baseline_factor_16bit}, {"bf16", ToleranceConstants::baseline_factor_16bit},
                            {"f32", ToleranceConstants::baseline_factor_wide}, {"f64", ToleranceConstants::baseline_factor_wide}}}}},
                        {"results", results},
                        {"budget", budget_json(summary)},
                        {"input_errors", input_errors_json(summary.input_errors)},
                        {"warnings", summary.warnings}};
  // Names and paths from fixtures may hold invalid UTF-8: replaced, not thrown.
  return doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

void write_json(const VerifySummary& summary, const std::filesystem::path& path, const RunInfo& run) {
  write_whole_file(path, verify_json(summary, run));
}

void write_junit(const VerifySummary& summary, const std::filesystem::path& path, const std::string& attn_command,
                 const RunInfo& run) {
  std::map<std::string, std::vector<const CaseOutcome*>> suites;
  for (const auto& o : summary.outcomes) suites[o.backend].push_back(&o);
  struct Totals {
    std::size_t tests = 0, failures = 0, errors = 0, skipped = 0;
    double seconds = 0;
  };
  auto totals_of = [](const std::vector<const CaseOutcome*>& outcomes) {
    Totals t;
    for (const auto* o : outcomes) {
      ++t.tests;
      t.failures += o->comparison.verdict == Verdict::fail;
      // MISTRUSTED is reported as skipped with its reason: it proved nothing,
      // so a dashboard must not count it as a pass. DIFFERS too: it does not
      // follow the format, even if it follows its framework.
      t.skipped += o->comparison.verdict == Verdict::skip || o->comparison.verdict == Verdict::mistrusted ||
                   o->comparison.verdict == Verdict::differs;
      t.seconds += o->seconds;
    }
    return t;
  };
  Totals all;
  for (const auto& [backend, outcomes] : suites) {
    const Totals t = totals_of(outcomes);
    all.tests += t.tests;
    all.failures += t.failures;
    all.skipped += t.skipped;
    all.seconds += t.seconds;
  }
  all.tests += summary.input_errors.size();
  all.errors += summary.input_errors.size();
  const std::string stamp = run.started.empty() ? "1970-01-01T00:00:00" : run.started;
  const std::string host = xml_escape(run.hostname.empty() ? "localhost" : run.hostname);
  std::string threads, layouts;
  for (int t : run.threads) threads += fmt::format("{}{}", threads.empty() ? "" : ",", t == 0 ? std::string("default") : std::to_string(t));
  for (const auto& l : run.layouts) layouts += fmt::format("{}{}", layouts.empty() ? "" : ",", l);
  auto properties = [&](const std::string& description) {
    std::string text = "    <properties>\n";
    auto add = [&](const char* name, const std::string& value) {
      if (!value.empty()) text += fmt::format("      <property name=\"{}\" value=\"{}\"/>\n", name, xml_escape(value));
    };
    add("attn.version", run.version);
    add("attn.commit", run.commit);
    add("host.cpu", run.cpu);
    add("host.kernels", run.kernels);
    add("run.threads", threads);
    add("run.layouts", layouts);
    add("backend.description", description);
    if (summary.shard) add("run.shard", summary.shard->text());
    return text + "    </properties>\n";
  };
  auto description_of = [&](const std::string& backend) {
    for (const auto& [name, description] : run.backends) {
      if (name == backend) return description;
    }
    return std::string();
  };
  std::ostringstream file;
  file << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  file << fmt::format("<testsuites name=\"attn verify\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" "
                      "time=\"{:.6f}\" timestamp=\"{}\">\n",
                      all.tests, all.failures, all.errors, all.skipped, all.seconds, stamp);
  int id = 0;
  for (const auto& [backend, outcomes] : suites) {
    const Totals t = totals_of(outcomes);
    file << fmt::format("  <testsuite name=\"{}\" id=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"{}\" "
                        "time=\"{:.6f}\" timestamp=\"{}\" hostname=\"{}\">\n",
                        xml_escape(backend), id++, t.tests, t.failures, t.skipped, t.seconds, stamp, host);
    file << properties(description_of(backend));
    for (const auto* o : outcomes) {
      file << fmt::format("    <testcase classname=\"{}\" name=\"{}\" time=\"{:.6f}\">", xml_escape(backend),
                          xml_escape(fixture_label(*o)), o->seconds);
      const Comparison& c = o->comparison;
      if (c.verdict == Verdict::fail) {
        file << fmt::format("<failure message=\"{}\" type=\"FAIL\">problem: {}\nreproduce: {}</failure>",
                            xml_escape(c.reason), xml_escape(o->problem), xml_escape(reproduce_command(*o, attn_command)));
      } else if (c.verdict == Verdict::skip) {
        file << fmt::format("<skipped message=\"{}\"/>", xml_escape(c.reason));
      } else if (c.verdict == Verdict::mistrusted) {
        file << fmt::format("<skipped message=\"MISTRUSTED: {}\"/>", xml_escape(c.reason));
      } else if (c.verdict == Verdict::differs) {
        file << fmt::format("<skipped message=\"DIFFERS: {}\"/>", xml_escape(c.reason));
      }
      if (!o->warning.empty()) file << fmt::format("<system-err>WARNING: {}</system-err>", xml_escape(o->warning));
      file << "</testcase>\n";
    }
    file << "  </testsuite>\n";
  }
  // Fixtures that could not be judged (unreadable, or a golden that is not the
  // attention of its own inputs) are errors, so no dashboard shows them green.
  if (!summary.input_errors.empty()) {
    file << fmt::format("  <testsuite name=\"inputs\" id=\"{0}\" tests=\"{1}\" failures=\"0\" errors=\"{1}\" "
                        "skipped=\"0\" time=\"0\" timestamp=\"{2}\" hostname=\"{3}\">\n",
                        id, summary.input_errors.size(), stamp, host);
    file << properties("fixtures that could not be judged");
    for (std::size_t n = 0; n < summary.input_errors.size(); ++n) {
      // Named after its file, so that a dashboard shows which fixture it was;
      // otherwise by its number.
      const InputErrorRecord& error = summary.input_errors[n];
      const std::string name = error.file.empty() ? fmt::format("input {}", n + 1) : error.file;
      file << fmt::format("    <testcase classname=\"inputs\" name=\"{}\" time=\"0\"><error message=\"{}\" "
                          "type=\"input error\"/></testcase>\n",
                          xml_escape(name), xml_escape(error.message));
    }
    file << "  </testsuite>\n";
  }
  file << "</testsuites>\n";
  write_whole_file(path, file.str());
}

}  // namespace attn
