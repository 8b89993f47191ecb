// attn fixtures generate | show | list: write the standard suite, look inside a fixture.
#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <cmath>

#include "cli/commands.hpp"
#include "attnbench/error.hpp"
#include "core/output_file.hpp"
#include "core/text.hpp"
#include "fixtures/fixture.hpp"
#include "fixtures/layer.hpp"
#include "reference/layer.hpp"
#include "verify/weights.hpp"
#include "fixtures/suite.hpp"
#include "reference/reference.hpp"

namespace attn::cli {

namespace {

struct FixturesArgs {
  std::string out;
  std::vector<std::string> tags;
  std::string match;
  bool replace = false;
  std::string file;
  std::vector<std::string> paths;
  int rows = 4;
};

bool has_any_tag(const CaseSpec& spec, const std::vector<std::string>& tags) {
  if (tags.empty()) return true;
  std::string list = "," + spec.tags + ",";
  return std::any_of(tags.begin(), tags.end(), [&](const std::string& t) { return list.find("," + t + ",") != std::string::npos; });
}

// Each file is written beside its name and renamed into place once whole, so
// a reader never sees a truncated fixture and no file another process has open
// is zeroed. A folder that already holds files is refused unless --replace is
// given; then, for the whole suite, files the suite no longer has are removed.
int generate(const FixturesArgs& args) {
  namespace fs = std::filesystem;
  const fs::path root(args.out);
  std::error_code ec;
  if (fs::exists(root, ec) && !fs::is_directory(root, ec)) throw Error(fmt::format("{}: is not a folder", args.out));
  const bool occupied = fs::is_directory(root, ec) && fs::directory_iterator(root, ec) != fs::directory_iterator();
  if (occupied && !args.replace) {
    throw Error(fmt::format("{}: is not empty; give --replace to overwrite the suite there (files the suite no "
                            "longer has are then removed), or choose an empty folder",
                            args.out));
  }
  const bool whole_suite = args.tags.empty() && args.match.empty();
  std::vector<fs::path> wanted;
  for (const CaseSpec& spec : standard_suite()) {
    if (!has_any_tag(spec, args.tags)) continue;
    if (!args.match.empty() && spec.name.find(args.match) == std::string::npos) continue;
    wanted.push_back(root / (spec.name + ".h5"));
  }
  if (wanted.empty()) throw Error("no case of the standard suite matched");
  int written = 0;
  for (const CaseSpec& spec : standard_suite()) {
    const fs::path path = root / (spec.name + ".h5");
    if (std::find(wanted.begin(), wanted.end(), path) == wanted.end()) continue;
    OutputFile file(path);
    write_generated_case(spec, file.temp_path());
    file.commit();
    fmt::print("{}\n", path.string());
    ++written;
  }
  int removed = 0;
  if (occupied && whole_suite) {
    std::vector<fs::path> stale;
    for (const auto& entry : fs::recursive_directory_iterator(root)) {
      if (entry.is_regular_file() && entry.path().extension() == ".h5" &&
          std::find(wanted.begin(), wanted.end(), entry.path()) == wanted.end()) {
        stale.push_back(entry.path());
      }
    }
    for (const auto& path : stale) {
      fs::remove(path);
      fmt::print(stderr, "removed {} (not in the suite)\n", path.string());
      ++removed;
    }
  }
  fmt::print(stderr, "wrote {} fixtures to {}{}\n", written, args.out,
             removed > 0 ? fmt::format(", removed {} the suite no longer has", removed) : "");
  return 0;
}

void print_matrix(const std::vector<double>& values, std::int64_t rows, std::int64_t cols, std::int64_t show_rows,
                  std::int64_t show_cols) {
  for (std::int64_t i = 0; i < std::min(rows, show_rows); ++i) {
    fmt::print("    [{:>3}]", i);
    for (std::int64_t c = 0; c < std::min(cols, show_cols); ++c) {
      fmt::print(" {:>10.4g}", values[static_cast<std::size_t>(i * cols + c)]);
    }
    fmt::print("{}\n", cols > show_cols ? " ..." : "");
  }
  if (rows > show_rows) fmt::print("    ... {} more rows\n", rows - show_rows);
}

// A layer case (kind mha): its projections' shapes, y, and the attention
// weights of the projected inputs (float64 reference).
int show_layer(const FixturesArgs& args, const FixtureHeader& h) {
  const LayerFixture f = read_layer_fixture(args.file);
  const Problem& p = f.problem();
  const LayerData& w = f.data;
  fmt::print("file        {}\nname        {}\ndescription {}\ngenerator   {}\ntags        {}\nkind        mha (a whole "
             "layer: projections, attention, output projection)\nproblem     {}\nmodel_dim   {}\n",
             printable(h.path.string()), printable(h.name), printable(h.description), printable(h.generator),
             printable(fmt::format("{}", fmt::join(h.tags, ","))), p.to_string(), w.model_dim);
  if (w.k_in() != w.model_dim || w.v_in() != w.model_dim) fmt::print("kdim, vdim  {}, {}\n", w.k_in(), w.v_in());
  fmt::print("datasets\n  x_q  [{}, {}, {}]\n  x_k  [{}, {}, {}]\n  x_v  [{}, {}, {}]\n", p.batch, p.seq_q, w.model_dim,
             p.batch, p.seq_k, w.k_in(), p.batch, p.seq_k, w.v_in());
  fmt::print("  w_q  [{}, {}]{}\n  w_k  [{}, {}]{}\n  w_v  [{}, {}]{}\n  w_o  [{}, {}]{}\n", w.model_dim, w.q_width(),
             w.b_q.empty() ? "" : " + b_q", w.k_in(), w.k_width(), w.b_k.empty() ? "" : " + b_k", w.v_in(),
             w.v_width(), w.b_v.empty() ? "" : " + b_v", w.o_width(), w.model_dim, w.b_o.empty() ? "" : " + b_o");
  fmt::print("  y    [{}, {}, {}]\n", p.batch, p.seq_q, w.model_dim);
  const auto rows = static_cast<std::int64_t>(args.rows);
  fmt::print("\ny[0] (first {} rows, first 8 columns)\n", rows);
  print_matrix(f.y, p.seq_q, w.model_dim, rows, 8);
  if (p.seq_k > 0 && p.seq_q > 0) {
    fmt::print("\nattention weights [0, 0] of the projected inputs (queries down, keys across; '-' = hidden)\n");
    fmt::print("{}", format_weights_table(reference_weights_view(reference_layer(w).attention, 0, 0), 16, 16));
  }
  return 0;
}

int show(const FixturesArgs& args) {
  const FixtureHeader header = read_fixture_header(args.file);
  if (header.kind == FixtureKind::mha) return show_layer(args, header);
  Fixture f = read_fixture(args.file);
  const Problem& p = f.problem();
  const FixtureHeader& h = f.header;
  fmt::print("file        {}\nname        {}\ndescription {}\ngenerator   {}\ntags        {}\nproblem     {}\n",
             printable(h.path.string()), printable(h.name), printable(h.description), printable(h.generator),
             printable(fmt::format("{}", fmt::join(h.tags, ","))), p.to_string());
  fmt::print("dtype       {}\ncausal      {}\nscale       {}\n", dtype_name(p.dtype), causal_name(p.causal), p.scale);
  if (h.atol || h.rtol) fmt::print("tolerance   atol={} rtol={} (the fixture's own)\n", h.atol.value_or(0), h.rtol.value_or(0));
  if (p.features()) {  // format version 2 (docs/format/v2.md)
    fmt::print("version 2   {}\n", feature_names(p.features()));
    if (p.has_window() || (p.alibi && p.causal == Causal::none)) {
      fmt::print("window      left {}, right {}, from the {} diagonal\n", p.window_left >= 0 ? std::to_string(p.window_left) : "unbounded",
                 p.window_right >= 0 ? std::to_string(p.window_right) : "unbounded", align_name(p.alignment()));
    }
    if (p.softcap != 0) fmt::print("softcap     {}\n", p.softcap);
  }
  for (char t : {'q', 'k', 'v'}) {  // format version 4 (docs/format/v4.md)
    const QuantSpec& spec = p.quant(t);
    if (!spec.quantised()) continue;
    const auto shape = p.stored_shape(t);
    std::string what = fmt::format("{} codes [{}, {}, {}, {} bytes]", encoding_name(spec.encoding), shape[0], shape[1], shape[2],
                                   encoded_row_bytes(spec.encoding, shape[3]));
    if (spec.descale == Descale::tensor) what += fmt::format(", descale {}", f.data.quant(t).descale.front());
    if (spec.descale == Descale::entry_head) what += fmt::format(", a descale per (batch entry, kv head) [{}, {}]", p.batch, p.heads_kv);
    if (spec.has_scale()) {
      what += fmt::format(", scale{} [{}]", spec.zero_point ? " and zero point" : "", fmt::join(spec.scale, ", "));
    }
    if (!f.data.quant(t).original.empty()) what += ", original values";
    fmt::print("version 4   {}: {}\n", t, what);
  }
  fmt::print("datasets\n  q    [{}, {}, {}, {}]\n  k    [{}, {}, {}, {}]\n  v    [{}, {}, {}, {}]\n", p.q_batch(), p.heads_q,
             p.seq_q, p.head_dim, p.kv_batch(), p.heads_kv, p.kv_seq(), p.head_dim, p.kv_batch(), p.heads_kv, p.kv_seq(),
             p.head_dim_v);
  if (p.alibi) fmt::print("  alibi_slopes [{}] = {}\n", p.heads_q, fmt::join(f.data.alibi_slopes, ", "));
  if (p.sinks) fmt::print("  sinks [{}] = {}\n", p.heads_q, fmt::join(f.data.sinks, ", "));
  if (p.ragged) {
    fmt::print("  cu_seqlens_q [{}] = {}\n", p.batch + 1, fmt::join(f.data.cu_seqlens_q, ", "));
    fmt::print("  cu_seqlens_k [{}] = {}\n", p.batch + 1, fmt::join(f.data.cu_seqlens_k, ", "));
  }
  if (p.paged()) {
    fmt::print("  page_table [{}, {}] (pages of {} keys, a pool of {})\n", p.batch, p.pages_per_entry(), p.page_size, p.num_pages);
    fmt::print("  seq_lens [{}] = {}\n", p.batch, fmt::join(f.data.seq_lens, ", "));
  }
  if (p.mask.present) {
    auto hidden = std::count(f.data.mask.begin(), f.data.mask.end(), 0);
    fmt::print("  mask [{}, {}, {}, {}], {} of {} hidden\n", p.mask.batch, p.mask.heads, p.mask.rows, p.seq_k, hidden,
               f.data.mask.size());
  }
  if (p.bias.present) {
    auto neg_inf = std::count_if(f.data.bias.begin(), f.data.bias.end(), [](double x) { return std::isinf(x); });
    fmt::print("  bias [{}, {}, {}, {}], {} entries -inf\n", p.bias.batch, p.bias.heads, p.bias.rows, p.seq_k, neg_inf);
  }
  if (p.kv_len) fmt::print("  kv_len [{}] = {}\n", p.batch, fmt::join(f.data.kv_len, ", "));
  fmt::print("  out  [{}, {}, {}, {}]\n", p.q_batch(), p.heads_q, p.seq_q, p.head_dim_v);
  if (f.lse) fmt::print("  lse  [{}, {}, {}]\n", p.q_batch(), p.heads_q, p.seq_q);

  const auto rows = static_cast<std::int64_t>(args.rows);
  fmt::print("\nout[0, 0] (first {} rows, first 8 columns)\n", rows);
  print_matrix(f.out, p.seq_q, p.head_dim_v, rows, 8);
  if (f.lse) {
    fmt::print("lse[0, 0]\n");
    print_matrix(*f.lse, 1, p.seq_q, 1, 8);
  }
  if (p.seq_k > 0 && p.seq_q > 0) {
    fmt::print("\nattention weights [0, 0] (queries down, keys across; '-' = hidden; attn show for other heads)\n");
    fmt::print("{}", format_weights_table(reference_weights_view(f.data, 0, 0), 16, 16));
  }
  return 0;
}

int list(const FixturesArgs& args) {
  std::vector<std::filesystem::path> roots(args.paths.begin(), args.paths.end());
  if (roots.empty()) roots.emplace_back(default_fixtures());
  std::set<std::string> known;
  int shown = 0;
  for (const auto& file : find_fixture_files(roots)) {
    FixtureHeader h = read_fixture_header(file);
    const std::vector<std::string> tags = h.all_tags();
    known.insert(tags.begin(), tags.end());
    if (!args.tags.empty() &&
        std::none_of(args.tags.begin(), args.tags.end(), [&](const std::string& t) { return h.has_tag(t); })) {
      continue;
    }
    fmt::print("{:<44} {:<12} {}\n", h.name, fmt::format("{}", fmt::join(h.tags, ",")), h.problem.to_string());
    ++shown;
  }
  if (shown == 0) {
    throw Error(fmt::format("no fixture has any of the tags {}; the tags there are: {}", fmt::join(args.tags, ","),
                            fmt::join(known, ", ")));
  }
  return 0;
}

}  // namespace

Runner add_fixtures_command(CLI::App& app) {
  auto args = std::make_shared<FixturesArgs>();
  CLI::App* cmd = app.add_subcommand("fixtures", "Generate, list and inspect golden fixtures");
  cmd->require_subcommand(1);
  CLI::App* gen = cmd->add_subcommand("generate", "Write the standard suite (deterministic, bit-identical)");
  gen->add_option("--out", args->out, "Output folder")->required();
  gen->add_option("-t,--tag", args->tags, "Only cases that have any of these tags, e.g. --tag smoke,edge")
      ->allow_extra_args(false)
      ->delimiter(',');
  gen->add_option("--match", args->match, "Only cases whose name contains this text");
  gen->add_flag("--replace", args->replace,
                "Write into a folder that already holds files (for the whole suite, remove the .h5 files it no longer has)");
  CLI::App* sh = cmd->add_subcommand("show", "Print a fixture: attributes, shapes, output rows, weights");
  sh->add_option("file", args->file, "Fixture file")->required();
  sh->add_option("--rows", args->rows, "Output rows to print")->check(CLI::PositiveNumber);
  CLI::App* ls = cmd->add_subcommand("list", "List fixtures with their tags and problem strings");
  ls->add_option("paths", args->paths, "Files or folders (default: the standard fixtures, " + default_fixtures() + ")");
  ls->add_option("-t,--tag", args->tags, "Only fixtures that have any of these tags, e.g. --tag smoke,edge")
      ->allow_extra_args(false)
      ->delimiter(',');
  return [args, gen, sh, ls]() {
    if (gen->parsed()) return generate(*args);
    if (sh->parsed()) return show(*args);
    if (ls->parsed()) return list(*args);
    return 2;
  };
}

}  // namespace attn::cli
