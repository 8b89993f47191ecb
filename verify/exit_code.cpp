#include "verify/exit_code.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace attn {

ExitDecision verification_exit(const VerifySummary& summary, const ExitPolicy& policy) {
  const auto count = [&](Verdict v) {
    return std::count_if(summary.outcomes.begin(), summary.outcomes.end(),
                         [v](const CaseOutcome& o) { return o.comparison.verdict == v; });
  };
  if (!summary.input_errors.empty()) {
    return {2, fmt::format("{} input error{} (listed above and in every output)", summary.input_errors.size(),
                           summary.input_errors.size() == 1 ? "" : "s")};
  }
  if (summary.failed() > 0) return {1, {}};
  if (policy.shard) return {0, {}};
  if (summary.outcomes.empty()) return {2, "no case was selected: nothing was verified"};
  if (count(Verdict::skip) == static_cast<std::ptrdiff_t>(summary.outcomes.size()) && !policy.allow_all_skipped) {
    return {1, "every backend skipped every case: nothing was verified (--allow-all-skipped accepts that)"};
  }
  if (policy.fail_on_mistrusted && count(Verdict::mistrusted) > 0) {
    return {1, fmt::format("{} results are MISTRUSTED (--fail-on-mistrusted)", count(Verdict::mistrusted))};
  }
  return {0, {}};
}

}  // namespace attn
