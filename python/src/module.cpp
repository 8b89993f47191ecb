// _attnbench: the C++ verifier inside a Python process. The package around it
// (python/attnbench/) turns a user's kernel into a Python backend object; the
// verdicts come from the same attn::verify, report writers and exit rule as
// `attn verify`, so they cannot differ from the command line's.
#include <pybind11/pybind11.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "attnbench/error.hpp"
#include "core/registry.hpp"
#include "fixtures/fixture.hpp"
#include "impls/python/objects.hpp"
#include "verify/exit_code.hpp"
#include "verify/report.hpp"
#include "verify/verifier.hpp"

namespace py = pybind11;
namespace fs = std::filesystem;

namespace {

using namespace attn;

// The standard fixtures: inside the package (a wheel from pip install .),
// installed beside it (cmake --install: <prefix>/lib/pythonX.Y/dist-packages/
// attnbench -> <prefix>/share/attnbench/fixtures/golden), else the source tree
// this module was built from.
std::string default_fixtures(const std::string& package_dir) {
  std::error_code ec;
  const fs::path package(package_dir);
  if (fs::is_directory(package / "fixtures", ec)) return (package / "fixtures").string();
  fs::path installed = package.parent_path().parent_path().parent_path().parent_path() / "share" / "attnbench" /
                       "fixtures" / "golden";
  if (fs::is_directory(installed, ec)) return installed.string();
  return ATTN_DEFAULT_FIXTURES;
}

// The attn a reproduce command names: installed beside the package
// (<prefix>/bin/attn), else the one built with this module, else attn on the PATH.
std::string attn_command(const std::string& package_dir) {
  std::error_code ec;
  const fs::path package(package_dir);
  fs::path installed = package.parent_path().parent_path().parent_path().parent_path() / "bin" / "attn";
  if (fs::is_regular_file(installed, ec)) return installed.string();
  if (fs::is_regular_file(ATTN_BUILT_ATTN, ec)) return ATTN_BUILT_ATTN;
  return "attn";
}

std::vector<fs::path> roots_of(const std::vector<std::string>& paths) { return {paths.begin(), paths.end()}; }

// What a case asks of a kernel beyond plain attention, by name (the names
// attnbench.kernel's `features` uses): the masking ones, GQA, and the format
// version 2 additions.
std::vector<std::string> feature_list(const Problem& p) {
  std::vector<std::string> f;
  if (p.mask.present) f.emplace_back("mask");
  if (p.bias.present) f.emplace_back("bias");
  if (p.kv_len) f.emplace_back("kv_len");
  if (p.causal != Causal::none) f.emplace_back("causal");
  if (p.heads_kv != p.heads_q) f.emplace_back("gqa");
  const unsigned v2 = p.features();
  if (v2 & kFeatureWindow) f.emplace_back("window");
  if (v2 & kFeatureSoftcap) f.emplace_back("softcap");
  if (v2 & kFeatureAlibi) f.emplace_back("alibi");
  if (v2 & kFeatureSinks) f.emplace_back("sinks");
  if (v2 & kFeatureRagged) f.emplace_back("ragged");
  if (v2 & kFeaturePaged) f.emplace_back("paged");
  return f;
}

py::list fixtures(const std::vector<std::string>& paths, const std::vector<std::string>& tags) {
  py::list out;
  for (const fs::path& file : find_fixture_files(roots_of(paths))) {
    const FixtureHeader h = read_fixture_header(file);
    bool keep = tags.empty();
    for (const std::string& t : tags) keep = keep || h.has_tag(t);
    if (!keep) continue;
    py::dict d;
    d["path"] = file.string();
    d["name"] = h.name;
    d["description"] = h.description;
    d["tags"] = h.all_tags();
    d["kind"] = h.kind == FixtureKind::mha ? "layer" : "sdpa";
    d["format_version"] = h.format_version;
    d["gradients"] = h.gradients;
    d["problem"] = python::problem_object(h.problem);  // as a backend sees it
    d["features"] = feature_list(h.problem);
    out.append(d);
  }
  return out;
}

template <typename T> py::array_t<T> array(const std::vector<T>& values, std::vector<py::ssize_t> shape) {
  py::array_t<T> a(shape);
  std::copy(values.begin(), values.end(), a.mutable_data());
  return a;
}

// A case's inputs and goldens as exact float64 arrays in the canonical
// [batch, heads, seq, dim] order (mask as bool), for users who build their own calls.
py::dict inputs(const std::string& path) {
  const Fixture f = read_fixture(path);
  const Problem& p = f.problem();
  auto ss = [](std::int64_t x) { return static_cast<py::ssize_t>(x); };
  py::dict d;
  d["q"] = array(f.data.q, {ss(p.q_batch()), ss(p.heads_q), ss(p.seq_q), ss(p.head_dim)});
  d["k"] = array(f.data.k, {ss(p.kv_batch()), ss(p.heads_kv), ss(p.kv_seq()), ss(p.head_dim)});
  d["v"] = array(f.data.v, {ss(p.kv_batch()), ss(p.heads_kv), ss(p.kv_seq()), ss(p.head_dim_v)});
  d["out"] = array(f.out, {ss(p.q_batch()), ss(p.heads_q), ss(p.seq_q), ss(p.head_dim_v)});
  d["mask"] = py::none(), d["bias"] = py::none(), d["kv_len"] = py::none(), d["lse"] = py::none();
  if (p.mask.present) {
    py::array_t<bool> m({ss(p.mask.batch), ss(p.mask.heads), ss(p.mask.rows), ss(p.seq_k)});
    for (std::size_t e = 0; e < f.data.mask.size(); ++e) m.mutable_data()[e] = f.data.mask[e] != 0;
    d["mask"] = m;
  }
  if (p.bias.present) d["bias"] = array(f.data.bias, {ss(p.bias.batch), ss(p.bias.heads), ss(p.bias.rows), ss(p.seq_k)});
  if (p.kv_len) d["kv_len"] = array(f.data.kv_len, {ss(p.batch)});
  if (f.lse) d["lse"] = array(*f.lse, {ss(p.q_batch()), ss(p.heads_q), ss(p.seq_q)});
  if (f.gradients) {
    d["dout"] = array(f.gradients->dout, {ss(p.q_batch()), ss(p.heads_q), ss(p.seq_q), ss(p.head_dim_v)});
    d["dq"] = array(f.gradients->dq, {ss(p.q_batch()), ss(p.heads_q), ss(p.seq_q), ss(p.head_dim)});
    d["dk"] = array(f.gradients->dk, {ss(p.kv_batch()), ss(p.heads_kv), ss(p.kv_seq()), ss(p.head_dim)});
    d["dv"] = array(f.gradients->dv, {ss(p.kv_batch()), ss(p.heads_kv), ss(p.kv_seq()), ss(p.head_dim_v)});
  }
  return d;
}

// attn verify over `paths` for each backend (a built-in name, or a Python
// backend object): the JSON it writes (schemas/verify.schema.json) and its
// exit code, and each result's reproduce command.
py::dict run_verify(const std::vector<std::string>& paths, const py::list& backends, const std::vector<int>& threads, const std::vector<std::string>& layouts,
                    const std::vector<std::string>& directions, const std::string& junit, const std::string& attn_command) {
  std::vector<std::unique_ptr<Backend>> made;
  for (py::handle b : backends) {
    if (py::isinstance<py::str>(b)) {
      const std::vector<std::string> name{py::str(b)};
      for (auto& backend : make_backends(name)) made.push_back(std::move(backend));
    } else {
      made.push_back(python::make_python_backend_from_object(py::reinterpret_borrow<py::object>(b)));
    }
  }
  const std::vector<fs::path> files = find_fixture_files(roots_of(paths));
  if (files.empty()) throw Error("no fixture files (*.h5, *.hdf5) in the paths given");
  VerifyOptions options;
  options.thread_counts = threads;
  for (const std::string& l : layouts) {
    if (l != "bhsd" && l != "bshd") throw Error(fmt::format("layout '{}' is neither bhsd nor bshd", l));
    options.layouts.push_back(l == "bshd" ? Layout::bshd : Layout::bhsd);
  }
  if (!directions.empty()) {
    options.forward = std::find(directions.begin(), directions.end(), "forward") != directions.end();
    options.backward = std::find(directions.begin(), directions.end(), "backward") != directions.end();
  }
  VerifySummary summary;
  {
    py::gil_scoped_release release;  // the Python backends take the GIL for each call
    summary = verify(files, made, options);
  }
  RunInfo run = this_run(ATTN_VERSION, ATTN_GIT_COMMIT);
  describe_run(run, options, made);
  if (!junit.empty()) write_junit(summary, junit, attn_command, run);
  const ExitDecision exit = verification_exit(summary, {});
  // Each result's reproduce command, in the JSON's order (attn verify prints them for failures).
  py::list reproduce;
  for (const CaseOutcome& o : summary.outcomes) reproduce.append(reproduce_command(o, attn_command));
  py::dict result;
  result["json"] = verify_json(summary, run);  // attn verify's JSON
  result["reproduce"] = reproduce;
  result["exit_code"] = exit.code;
  result["why"] = exit.why;
  return result;
}

}  // namespace

PYBIND11_MODULE(_attnbench, m) {
  m.doc() = "attnbench's verifier (C++), for the attnbench package";
  m.attr("__version__") = ATTN_VERSION;
  m.def("default_fixtures", &default_fixtures, py::arg("package_dir"));
  m.def("attn_command", &attn_command, py::arg("package_dir"));
  m.def("fixtures", &fixtures, py::arg("paths"), py::arg("tags"));
  m.def("inputs", &inputs, py::arg("path"));
  m.def("backends", [] {
    std::vector<std::string> names;
    for (const auto& b : make_backends()) names.emplace_back(b->name());
    return names;
  });
  // The verdicts from the one that outranks every other (verify/compare.hpp).
  std::vector<std::string> severity;
  for (Verdict v : kVerdictSeverity) severity.emplace_back(verdict_name(v));
  m.attr("VERDICT_SEVERITY") = severity;
  m.def("verify", &run_verify, py::arg("paths"), py::arg("backends"), py::arg("threads"),
        py::arg("layouts"), py::arg("directions"), py::arg("junit"), py::arg("attn_command"));
  // attnbench's own errors reach Python as ValueError (bad input) or RuntimeError.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InputError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });
}
