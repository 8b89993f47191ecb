// attn report: HTML and Markdown reports from `attn bench` (and `attn verify
// --json`) results, and regression tables between two runs. The plotting and
// statistics live in reports/ (Python, matplotlib and SciPy from Debian); this
// command draws the attention-weights figure and hands over.
#include <fmt/format.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>

#include "cli/commands.hpp"
#include "core/error.hpp"

namespace attn::cli {

namespace {

struct ReportArgs {
  std::vector<std::string> files;
  std::vector<std::string> compare;
  std::string out;
  double fail_on_regression = -1;
  std::string weights_case = ATTN_DEFAULT_FIXTURES "/layer/causal_self_b2_s10_nobias_f32.h5";
};

std::string quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

int run(const std::string& command) {
  int status = std::system(command.c_str());
  if (status == -1 || !WIFEXITED(status)) throw Error(fmt::format("could not run: {}", command));
  return WEXITSTATUS(status);
}

std::string python() {
  const char* python = std::getenv("ATTN_PYTHON");
  return python ? python : "/usr/bin/python3";
}

}  // namespace

Runner add_report_command(CLI::App& app) {
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand("report", "Write an HTML report and a Markdown summary, or compare two runs");
  cmd->add_option("files", args->files, "Results of attn bench --out (several machines merge), and optionally attn verify --json");
  cmd->add_option("--out", args->out, "Folder for report.html, summary.md and plots/");
  cmd->add_option("--compare", args->compare, "BASE.json NEW.json: print a regression table instead")->expected(2);
  cmd->add_option("--fail-on-regression", args->fail_on_regression,
                  "With --compare: exit 1 if a benchmark got slower by more than PCT percent");
  cmd->add_option("--weights-case", args->weights_case, "Fixture whose attention weights the report draws");
  return [args]() {
    const std::string script = quote(ATTN_SOURCE_DIR "/reports/report.py");
    if (!args->compare.empty()) {
      std::string command = fmt::format("{} {} compare {} {}", python(), script, quote(args->compare[0]), quote(args->compare[1]));
      if (args->fail_on_regression >= 0) command += fmt::format(" --fail-on-regression {}", args->fail_on_regression);
      int code = run(command);
      return code == 0 ? 0 : code == 1 ? 1 : 2;
    }
    if (args->files.empty() || args->out.empty()) throw Error("report: give result files and --out DIR (or --compare BASE NEW)");
    std::filesystem::create_directories(args->out);
    const std::string weights = (std::filesystem::path(args->out) / "weights.png").string();
    const std::string self = quote(std::filesystem::read_symlink("/proc/self/exe").string());
    int drawn = run(fmt::format("{} show {} --heatmap {} > /dev/null", self, quote(args->weights_case), quote(weights)));
    std::string command = fmt::format("{} {} report", python(), script);
    for (const auto& f : args->files) command += " " + quote(f);
    command += " --out " + quote(args->out);
    if (drawn == 0) command += " --weights " + quote(weights);
    else fmt::print(stderr, "attn report: no attention-weights figure (drawing {} failed)\n", args->weights_case);
    int code = run(command);
    std::filesystem::remove(weights);
    return code == 0 ? 0 : 2;
  };
}

}  // namespace attn::cli
