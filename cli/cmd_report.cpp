// attn report: HTML and Markdown reports from `attn bench` (and `attn verify
// --json`) results, and regression tables between two runs. The plotting and
// statistics live in reports/ (Python, matplotlib and SciPy from Debian); this
// command draws the attention-weights figure and hands over.
#include <fmt/format.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>

#include <cstdlib>
#include <filesystem>

#include "cli/commands.hpp"
#include "attnbench/error.hpp"

namespace attn::cli {

namespace {

struct ReportArgs {
  std::vector<std::string> files;
  std::vector<std::string> compare;
  std::string out;
  double fail_on_regression = -1;
  std::string weights_case = default_fixtures() + "/layer/causal_self_b2_s10_nobias_f32.h5";
};

std::string quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `command` with /bin/sh in a child that the kernel kills when attn
// dies (PR_SET_PDEATHSIG), so a killed report leaves no writer behind.
int run(const std::string& command) {
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) throw Error(fmt::format("could not run: {}", command));
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // attn died before the line above
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) throw Error(fmt::format("could not run: {}", command));
  }
  if (!WIFEXITED(status)) throw Error(fmt::format("could not run: {}", command));
  return WEXITSTATUS(status);
}

// The report is drawn into a new folder beside --out and swapped in once
// complete: an interrupted or failed report leaves the previous one, or none,
// never a half one.
class ReportFolder {
 public:
  explicit ReportFolder(std::filesystem::path out) : out_(std::move(out)) {
    namespace fs = std::filesystem;
    // The swap replaces the whole folder: only one that holds nothing but an
    // earlier report (or nothing) may be replaced, never a folder of other files.
    std::error_code ec;
    if (fs::exists(out_, ec)) {
      if (fs::equivalent(out_, fs::current_path(), ec)) {
        throw Error(fmt::format("{}: is the current folder; give the report a folder of its own", out_.string()));
      }
      for (const auto& entry : fs::directory_iterator(out_)) {
        const std::string name = entry.path().filename().string();
        if (name != "report.html" && name != "summary.md" && name != "plots") {
          throw Error(fmt::format("{}: holds {}, which is not part of a report; give a new or empty folder "
                                  "(the report replaces its folder whole)",
                                  out_.string(), name));
        }
      }
    }
    const fs::path parent = out_.has_parent_path() ? out_.parent_path() : fs::path(".");
    fs::create_directories(parent);
    std::string pattern = (parent / fmt::format(".{}.tmp-XXXXXX", out_.filename().string())).string();
    if (::mkdtemp(pattern.data()) == nullptr) throw Error(fmt::format("{}: cannot create a folder beside it", out_.string()));
    temp_ = pattern;
  }
  ~ReportFolder() {
    std::error_code ec;
    if (!temp_.empty()) std::filesystem::remove_all(temp_, ec);
  }
  const std::filesystem::path& temp() const { return temp_; }
  void commit() {
    namespace fs = std::filesystem;
    std::error_code ec;
    // mkdtemp made it 0700; the finished report gets what the umask gives a new folder.
    const mode_t mask = ::umask(0);
    ::umask(mask);
    fs::permissions(temp_, static_cast<fs::perms>(0777 & ~mask), ec);
    fs::path old;
    if (fs::exists(out_)) {
      old = temp_.string() + ".old";
      fs::rename(out_, old);
    }
    fs::rename(temp_, out_, ec);
    if (ec) {
      if (!old.empty()) fs::rename(old, out_);
      throw Error(fmt::format("{}: cannot move the finished report into place: {}", out_.string(), ec.message()));
    }
    temp_.clear();
    if (!old.empty()) fs::remove_all(old, ec);
  }

 private:
  std::filesystem::path out_, temp_;
};

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
                  "With --compare: exit 1 if a benchmark got slower by more than PCT percent and significantly "
                  "(Mann-Whitney over the repetitions, p < 0.05, at least 4 a side); exit 4 when some benchmark has "
                  "too few repetitions to be judged and none regressed");
  cmd->add_option("--weights-case", args->weights_case, "Fixture whose attention weights the report draws");
  return [args]() {
    const std::string script = quote(data_path("reports/report.py", "reports/report.py"));
    if (!args->compare.empty()) {
      std::string command = fmt::format("{} {} compare {} {}", python(), script, quote(args->compare[0]), quote(args->compare[1]));
      if (args->fail_on_regression >= 0) command += fmt::format(" --fail-on-regression {}", args->fail_on_regression);
      int code = run(command);
      // 4: inconclusive, too few repetitions to judge (reports/attn_report/compare.py).
      return code == 0 || code == 1 || code == 4 ? code : 2;
    }
    if (args->files.empty() || args->out.empty()) throw Error("report: give result files and --out DIR (or --compare BASE NEW)");
    if (std::filesystem::exists(args->out) && !std::filesystem::is_directory(args->out)) {
      throw Error(fmt::format("{}: is not a folder", args->out));
    }
    ReportFolder folder(args->out);
    const std::string weights = (folder.temp() / "weights.png").string();
    const std::string self = quote(std::filesystem::read_symlink("/proc/self/exe").string());
    int drawn = run(fmt::format("{} show {} --heatmap {} > /dev/null", self, quote(args->weights_case), quote(weights)));
    std::string command = fmt::format("{} {} report", python(), script);
    for (const auto& f : args->files) command += " " + quote(f);
    command += " --out " + quote(folder.temp().string());
    if (drawn == 0) command += " --weights " + quote(weights);
    else fmt::print(stderr, "attn report: no attention-weights figure (drawing {} failed)\n", args->weights_case);
    int code = run(command);
    std::filesystem::remove(weights);
    if (code != 0) return 2;
    folder.commit();
    fmt::print("attn report: the report is complete in {}\n", args->out);
    return 0;
  };
}

}  // namespace attn::cli
