#include "verify/recorded.hpp"

#include <fmt/format.h>

#include "attnbench/error.hpp"
#include "core/sandbox.hpp"
#include "core/text.hpp"
#include "fixtures/h5.hpp"

namespace attn {

namespace {

std::string dims_text(const std::vector<std::int64_t>& dims) { return fmt::format("[{}]", fmt::join(dims, ", ")); }

RecordedOutput read_file(const std::filesystem::path& file, const std::string& dataset,
                         const std::vector<std::int64_t>& dims) {
  const std::string shown = printable(file.string());
  h5::File f = h5::File::open_read(file);
  auto info = f.dataset_info(dataset);
  if (!info) throw InputError(fmt::format("{}: holds no `{}` dataset (an outputs file holds `{}`{})", shown, dataset, dataset,
                                          dataset == "out" ? " and optionally `lse`" : ""));
  if (info->kind != h5::DatasetInfo::Kind::floating) {
    throw InputError(fmt::format("{}: `{}` is {}, not floating point", shown, dataset, info->type_text));
  }
  if (info->dims != dims) {
    throw InputError(fmt::format("{}: `{}` has shape {}, but the fixture's is {}", shown, dataset, dims_text(info->dims),
                                 dims_text(dims)));
  }
  std::int64_t count = 1;
  for (std::int64_t d : dims) count *= d;
  RecordedOutput r;
  r.values = f.read_doubles(dataset, count);
  if (dataset == "out") {
    if (auto lse = f.dataset_info("lse")) {
      std::vector<std::int64_t> lse_dims(dims.begin(), dims.end() - 1);
      if (lse->kind != h5::DatasetInfo::Kind::floating || lse->dims != lse_dims) {
        throw InputError(fmt::format("{}: `lse` is {} of shape {}, but must be floating point of shape {}", shown,
                                     lse->type_text, dims_text(lse->dims), dims_text(lse_dims)));
      }
      r.lse = f.read_doubles("lse", count / dims.back());
    }
  }
  f.check_unchanged();
  return r;
}

// Every gradient of `wanted`, or none (false).
bool read_gradient_file(const std::filesystem::path& file, std::vector<RecordedGradient>& wanted) {
  const std::string shown = printable(file.string());
  h5::File f = h5::File::open_read(file);
  std::vector<std::string> missing;
  for (const RecordedGradient& g : wanted) {
    if (!f.dataset_info(g.name)) missing.push_back(g.name);
  }
  if (missing.size() == wanted.size()) return false;
  if (!missing.empty()) {
    throw InputError(fmt::format("{}: holds some gradients but not {} (a backward outputs file holds every gradient of its case)",
                                 shown, fmt::join(missing, ", ")));
  }
  for (RecordedGradient& g : wanted) {
    auto info = f.dataset_info(g.name);
    if (info->kind != h5::DatasetInfo::Kind::floating) {
      throw InputError(fmt::format("{}: `{}` is {}, not floating point", shown, g.name, info->type_text));
    }
    if (info->dims != g.dims) {
      throw InputError(fmt::format("{}: `{}` has shape {}, but the fixture's is {}", shown, g.name, dims_text(info->dims),
                                   dims_text(g.dims)));
    }
    std::int64_t count = 1;
    for (std::int64_t d : g.dims) count *= d;
    g.values = f.read_doubles(g.name, count);
  }
  f.check_unchanged();
  return true;
}

// Whether the file exists; when it does, `read` is run once in the sandbox
// first (a damaged file may crash or hang libhdf5), its trouble an
// InputError naming the file.
template <typename Read>
bool sandbox_checked(const std::filesystem::path& file, Read read) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(file, ec))) return false;
  const std::string trouble = run_sandboxed(read, SandboxLimits::from_environment());
  if (!trouble.empty()) {
    const std::string shown = printable(file.string());
    throw InputError(trouble.rfind(file.string() + ":", 0) == 0 ? printable(trouble)
                                                                 : fmt::format("{}: reading it {}", shown, trouble));
  }
  return true;
}

}  // namespace

bool RecordedOutputs::read_gradients(const std::string& fixture_name, std::vector<RecordedGradient>& wanted) const {
  const std::filesystem::path file = file_for(fixture_name);
  if (!sandbox_checked(file, [&] {
        std::vector<RecordedGradient> copy = wanted;
        (void)read_gradient_file(file, copy);
      })) {
    return false;
  }
  return read_gradient_file(file, wanted);
}

RecordedOutputs::RecordedOutputs(std::filesystem::path dir, std::string name)
    : dir_(std::move(dir)),
      name_(std::move(name)),
      description_(fmt::format("results recorded by another tool in {}", printable(dir_.string()))) {}

std::unique_ptr<Plan> RecordedOutputs::prepare(const Problem&, const AttentionIO&, const RunOptions&) const {
  throw Error("recorded outputs are read, not run");
}

std::string RecordedOutputs::arguments() const {
  // Absolute, like the fixture's path: the command runs from any folder.
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::absolute(dir_, ec);
  return fmt::format(" --outputs {} --outputs-name {}", shell_quote((ec ? dir_ : dir).string()), shell_quote(name_));
}

std::filesystem::path RecordedOutputs::file_for(const std::string& fixture_name) const {
  // The name comes from an untrusted fixture: it may only name a file inside
  // the folder, never one elsewhere.
  const std::filesystem::path relative(fixture_name);
  bool ok = !fixture_name.empty() && fixture_name.size() <= 512 && relative.is_relative() &&
            valid_utf8(fixture_name) == fixture_name;
  for (const auto& part : relative) {
    ok = ok && part != ".." && part != "." && !part.empty();
  }
  for (unsigned char c : fixture_name) ok = ok && c >= 0x20 && c != 0x7f && c != '\\';
  if (!ok) {
    throw InputError(fmt::format("fixture name '{}' cannot name an output file inside {} (it is empty, absolute, "
                                 "has '.' or '..' parts or control bytes)",
                                 printable(fixture_name), printable(dir_.string())));
  }
  return dir_ / (fixture_name + ".h5");
}

std::optional<RecordedOutput> RecordedOutputs::read(const std::string& fixture_name, const std::string& dataset,
                                                    const std::vector<std::int64_t>& dims) const {
  const std::filesystem::path file = file_for(fixture_name);
  if (!sandbox_checked(file, [&] { (void)read_file(file, dataset, dims); })) return std::nullopt;
  return read_file(file, dataset, dims);
}

}  // namespace attn
