// attn list: every backend in this build, whether it can run here, and what it supports.
#include <fmt/format.h>

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "cli/commands.hpp"
#include "core/cpu.hpp"
#include "core/registry.hpp"
#include "core/text.hpp"

namespace attn::cli {

std::string data_path(const std::string& share_relative, const std::string& source_relative) {
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    std::filesystem::path installed = exe.parent_path().parent_path() / "share" / "attnbench" / share_relative;
    if (std::filesystem::exists(installed, ec)) return installed.string();
  }
  return std::string(ATTN_SOURCE_DIR) + "/" + source_relative;
}

std::string default_fixtures() { return data_path("fixtures/golden", "fixtures/golden"); }

namespace {

// The terminal's width: COLUMNS, else the terminal's own; 0 when stdout is
// not a terminal (a pipe or a file gets one line per row, for grep).
std::size_t terminal_columns() {
  if (const char* env = std::getenv("COLUMNS")) {
    char* end = nullptr;
    const long n = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && n >= 40 && n <= 1000) return static_cast<std::size_t>(n);
  }
  winsize size{};
  if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col >= 40) return size.ws_col;
  return 0;
}

// The questions of the support matrix: one small problem each, asked of
// backend_accepts() (declared capabilities, then supports()).
struct Probe {
  const char* column;
  const char* problem;
};
const Probe kProbes[] = {
    {"float64", "dtype=f64,b=1,hq=2,hkv=2,sq=4,sk=8,d=8"},
    {"float32", "dtype=f32,b=1,hq=2,hkv=2,sq=4,sk=8,d=8"},
    {"float16", "dtype=f16,b=1,hq=2,hkv=2,sq=4,sk=8,d=8"},
    {"bfloat16", "dtype=bf16,b=1,hq=2,hkv=2,sq=4,sk=8,d=8"},
    {"mask", "dtype=f32,b=2,hq=2,hkv=2,sq=4,sk=8,d=8,mask=2x2x4"},
    {"bias", "dtype=f32,b=2,hq=2,hkv=2,sq=4,sk=8,d=8,bias=2x1x4"},
    {"causal", "dtype=f32,b=1,hq=2,hkv=2,sq=4,sk=8,d=8,causal=bottom_right"},
    {"kv_len", "dtype=f32,b=2,hq=2,hkv=2,sq=4,sk=8,d=8,kv_len"},
    {"GQA", "dtype=f32,b=1,hq=4,hkv=1,sq=4,sk=8,d=8"},
    {"other scale", "dtype=f32,b=1,hq=2,hkv=2,sq=4,sk=8,d=8,scale=0.5"},
    {"head_dim 256", "dtype=f32,b=1,hq=2,hkv=2,sq=4,sk=8,d=256,dv=64"},
    {"seq_k 0", "dtype=f32,b=1,hq=2,hkv=2,sq=4,sk=0,d=8"},
    {"window", "dtype=f32,b=1,hq=2,hkv=2,sq=4,sk=8,d=8,causal=bottom_right,wl=2"},
    {"softcap", "dtype=f32,b=1,hq=2,hkv=2,sq=4,sk=8,d=8,softcap=30"},
    {"ALiBi", "dtype=f32,b=1,hq=2,hkv=2,sq=4,sk=8,d=8,alibi"},
    {"sinks", "dtype=f32,b=1,hq=2,hkv=2,sq=4,sk=8,d=8,sinks"},
    {"packed", "dtype=f32,b=2,hq=2,hkv=2,sq=8,sk=16,d=8,ragged"},
    {"paged", "dtype=f32,b=2,hq=2,hkv=2,sq=1,sk=32,d=8,paged=16x4"},
};

std::string cell(std::string text) {
  for (char& c : text) {
    if (c == '|' || c == '\n') c = ' ';
  }
  return text;
}

