// attn show FILE --weights | --heatmap OUT.png | --gradient dp|ds: the
// attention weights of a case (sdpa or a whole layer), from the reference or a
// backend, or a version 3 case's dP or dS from the reference.
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "attnbench/error.hpp"
#include "core/output_file.hpp"
#include "core/text.hpp"
#include "core/registry.hpp"
#include "fixtures/fixture.hpp"
#include "fixtures/layer.hpp"
#include "reference/layer.hpp"
#include "verify/layer.hpp"
#include "verify/weights.hpp"

namespace attn::cli {

namespace {

struct ShowArgs {
  std::string file, heatmap, backend, gradient;
  bool weights = false, all = false;
  std::int64_t batch = 0, head = -1;  // head -1: the table shows head 0, the heatmap every head
  int threads = 0;
};

// The attention inputs of either kind of case: for a layer, the projections
// (exact for the reference, rounded to dtype as a backend sees them).
CaseData attention_inputs(const FixtureHeader& header, bool for_backend) {
  if (header.kind == FixtureKind::sdpa) return read_fixture(header.path).data;
  LayerFixture layer = read_layer_fixture(header.path);
  return for_backend ? layer_attention_inputs(layer.data) : reference_layer(layer.data).attention;
}

WeightsView view_of(const ShowArgs& args, const CaseData& data, std::int64_t head) {
  if (args.backend.empty() || args.backend == "reference") return reference_weights_view(data, args.batch, head);
  auto backends = make_backends(std::vector<std::string>{args.backend});
  return backend_weights_view(*backends.front(), data, args.batch, head, {args.threads});
}

void draw_heatmap(const ShowArgs& args, const FixtureHeader& header, const CaseData& data) {
  const Problem& p = data.problem;
  nlohmann::json spec;
  spec["title"] = fmt::format("{} (batch {}, {})", header.name, args.batch, args.backend.empty() ? "reference" : args.backend);
  spec["heads"] = nlohmann::json::array();
  for (std::int64_t h = 0; h < p.heads_q; ++h) {
    if (args.head >= 0 && h != args.head) continue;
    WeightsView view = view_of(args, data, h);
    nlohmann::json weights = nlohmann::json::array(), hidden = nlohmann::json::array();
    for (std::int64_t i = 0; i < view.queries; ++i) {
      nlohmann::json row = nlohmann::json::array(), hidden_row = nlohmann::json::array();
      for (std::int64_t j = 0; j < view.keys; ++j) {
        row.push_back(view.weights[static_cast<std::size_t>(i * view.keys + j)]);
        hidden_row.push_back(view.hidden[static_cast<std::size_t>(i * view.keys + j)] != 0);
      }
      weights.push_back(row);
      hidden.push_back(hidden_row);
    }
    spec["heads"].push_back({{"label", fmt::format("head {}", h)}, {"weights", weights}, {"hidden", hidden}});
  }
  // The image is drawn into a temporary beside its name (missing folders are
  // created, as for every output) and renamed into place when whole.
  std::string format = std::filesystem::path(args.heatmap).extension().string();
  if (!format.empty()) format.erase(0, 1);
  for (auto& c : format) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (format.empty()) format = "png";
  if (format != "png" && format != "svg" && format != "pdf") {
    throw Error(fmt::format("{}: the heatmap is written as .png, .svg or .pdf, not .{}", args.heatmap, format));
  }
  OutputFile image(args.heatmap);
  char path[] = "/tmp/attn_heatmap_XXXXXX.json";
  int fd = mkstemps(path, 5);
  if (fd < 0) throw Error("cannot create a temporary file for the heatmap");
  close(fd);
  std::ofstream(path) << spec.dump();
  const char* python = std::getenv("ATTN_PYTHON");
  std::string command = fmt::format("{} {} {} {} {}", shell_quote(python ? python : "/usr/bin/python3"),
                                    shell_quote(data_path("reports/heatmap.py", "reports/heatmap.py")), shell_quote(path),
                                    shell_quote(image.temp_path().string()), format);
  int status = std::system(command.c_str());
  std::remove(path);
  if (status != 0) {
    throw Error(fmt::format("drawing the heatmap failed (exit {}): {} (needs python3-matplotlib; "
                            "scripts/install-deps installs it)", WEXITSTATUS(status), command));
  }
  image.commit();
  fmt::print("wrote {}\n", args.heatmap);
}

}  // namespace

Runner add_show_command(CLI::App& app) {
  auto args = std::make_shared<ShowArgs>();
  CLI::App* cmd = app.add_subcommand("show", "Show the attention weights of a case (sdpa or layer) as a table or a heatmap, "
                                             "or a version 3 case's dP or dS");
  cmd->add_option("file", args->file, "Fixture file")->required();
  cmd->add_flag("--weights", args->weights, "Print the weights as a table (the default)");
  cmd->add_flag("--all", args->all, "Print every weight (by default a long case shows its first and last queries and keys)");
  cmd->add_option("--heatmap", args->heatmap, "Draw the weights as a heatmap (.png, .svg or .pdf), one panel per head");
  cmd->add_option("--batch", args->batch, "Batch entry (default 0)");
  cmd->add_option("--head", args->head, "Query head (default: 0 for the table, all for the heatmap)");
  cmd->add_option("-b,--backend", args->backend, "Weights from this backend instead of the float64 reference");
  cmd->add_option("--threads", args->threads, "Threads for the backend, 1 to 256")->check(CLI::Range(1, 256));
  cmd->add_option("--gradient", args->gradient,
                  "Print a format version 3 case's dP = dO V^T or dS = P (dP - D) instead of the weights (float64 reference)")
      ->check(CLI::IsMember({"dp", "ds"}));
  return [args]() {
    FixtureHeader header = read_fixture_header(args->file);
    if (!args->gradient.empty()) {
      if (!args->heatmap.empty() || (!args->backend.empty() && args->backend != "reference")) {
        throw Error("--gradient prints the reference's dP or dS as a table: a backend returns only dQ, dK and dV, "
                    "and the heatmap draws weights");
      }
      if (header.kind != FixtureKind::sdpa || !header.gradients) {
        throw InputError(fmt::format("{}: --gradient needs a case with gradients (format version 3)", header.path.string()));
      }
      const Fixture fixture = read_fixture(header.path);
      const std::int64_t head = std::max<std::int64_t>(args->head, 0);
      const bool ds = args->gradient == "ds";
      const std::string table = format_weights_table(
          reference_gradient_view(fixture.data, fixture.gradients->dout, args->batch, head, ds ? GradientMatrix::ds : GradientMatrix::dp),
          args->all ? 0 : 24, args->all ? 0 : 16);
      fmt::print("{}: {}, batch {}, head {}, from the float64 reference (queries down, keys across; '-' = hidden)\n",
                 header.name, ds ? "dS = P (dP - D), the gradient of the scores" : "dP = dO V^T, the gradient of the weights",
                 args->batch, head);
      fmt::print("{}", table);
      return 0;
    }
    const bool from_backend = !args->backend.empty() && args->backend != "reference";
    CaseData data = attention_inputs(header, from_backend);
    if (!args->heatmap.empty()) {
      draw_heatmap(*args, header, data);
      if (!args->weights) return 0;
    }
    const std::int64_t head = std::max<std::int64_t>(args->head, 0);
    // The weights first: a batch or head out of range is an error before anything is printed.
    const std::string table = format_weights_table(view_of(*args, data, head), args->all ? 0 : 24, args->all ? 0 : 16);
    fmt::print("{}: attention weights, batch {}, head {}, from {} (queries down, keys across; '-' = hidden)\n",
               header.name, args->batch, head, from_backend ? args->backend : "the float64 reference");
    fmt::print("{}", table);
    return 0;
  };
}

}  // namespace attn::cli