// The support matrix as Markdown (docs/generated/support.md): every backend of
// this build against each question, from what it declares and what supports()
// answers here.
void print_matrix(const std::vector<std::unique_ptr<Backend>>& backends) {
  fmt::print("| backend | available here | declares |");
  for (const Probe& probe : kProbes) fmt::print(" {} |", probe.column);
  fmt::print("\n|---|---|---|");
  for (std::size_t i = 0; i < std::size(kProbes); ++i) fmt::print("---|");
  fmt::print("\n");
  std::vector<std::string> notes;
  for (const auto& backend : backends) {
    const Status available = backend->available();
    fmt::print("| `{}` | {} | {} |", backend->name(), available ? "yes" : "no (below)",
               cell(describe_capabilities(backend->capabilities())));
    if (!available) notes.push_back(fmt::format("`{}` is not available here: {}", backend->name(), cell(printable(available.reason))));
    for (const Probe& probe : kProbes) {
      if (!available) {
        // Without its framework or device a backend can only answer what it declares.
        const Problem p = Problem::parse(probe.problem);
        const Capabilities c = backend->capabilities();
        const bool declared = (c.dtypes & dtype_bit(p.dtype)) && !(p.features() & ~c.features);
        fmt::print(" {} |", declared ? "declared" : "no");
        continue;
      }
      const Status s = backend_accepts(*backend, Problem::parse(probe.problem));
      if (s) {
        fmt::print(" yes |");
      } else {
        notes.push_back(fmt::format("`{}`, {}: {}", backend->name(), probe.column, cell(printable(s.reason))));
        fmt::print(" no [{}] |", notes.size());
      }
    }
    fmt::print("\n");
  }
  fmt::print("\n");
  for (std::size_t i = 0; i < notes.size(); ++i) fmt::print("{}. {}\n", i + 1, notes[i]);
}

}  // namespace

Runner add_list_command(CLI::App& app) {
  CLI::App* cmd =
      app.add_subcommand("list", "List the backends of this build, their availability and what they support");
  auto markdown = std::make_shared<bool>(false);
  cmd->add_flag("--markdown", *markdown,
                "Print the support matrix as Markdown instead: each backend against each feature, with the reasons");
  return [markdown] {
    auto backends = make_backends();
    if (*markdown) {
      print_matrix(backends);
      return 0;
    }
    const Bf16Products& bf16 = bf16_products();  // (an ATTN_BF16_PRODUCTS error before any output)
    fmt::print("host: {}; CPU kernel set: {} (ATTN_CPU_ISA=amx|avx512_vbmi|avx512|portable forces one)\n", cpu_model_name().empty() ? "unknown CPU" : printable(cpu_model_name()),
               cpu_kernel_set());
    fmt::print("bfloat16 products: {} ({}; ATTN_BF16_PRODUCTS=dot|float32 forces one)\n\n", bf16.dot ? "in bfloat16 pairs" : "widened to float32",
               bf16.why);
    // The name column fits the longest name; on a terminal the text column
    // wraps at its width, under itself.
    std::size_t name_width = 14;
    for (const auto& backend : backends) name_width = std::max(name_width, printable(backend->name()).size());
    const std::size_t columns = terminal_columns();
    const std::size_t text_width = columns == 0 ? std::string::npos : columns > name_width + 30 ? columns - name_width - 11 : 20;
    auto row = [&](std::string_view name, std::string_view label, std::string_view text) {
      const std::vector<std::string> lines = wrap_words(printable(text), text_width);
      fmt::print("{:<{}} {:<9} {}\n", printable(name), name_width, label, lines[0]);
      for (std::size_t l = 1; l < lines.size(); ++l) fmt::print("{:<{}} {:<9} {}\n", "", name_width, "", lines[l]);
    };
    row("backend", "available", "description");
    for (const auto& backend : backends) {
      const Status available = backend->available();
      row(backend->name(), available ? "yes" : "no", backend->description());
      if (!available) row("", "why not:", available.reason);
      row("", "supports:", describe_capabilities(backend->capabilities()));
    }
    return 0;
  };
}

}  // namespace attn::cli
