#include "impls/python/bridge.hpp"
#include "impls/python/objects.hpp"

// pybind11 first: Python.h must precede the standard headers.
#include <pybind11/embed.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <fmt/format.h>
#include <unistd.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <cfenv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "attnbench/error.hpp"
#include "core/extensions.hpp"
#include "core/float_state.hpp"
#include "core/layer_data.hpp"
#include "core/text.hpp"

namespace py = pybind11;
namespace fs = std::filesystem;

namespace attn::python {

namespace {

// The folder of the built-in adapters: installed beside attn
// (<prefix>/share/attnbench/python) or, in a build tree, the sources.
fs::path backends_folder() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path installed = exe.parent_path().parent_path() / "share" / "attnbench" / "python";
    if (fs::exists(installed / "attn_common.py", ec)) return installed;
  }
  return ATTN_PYTHON_SOURCE_BACKENDS;
}

// The folder that holds the attnbench Python package, so that a backend file
// can `import attnbench` (the embedded interpreter ignores PYTHONPATH):
// installed (<prefix>/ATTN_PYTHON_INSTALL_DIR), else this build's.
fs::path package_folder() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path installed = exe.parent_path().parent_path() / ATTN_PYTHON_INSTALL_DIR;
    if (fs::exists(installed / "attnbench" / "__init__.py", ec)) return installed;
  }
  return ATTN_PYTHON_PACKAGE_BUILD_DIR;
}

// The last line of a Python error (its type and message), for a verdict.
std::string python_error(const py::error_already_set& e) {
  std::string text = e.what();
  // pybind11 appends the traceback after "\n\nAt:", innermost frame first
  // ("  /path/file.py(123): function"): a verdict keeps the message and where
  // it was raised.
  std::string where;
  if (auto at = text.find("\n\nAt:"); at != std::string::npos) {
    std::string frames = text.substr(at + 5);
    text.resize(at);
    std::size_t start = frames.find_first_not_of(" \n");
    if (start != std::string::npos) where = frames.substr(start, frames.find('\n', start) - start);
  }
  for (char& c : text) {
    if (c == '\n') c = ' ';
  }
  if (!where.empty()) text += " (at " + where + ")";
  return printable(text);
}

// A Python kernel that ran out of memory (NumPy's and JAX's MemoryError,
// PyTorch's OutOfMemoryError or its CPU allocator's refusal) gave no answer,
// which is not a wrong one: Unsupported, so the verdict is SKIP with the
// reason, as for a std::bad_alloc in a C++ backend. Any other error is an
// Error, a FAIL that names it.
[[noreturn]] void throw_python_failure(const py::error_already_set& e, const std::string& context) {
  const std::string message = python_error(e);
  const py::handle type = e.type();
  const std::string type_name = type ? py::str(type.attr("__name__")).cast<std::string>() : std::string();
  if (e.matches(PyExc_MemoryError) || type_name == "OutOfMemoryError" ||
      message.find("DefaultCPUAllocator: can't allocate memory") != std::string::npos) {
    throw Unsupported(fmt::format("{}: ran out of memory on this case: {}", context, message));
  }
  throw Error(fmt::format("{}: {}", context, message));
}

// A "key = value" line of the venv's pyvenv.cfg, or "" when it has none.
std::string venv_setting(const fs::path& venv, std::string_view wanted) {
  std::ifstream cfg(venv / "pyvenv.cfg");
  std::string line;
  while (std::getline(cfg, line)) {
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string key = line.substr(0, eq);
    while (!key.empty() && key.back() == ' ') key.pop_back();
    if (key == wanted) {
      std::string value = line.substr(eq + 1);
      while (!value.empty() && value.front() == ' ') value.erase(value.begin());
      return value;
    }
  }
  return {};
}

// One embedded interpreter per process, started on first use and never
// finalised (frameworks such as TensorFlow do not survive finalisation). The
// GIL is released after start; every call below takes it.
class Runtime {
 public:
  static Runtime& get() {
    static Runtime* runtime = new Runtime();  // never destroyed: Python outlives every static
    return *runtime;
  }
  const Status& status() {
    std::call_once(once_, [this] { start(); });
    return status_;
  }
  py::object& common() { return *common_; }

 private:
  void start() {
    if (Py_IsInitialized()) {  // inside a Python process (the attnbench module): nothing to start or to add
      py::gil_scoped_acquire gil;
      try {
        py::module_::import("numpy");
      } catch (const py::error_already_set& e) {
        status_ = Status::no(fmt::format("numpy cannot be imported: {}", python_error(e)));
      }
      return;
    }
    fs::path venv;
    if (const char* v = std::getenv("ATTN_PYTHON_VENV"); v != nullptr && *v != '\0') {
      venv = v;
      std::error_code ec;
      if (!fs::is_directory(venv, ec)) {
        status_ = Status::no(fmt::format("ATTN_PYTHON_VENV={} is not a folder", printable(venv.string())));
        return;
      }
      std::string version = venv_setting(venv, "version");
      if (version.empty()) version = venv_setting(venv, "version_info");
      if (version.rfind(ATTN_PYTHON_VERSION ".", 0) != 0 && version != ATTN_PYTHON_VERSION) {
        status_ = Status::no(fmt::format("the virtual environment {} is for Python {}, but attn embeds Python {} "
                                         "(make it with /usr/bin/python3 -m venv, or scripts/install-python-peers)",
                                         printable(venv.string()), version.empty() ? "(unknown)" : version,
                                         ATTN_PYTHON_VERSION));
        return;
      }
    }
    PyConfig config;
    PyConfig_InitIsolatedConfig(&config);  // ignores PYTHONPATH and friends: the same interpreter everywhere
    config.install_signal_handlers = 0;    // Ctrl-C stays attn's
    config.parse_argv = 0;
    const char* home = std::getenv("ATTN_PYTHON_HOME");
    std::string home_text = home != nullptr && *home != '\0' ? home : ATTN_PYTHON_HOME;
    PyStatus st = PyConfig_SetBytesString(&config, &config.home, home_text.c_str());
    if (!PyStatus_Exception(st)) st = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(st)) {
      status_ = Status::no(fmt::format("the embedded Python {} did not start (home {}): {}", ATTN_PYTHON_VERSION,
                                       home_text, st.err_msg ? st.err_msg : "unknown error"));
      return;
    }
    try {
      py::module_ sys = py::module_::import("sys");
      py::list path = sys.attr("path");
      if (!venv.empty()) {
        // As the venv's own python would: its site-packages, and the system's
        // packages only when it was made with --system-site-packages (Debian's
        // scipy, built for numpy 1, must not meet the venv's numpy 2).
        fs::path site = venv / "lib" / ("python" ATTN_PYTHON_VERSION) / "site-packages";
        const bool system_site = venv_setting(venv, "include-system-site-packages") == "true";
        py::list kept;
        for (py::handle entry : path) {
          std::string text = py::str(entry);
          const bool site_dir = text.find("-packages") != std::string::npos;
          if (system_site || !site_dir) kept.append(entry);
        }
        path.attr("clear")();
        for (py::handle entry : kept) path.append(entry);
        py::module_::import("site").attr("addsitedir")(site.string());
        // addsitedir appends; the venv comes first.
        py::list moved, rest;
        for (py::handle entry : path) {
          std::string text = py::str(entry);
          (text.rfind(venv.string(), 0) == 0 ? moved : rest).append(entry);
        }
        path.attr("clear")();
        for (py::handle entry : moved) path.append(entry);
        for (py::handle entry : rest) path.append(entry);
      }
      path.insert(0, backends_folder().string());
      path.append(package_folder().string());
      // attn holds its own libhdf5; an h5py in this process (a wheel bundles
      // another libhdf5) would resolve HDF5 symbols against attn's and fail
      // in odd ways ("Not a datatype"). Backends receive their inputs from
      // attn, so `import h5py` raises ImportError, which the frameworks accept.
      sys.attr("modules")["h5py"] = py::none();
      common_ = new py::object(py::module_::import("attn_common"));
#if defined(__SANITIZE_ADDRESS__)
      common_->attr("SANITIZED") = true;
#endif
      py::module_::import("numpy");
    } catch (const py::error_already_set& e) {
      status_ = Status::no(fmt::format("the embedded Python cannot import what every Python backend needs: {}",
                                       python_error(e)));
    }
    PyEval_SaveThread();
  }

  std::once_flag once_;
  Status status_;
  py::object* common_ = nullptr;  // never destroyed, like the interpreter
};

py::object numpy_dtype(DType dtype) {
  switch (dtype) {
    case DType::f64: return py::dtype::of<double>();
    case DType::f32: return py::dtype::of<float>();
    case DType::f16: return py::dtype("float16");
    case DType::bf16: return py::dtype::of<std::uint16_t>();  // raw bits; attn_common views them
  }
  return py::none();
}

// A zero-copy numpy view; `base` keeps numpy from copying and owns nothing.
py::array view(const void* data, const py::object& dtype, const std::vector<py::ssize_t>& shape,
               const std::vector<py::ssize_t>& element_strides, std::size_t element_size, bool writeable) {
  std::vector<py::ssize_t> strides;
  for (py::ssize_t s : element_strides) strides.push_back(s * static_cast<py::ssize_t>(element_size));
  static const char marker = 0;
  py::capsule base(&marker, [](void*) {});
  py::array array(py::dtype::from_args(dtype), shape, strides, data == nullptr ? &marker : data, base);
  if (!writeable) array.attr("setflags")(py::arg("write") = false);
  return array;
}

std::vector<py::ssize_t> dims(std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
  return {static_cast<py::ssize_t>(a), static_cast<py::ssize_t>(b), static_cast<py::ssize_t>(c),
          static_cast<py::ssize_t>(d)};
}
std::vector<py::ssize_t> dims(const Dims4& d) { return dims(d[0], d[1], d[2], d[3]); }


// Frameworks change the calling thread's floating-point state (TensorFlow
// sets flush-to-zero and denormals-are-zero): every call into Python runs
// inside a FloatStateGuard (core/float_state.hpp), so no other backend of the
// same run computes under it.

// A new numpy array holding a copy of `values` in `shape` (the layer's inputs are small).
template <typename T>
py::array_t<T> copied(const std::vector<T>& values, std::vector<py::ssize_t> shape) {
  py::array_t<T> array(shape);
  py::ssize_t n = 1;
  for (py::ssize_t d : shape) n *= d;
  if (static_cast<std::size_t>(n) != values.size()) {
    throw Error(fmt::format("internal: {} values for a shape of {} elements", values.size(), n));
  }
  std::copy(values.begin(), values.end(), array.mutable_data());
  return array;
}

// A Python run() behind a plan (Plan or BackwardPlan), with the views it reads.
template <typename Base>
class PythonRun : public Base {
 public:
  PythonRun(py::object run, py::object io, std::string name) : run_(std::move(run)), io_(std::move(io)), name_(std::move(name)) {}
  ~PythonRun() override {
    py::gil_scoped_acquire gil;
    run_ = py::object();
    io_ = py::object();
  }
  void run() override {
    FloatStateGuard floats;
    py::gil_scoped_acquire gil;
    try {
      run_();
    } catch (py::error_already_set& e) {
      throw_python_failure(e, name_);
    }
  }

 protected:
  const py::object& run_object() const { return run_; }

 private:
  py::object run_;
  py::object io_;  // the views, alive as long as the plan
  std::string name_;
};

// A forward plan. A run() whose results stay on a device (a torch kernel on
// "cuda") carries two attributes: read_output() brings them to attnbench's
// buffers once, after the runs, and run_timed() times the kernel alone on
// the device's clock, so that no benchmark counts the copies.
class PythonPlan final : public PythonRun<Plan> {
 public:
  PythonPlan(py::object run, py::object io, bool has_lse, std::string name)
      : PythonRun<Plan>(std::move(run), std::move(io), name), has_lse_(has_lse), name_(std::move(name)) {
    read_output_ = optional_attribute("read_output");
    run_timed_ = optional_attribute("run_timed");
  }
  ~PythonPlan() override {
    py::gil_scoped_acquire gil;
    read_output_ = py::object();
    run_timed_ = py::object();
  }
  bool has_lse() const override { return has_lse_; }
  void read_output() override {
    if (read_output_) call(read_output_, "read_output");
  }
  double run_timed() override {
    if (!run_timed_) return Plan::run_timed();
    return call(run_timed_, "run_timed");
  }

 private:
  py::object optional_attribute(const char* attribute) {
    py::gil_scoped_acquire gil;
    return py::hasattr(run_object(), attribute) ? py::object(run_object().attr(attribute)) : py::object();
  }
  // f(), its result as seconds (0 for None), every Python object released under the GIL.
  double call(const py::object& f, const char* what) {
    FloatStateGuard floats;
    py::gil_scoped_acquire gil;
    try {
      py::object result = f();
      if (result.is_none()) return 0;
      try {
        return result.cast<double>();
      } catch (const py::cast_error&) {
        throw Error(fmt::format("{}: {}() returned {}, not seconds", name_, what,
                                printable(std::string(py::str(result)))));
      }
    } catch (py::error_already_set& e) {
      throw_python_failure(e, fmt::format("{}: {}() failed", name_, what));
    }
  }

  bool has_lse_;
  std::string name_;
  py::object read_output_, run_timed_;
};

// A quantised tensor's codes and what dequantises them as read-only numpy
// views (attn_common.py documents them), or None.
py::object codes_views(const Problem& p, const TensorView& t, const QuantView& q) {
  if (q.empty()) return py::none();
  auto ss = [](std::int64_t x) { return static_cast<py::ssize_t>(x); };
  const std::int64_t row_bytes = encoded_row_bytes(q.encoding, q.dim);
  const std::int64_t groups = q.group > 0 ? (q.dim + q.group - 1) / q.group : 1;
  py::dict d;
  d["codes"] = view(q.codes, py::dtype::of<std::uint8_t>(), dims(t.shape[0], t.shape[1], t.shape[2], row_bytes),
                    dims(q.strides[0], q.strides[1], q.strides[2], 1), 1, false);
  const std::vector<py::ssize_t> scale_shape = dims(t.shape[0], t.shape[1], t.shape[2], groups);
  const std::vector<py::ssize_t> scale_strides = dims(q.scale_strides[0], q.scale_strides[1], q.scale_strides[2], 1);
  d["scale"] = q.scale ? py::object(view(q.scale, py::dtype::of<float>(), scale_shape, scale_strides, sizeof(float), false))
                       : py::object(py::none());
  d["zero_point"] = q.zero_point ? py::object(view(q.zero_point, py::dtype::of<std::int32_t>(), scale_shape, scale_strides,
                                                   sizeof(std::int32_t), false))
                                 : py::object(py::none());
  d["descale"] = q.descale ? py::object(view(q.descale, py::dtype::of<float>(), {ss(p.batch), ss(p.heads_kv)},
                                             {ss(q.descale_batch_stride), ss(q.descale_head_stride)}, sizeof(float), false))
                           : py::object(py::none());
  d["group"] = q.group > 0 ? q.group : q.dim;
  return py::module_::import("types").attr("SimpleNamespace")(**d);
}

// The forward's inputs as numpy views (attn_common.py documents them); `out`
// writeable for the forward, read-only for the backward.
py::dict input_views(const Problem& p, const AttentionIO& io, bool out_writeable, bool with_lse) {
  const std::size_t elem = dtype_size(p.dtype);
  py::object dt = numpy_dtype(p.dtype);
  py::dict views;
  // A quantised tensor (format version 4) has no values: None, and its codes.
  auto values = [&](const TensorView& t, const QuantView& codes) -> py::object {
    if (!codes.empty()) return py::none();
    return view(t.data, dt, dims(t.shape), dims(t.strides), elem, false);
  };
  views["q"] = values(io.q, io.q_codes);
  views["k"] = values(io.k, io.k_codes);
  views["v"] = values(io.v, io.v_codes);
  views["q_codes"] = codes_views(p, io.q, io.q_codes);
  views["k_codes"] = codes_views(p, io.k, io.k_codes);
  views["v_codes"] = codes_views(p, io.v, io.v_codes);
  views["out"] = view(io.out.data, dt, dims(io.out.shape), dims(io.out.strides), elem, out_writeable);
  views["mask"] = py::none();
  if (!io.mask.empty()) {
    views["mask"] = view(io.mask.data, py::dtype::of<std::uint8_t>(), dims(p.batch, p.heads_q, p.seq_q, p.seq_k),
                         dims(io.mask.strides), 1, false);
  }
  views["bias"] = py::none();
  if (!io.bias.empty()) {
    views["bias"] = view(io.bias.data, dt, dims(p.batch, p.heads_q, p.seq_q, p.seq_k), dims(io.bias.strides), elem, false);
  }
  views["kv_len"] = py::none();
  if (io.kv_len != nullptr) {
    views["kv_len"] = view(io.kv_len, py::dtype::of<std::int64_t>(), {static_cast<py::ssize_t>(p.batch)}, {1},
                           sizeof(std::int64_t), false);
  }
  // Format version 2: ALiBi slopes and sinks [heads_q] (float32), cu_seqlens
  // [batch + 1], the page table [batch, pages per entry] and seq_lens [batch]
  // (int64), or None.
  auto vector = [&](const auto* data, const py::object& type, std::size_t size, std::int64_t n) -> py::object {
    if (data == nullptr) return py::none();
    return view(data, type, {static_cast<py::ssize_t>(n)}, {1}, size, false);
  };
  py::object f32 = py::dtype::of<float>(), i64 = py::dtype::of<std::int64_t>();
  views["alibi_slopes"] = vector(io.alibi_slopes, f32, sizeof(float), p.heads_q);
  views["sinks"] = vector(io.sinks, f32, sizeof(float), p.heads_q);
  views["cu_seqlens_q"] = vector(io.cu_seqlens_q, i64, sizeof(std::int64_t), p.batch + 1);
  views["cu_seqlens_k"] = vector(io.cu_seqlens_k, i64, sizeof(std::int64_t), p.batch + 1);
  views["seq_lens"] = vector(io.seq_lens, i64, sizeof(std::int64_t), p.batch);
  views["page_table"] = py::none();
  if (io.page_table != nullptr) {
    const auto pages = static_cast<py::ssize_t>(p.pages_per_entry());
    views["page_table"] = view(io.page_table, i64, {static_cast<py::ssize_t>(p.batch), pages}, {pages, 1},
                               sizeof(std::int64_t), false);
  }
  views["lse"] = py::none();
  if (io.lse != nullptr && with_lse) {
    views["lse"] = view(io.lse, py::dtype::of<double>(), {static_cast<py::ssize_t>(p.rows())}, {1}, sizeof(double),
                        out_writeable);
  }
  return views;
}

// DTYPES, optional: the dtypes a backend computes in (names as in the
// format); all four when absent.
unsigned declared_dtypes(const py::object& module) {
  if (!py::hasattr(module, "DTYPES")) return kAllDTypes;
  unsigned bits = 0;
  for (py::handle item : module.attr("DTYPES")) {
    const std::string name = py::str(item);
    const std::optional<DType> dtype = parse_dtype(name);
    if (!dtype) {
      throw Error(fmt::format("DTYPES names '{}', which is not a dtype (float64, float32, float16, bfloat16)",
                              printable(name)));
    }
    bits |= dtype_bit(*dtype);
  }
  return bits;
}

// FEATURES, optional: the format version 2 additions a backend implements
// (window, softcap, alibi, sinks, ragged, paged); none when absent.
unsigned declared_features(const py::object& module) {
  if (!py::hasattr(module, "FEATURES")) return 0;
  static const std::pair<const char*, unsigned> names[] = {{"window", kFeatureWindow}, {"softcap", kFeatureSoftcap},
                                                           {"alibi", kFeatureAlibi},   {"sinks", kFeatureSinks},
                                                           {"ragged", kFeatureRagged}, {"paged", kFeaturePaged}};
  unsigned bits = 0;
  for (py::handle item : module.attr("FEATURES")) {
    const std::string name = py::str(item);
    auto it = std::find_if(std::begin(names), std::end(names), [&](const auto& n) { return name == n.first; });
    if (it == std::end(names)) {
      throw Error(fmt::format("FEATURES names '{}', which is not a format version 2 addition (window, softcap, "
                              "alibi, sinks, ragged, paged)", printable(name)));
    }
    bits |= it->second;
  }
  return bits;
}

// ENCODINGS, optional: the quantised encodings (format version 4) a backend
// reads; none when absent.
unsigned declared_encodings(const py::object& module) {
  if (!py::hasattr(module, "ENCODINGS")) return 0;
  unsigned bits = 0;
  for (py::handle item : module.attr("ENCODINGS")) {
    const std::string name = py::str(item);
    const std::optional<Encoding> encoding = parse_encoding(name);
    if (!encoding || *encoding == Encoding::none) {
      throw Error(fmt::format("ENCODINGS names '{}', which is not an encoding ({})", printable(name),
                              encoding_names(kAllEncodings)));
    }
    bits |= encoding_bit(*encoding);
  }
  return bits;
}

// BITWISE_RELATIONS, optional: the metamorphic relations the backend keeps
// bit for bit (docs/verification/relations.md); none when absent.
unsigned declared_relations(const py::object& module) {
  if (!py::hasattr(module, "BITWISE_RELATIONS")) return 0;
  unsigned bits = 0;
  for (py::handle item : module.attr("BITWISE_RELATIONS")) {
    const std::string name = py::str(item);
    unsigned bit = 1;
    while (bit <= kAllRelations && relation_name(bit) != name) bit <<= 1;
    if (bit > kAllRelations) {
      throw Error(fmt::format("BITWISE_RELATIONS names '{}', which is not a relation ({})", printable(name),
                              relation_names(kAllRelations)));
    }
    bits |= bit;
  }
  return bits;
}

class PythonBackend final : public Backend, private BackendExtensions {
 public:
  PythonBackend(fs::path file, std::string fallback_name) : file_(std::move(file)), name_(std::move(fallback_name)) {
    const Status& runtime = Runtime::get().status();
    if (!runtime) {
      unavailable_ = runtime.reason;
      description_ = fmt::format("Python backend {}", file_.filename().string());
      return;
    }
    FloatStateGuard floats;
    py::gil_scoped_acquire gil;
    try {
      read_module(Runtime::get().common().attr("load_backend")(file_.string()));
    } catch (py::error_already_set& e) {
      unavailable_ = fmt::format("{} cannot be loaded: {}", printable(file_.string()), python_error(e));
      description_ = fmt::format("Python backend {}", file_.filename().string());
    } catch (const Error& e) {
      unavailable_ = fmt::format("{} cannot be loaded: {}", printable(file_.string()), e.what());
      description_ = fmt::format("Python backend {}", file_.filename().string());
    }
  }
  // A backend object of the same contract in a running interpreter (the
  // attnbench module); the caller holds the GIL.
  explicit PythonBackend(py::object module) {
    const Status& runtime = Runtime::get().status();
    if (!runtime) throw Error(runtime.reason);
    try {
      read_module(std::move(module));
    } catch (py::error_already_set& e) {
      throw Error(fmt::format("not a backend: {}", python_error(e)));
    }
  }
  ~PythonBackend() override {
    if (module_) {
      py::gil_scoped_acquire gil;
      module_.reset();
    }
  }

 private:
  void read_module(py::object module) {
    module_ = std::make_unique<py::object>(module);
    name_ = py::str(module.attr("NAME"));
    description_ = py::str(module.attr("DESCRIPTION"));
    dtypes_ = declared_dtypes(module);
    encodings_ = declared_encodings(module);
    features_ = declared_features(module);
    has_lse_ = py::hasattr(module, "HAS_LSE") && py::bool_(module.attr("HAS_LSE"));
    has_backward_ = py::hasattr(module, "prepare_backward");
    nondeterministic_dq_ = py::hasattr(module, "NONDETERMINISTIC_DQ") && py::bool_(module.attr("NONDETERMINISTIC_DQ"));
    uses_threads_ = !py::hasattr(module, "USES_THREADS") || py::bool_(module.attr("USES_THREADS"));
    if (py::hasattr(module, "THREAD_DEPENDENT_GRADIENTS")) {
      thread_dependent_ = py::str(module.attr("THREAD_DEPENDENT_GRADIENTS"));
    }
    runs_layers_ = py::hasattr(module, "layer");
    batch_invariant_ = py::hasattr(module, "BATCH_INVARIANT") && py::bool_(module.attr("BATCH_INVARIANT"));
    bitwise_relations_ = declared_relations(module);
  }

 public:
  std::string_view name() const override { return name_; }
  std::string_view description() const override { return description_; }
  Capabilities capabilities() const override {
    return {.dtypes = dtypes_,
            .features = features_,
            .lse = has_lse_,
            .backward = has_backward_,
            .nondeterministic_dq = nondeterministic_dq_,
            .uses_threads = uses_threads_,
            .encodings = encodings_,
            .batch_invariant = batch_invariant_,
            .bitwise_relations = bitwise_relations_};
  }
  const BackendExtensions* extensions() const override { return this; }
  std::string thread_dependent_gradients() const override { return thread_dependent_; }
  const std::string& load_error() const { return unavailable_; }

  Status available() const override {
    if (!unavailable_.empty()) return Status::no(unavailable_);
    FloatStateGuard floats;
    py::gil_scoped_acquire gil;
    try {
      py::object why = module_->attr("available")();
      if (why.is_none()) return Status::yes();
      return Status::no(printable(std::string(py::str(why))));
    } catch (py::error_already_set& e) {
      return Status::no(fmt::format("available() raised {}", python_error(e)));
    }
  }
  Status supports(const Problem& p) const override { return ask("supports", p); }
  // supports_backward(problem) -> None | str, optional: what its backward skips.
  Status supports_backward(const Problem& p) const override {
    if (!unavailable_.empty()) return Status::no(unavailable_);
    {
      py::gil_scoped_acquire gil;
      if (!py::hasattr(*module_, "supports_backward")) return Status::yes();
    }
    return ask("supports_backward", p);
  }
  std::vector<Convention> conventions(const Problem& p) const override {
    std::vector<Convention> result;
    if (!unavailable_.empty()) return result;
    py::gil_scoped_acquire gil;
    if (!py::hasattr(*module_, "conventions")) return result;
    py::object list;
    try {
      list = module_->attr("conventions")(problem_object(p));
    } catch (py::error_already_set& e) {
      throw Error(fmt::format("{}: conventions() raised {}", name_, python_error(e)));
    }
    for (py::handle item : list) {
      auto pair = item.cast<py::tuple>();
      std::string code = py::str(pair[0]);
      std::string why = printable(std::string(py::str(pair[1])));
      if (code == "empty_rows_mean_v") result.push_back({ConventionKind::empty_rows_mean_v, why});
      else if (code == "empty_rows_nan") result.push_back({ConventionKind::empty_rows_nan, why});
      else if (code == "empty_rows_unmasked") result.push_back({ConventionKind::empty_rows_unmasked, why});
      else throw Error(fmt::format("{}: conventions() names '{}', which attnbench does not know (known: "
                                   "empty_rows_mean_v, empty_rows_nan, empty_rows_unmasked)",
                                   name_, printable(code)));
    }
    return result;
  }
  bool runs_layers() const override { return runs_layers_; }
  // supports_layer(problem, model_dim), with kdim= and vdim= as keywords
  // only for a layer whose x_k or x_v width differs from model_dim (a
  // function written before them then says, by its TypeError, that it does
  // not know them: SKIP).
  Status supports_layer(const Problem& p, const LayerData& layer) const override {
    if (!unavailable_.empty()) return Status::no(unavailable_);
    FloatStateGuard floats;
    py::gil_scoped_acquire gil;
    const bool widths = layer.k_in() != layer.model_dim || layer.v_in() != layer.model_dim;
    try {
      if (!py::hasattr(*module_, "supports_layer")) return Status::yes();
      py::object fn = module_->attr("supports_layer");
      py::object why = widths ? fn(problem_object(p), layer.model_dim, py::arg("kdim") = layer.k_in(),
                                   py::arg("vdim") = layer.v_in())
                              : fn(problem_object(p), layer.model_dim);
      if (why.is_none()) return Status::yes();
      return Status::no(printable(std::string(py::str(why))));
    } catch (py::error_already_set& e) {
      if (widths && e.matches(PyExc_TypeError)) {
        return Status::no(fmt::format("supports_layer() takes no kdim/vdim, and this layer's x_k or x_v is not "
                                      "model_dim wide: {}", python_error(e)));
      }
      return Status::no(fmt::format("supports_layer() raised {}", python_error(e)));
    }
  }
  // The layer's inputs as the Python contract names them (a SimpleNamespace).
  static py::object layer_namespace(const LayerData& layer) {
    const Problem& p = layer.problem;
    auto array = [](const std::vector<double>& v, std::vector<py::ssize_t> shape) -> py::object {
      if (v.empty()) return py::none();
      return copied<double>(v, std::move(shape));
    };
    auto ss = [](std::int64_t x) { return static_cast<py::ssize_t>(x); };
      py::dict d;
      d["model_dim"] = layer.model_dim;
      d["kdim"] = layer.k_in();
      d["vdim"] = layer.v_in();
      d["x_q"] = array(layer.x_q, {ss(p.batch), ss(p.seq_q), ss(layer.model_dim)});
      d["x_k"] = array(layer.x_k, {ss(p.batch), ss(p.seq_k), ss(layer.k_in())});
      d["x_v"] = array(layer.x_v, {ss(p.batch), ss(p.seq_k), ss(layer.v_in())});
      d["w_q"] = array(layer.w_q, {ss(layer.model_dim), ss(layer.q_width())});
      d["w_k"] = array(layer.w_k, {ss(layer.k_in()), ss(layer.k_width())});
      d["w_v"] = array(layer.w_v, {ss(layer.v_in()), ss(layer.v_width())});
      d["w_o"] = array(layer.w_o, {ss(layer.o_width()), ss(layer.model_dim)});
      d["b_q"] = array(layer.b_q, {ss(layer.q_width())});
      d["b_k"] = array(layer.b_k, {ss(layer.k_width())});
      d["b_v"] = array(layer.b_v, {ss(layer.v_width())});
      d["b_o"] = array(layer.b_o, {ss(layer.model_dim)});
      const CaseData& m = layer.masking;
      d["mask"] = py::none();
      if (p.mask.present) {
        d["mask"] = copied<std::uint8_t>(m.mask, {ss(p.mask.batch), ss(p.mask.heads), ss(p.mask.rows), ss(p.seq_k)});
      }
      d["bias"] = array(m.bias, {ss(p.bias.batch), ss(p.bias.heads), ss(p.bias.rows), ss(p.seq_k)});
      d["kv_len"] = py::none();
      if (p.kv_len) d["kv_len"] = copied<std::int64_t>(m.kv_len, {ss(p.batch)});
      return py::module_::import("types").attr("SimpleNamespace")(**d);
  }
  std::vector<double> run_layer(const LayerData& layer, const RunOptions& options) const override {
    if (!unavailable_.empty()) throw Error(unavailable_);
    FloatStateGuard floats;
    py::gil_scoped_acquire gil;
    const Problem& p = layer.problem;
    try {
      py::object data = layer_namespace(layer);
      py::array_t<double, py::array::c_style | py::array::forcecast> y =
          module_->attr("layer")(problem_object(p), data, options.threads);
      const auto expected = static_cast<py::ssize_t>(p.batch * p.seq_q * layer.model_dim);
      if (y.size() != expected) {
        throw Error(fmt::format("{}: layer() returned {} values, not [batch, seq_q, model_dim] = {}", name_, y.size(),
                                expected));
      }
      return std::vector<double>(y.data(), y.data() + y.size());
    } catch (py::error_already_set& e) {
      throw_python_failure(e, fmt::format("{}: layer() failed", name_));
    }
  }
  // layer_backward(problem, data, dout, bias_requires_grad, threads) returns
  // a dict of the layer's gradients by their format names (dx_q, ..., db_o,
  // dbias, dsinks); one it leaves out is judged missing.
  LayerGradients run_layer_backward(const LayerData& layer, const std::vector<double>& dout, bool bias_gradient,
                                    const RunOptions& options) const override {
    if (!unavailable_.empty()) throw Error(unavailable_);
    FloatStateGuard floats;
    py::gil_scoped_acquire gil;
    if (!py::hasattr(*module_, "layer_backward")) {
      throw Unsupported(fmt::format("{} defines layer() but no layer_backward(): its layer's gradients are not judged", name_));
    }
    const Problem& p = layer.problem;
    LayerGradients g;
    try {
      py::object data = layer_namespace(layer);
      const std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(p.batch), static_cast<py::ssize_t>(p.seq_q),
                                           static_cast<py::ssize_t>(layer.model_dim)};
      py::dict grads = module_->attr("layer_backward")(problem_object(p), data, copied<double>(dout, shape), bias_gradient,
                                                       options.threads);
      for (const LayerGradientPart& part : layer_gradient_parts(layer, bias_gradient)) {
        if (!part.present || !grads.contains(part.name)) continue;
        using Array = py::array_t<double, py::array::c_style | py::array::forcecast>;
        Array values = Array::ensure(grads[part.name]);
        if (!values) throw Error(fmt::format("{}: layer_backward()'s {} is not an array of numbers", name_, part.name));
        g.*part.values = std::vector<double>(values.data(), values.data() + values.size());
      }
    } catch (py::error_already_set& e) {
      throw_python_failure(e, fmt::format("{}: layer_backward() failed", name_));
    }
    return g;
  }
  std::unique_ptr<Plan> prepare(const Problem& p, const AttentionIO& io, const RunOptions& options) const override {
    if (!unavailable_.empty()) throw Error(unavailable_);
    FloatStateGuard floats;
    py::gil_scoped_acquire gil;
    try {
      py::object io_object = py::module_::import("types").attr("SimpleNamespace")(**input_views(p, io, true, has_lse_));
      py::object run = module_->attr("prepare")(problem_object(p), io_object, options.threads);
      return std::make_unique<PythonPlan>(std::move(run), std::move(io_object), has_lse_, name_);
    } catch (py::error_already_set& e) {
      throw_python_failure(e, fmt::format("{}: prepare failed", name_));
    }
  }
  // Format version 3: prepare_backward(problem, io, threads) -> run.
  std::unique_ptr<BackwardPlan> prepare_backward(const Problem& p, const BackwardIO& io,
                                                 const RunOptions& options) const override {
    if (!unavailable_.empty()) throw Error(unavailable_);
    if (!has_backward_) throw Unsupported("defines no prepare_backward (format version 3)");
    FloatStateGuard floats;
    py::gil_scoped_acquire gil;
    try {
      const std::size_t elem = dtype_size(p.dtype);
      py::object dt = numpy_dtype(p.dtype);
      py::dict views = input_views(p, io.forward, false, io.forward.lse != nullptr);
      views["dout"] = view(io.dout.data, dt, dims(io.dout.shape), dims(io.dout.strides), elem, false);
      views["dq"] = view(io.dq.data, dt, dims(io.dq.shape), dims(io.dq.strides), elem, true);
      views["dk"] = view(io.dk.data, dt, dims(io.dk.shape), dims(io.dk.strides), elem, true);
      views["dv"] = view(io.dv.data, dt, dims(io.dv.shape), dims(io.dv.strides), elem, true);
      views["dbias"] = io.dbias.empty() ? py::object(py::none())
                                        : py::object(view(io.dbias.data, dt, dims(io.dbias.shape), dims(io.dbias.strides),
                                                          elem, true));
      views["dsinks"] = io.dsinks == nullptr ? py::object(py::none())
                                             : py::object(view(io.dsinks, py::dtype::of<double>(),
                                                               {static_cast<py::ssize_t>(p.heads_q)}, {1},
                                                               sizeof(double), true));
      py::object io_object = py::module_::import("types").attr("SimpleNamespace")(**views);
      py::object run = module_->attr("prepare_backward")(problem_object(p), io_object, options.threads);
      return std::make_unique<PythonRun<BackwardPlan>>(std::move(run), std::move(io_object), name_);
    } catch (py::error_already_set& e) {
      throw_python_failure(e, fmt::format("{}: prepare_backward failed", name_));
    }
  }

 private:
  // A question of the module's (supports, supports_backward): None is yes, a string the reason.
  Status ask(const char* question, const Problem& p) const {
    if (!unavailable_.empty()) return Status::no(unavailable_);
    FloatStateGuard floats;
    py::gil_scoped_acquire gil;
    try {
      py::object why = module_->attr(question)(problem_object(p));
      if (why.is_none()) return Status::yes();
      return Status::no(printable(std::string(py::str(why))));
    } catch (py::error_already_set& e) {
      return Status::no(fmt::format("{}() raised {}", question, python_error(e)));
    }
  }

  fs::path file_;
  std::string name_, description_;
  unsigned dtypes_ = kAllDTypes;
  std::string unavailable_;
  bool has_lse_ = false;
  bool has_backward_ = false;
  bool nondeterministic_dq_ = false;
  bool uses_threads_ = true;
  std::string thread_dependent_;
  bool runs_layers_ = false;
  unsigned encodings_ = 0;
  unsigned features_ = 0;
  bool batch_invariant_ = false;
  unsigned bitwise_relations_ = 0;
  std::unique_ptr<py::object> module_;
};

}  // namespace

py::object problem_object(const Problem& p) {
  py::dict d;
  d["batch"] = p.batch;
  d["heads_q"] = p.heads_q;
  d["heads_kv"] = p.heads_kv;
  d["seq_q"] = p.seq_q;
  d["seq_k"] = p.seq_k;
  d["head_dim"] = p.head_dim;
  d["head_dim_v"] = p.head_dim_v;
  d["scale"] = p.scale;
  d["causal"] = std::string(causal_name(p.causal));
  d["dtype"] = std::string(dtype_name(p.dtype));
  d["layout"] = std::string(layout_name(p.layout));
  auto shape = [](const BroadcastShape& s) -> py::object {
    if (!s.present) return py::none();
    return py::make_tuple(s.batch, s.heads, s.rows);
  };
  d["mask"] = shape(p.mask);
  d["bias"] = shape(p.bias);
  d["kv_len"] = p.kv_len;
  d["text"] = p.to_string();
  // Format version 2: the diagonal's alignment (the causal rule's, or the
  // window's and ALiBi's without one), the window (-1: unbounded), softcap
  // (0: none), whether ALiBi slopes and sinks come, packed sequences and pages.
  d["align"] = std::string(align_name(p.alignment()));
  d["window_left"] = p.window_left;
  d["window_right"] = p.window_right;
  d["softcap"] = p.softcap;
  d["alibi"] = p.alibi;
  d["sinks"] = p.sinks;
  d["ragged"] = p.ragged;
  d["page_size"] = p.page_size;
  d["num_pages"] = p.num_pages;
  // Format version 4: how each of q, k, v is stored, None when as the dtype.
  for (const char t : {'q', 'k', 'v'}) {
    const QuantSpec& spec = p.quant(t);
    py::object quant = py::none();
    if (spec.quantised()) {
      py::dict q;
      q["encoding"] = std::string(encoding_name(spec.encoding));
      q["descale"] = spec.descale == Descale::none ? py::object(py::none())
                     : spec.descale == Descale::tensor ? py::object(py::str("tensor"))
                                                       : py::object(py::str("entry_head"));
      q["scale"] = spec.has_scale() ? py::object(py::make_tuple(spec.scale[0], spec.scale[1], spec.scale[2], spec.scale[3]))
                                    : py::object(py::none());
      q["zero_point"] = spec.zero_point;
      quant = py::module_::import("types").attr("SimpleNamespace")(**q);
    }
    d[(std::string(1, t) + "_quant").c_str()] = quant;
  }
  return py::module_::import("types").attr("SimpleNamespace")(**d);
}

std::unique_ptr<Backend> make_python_backend(const std::string& file) {
  fs::path path = backends_folder() / file;
  std::string fallback = "py-" + fs::path(file).stem().string().substr(3);
  return std::make_unique<PythonBackend>(path, fallback);
}

std::unique_ptr<Backend> make_python_backend_from_object(py::object backend) {
  return std::make_unique<PythonBackend>(std::move(backend));
}

LoadedBackend load_python_backend_file(const std::string& path) {
  const std::string shown = printable(path);
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw Error(fmt::format("Python backend {}: no such file", shown));
  fs::path absolute = fs::absolute(path, ec);
  PythonBackend probe(absolute, "");
  if (!probe.load_error().empty()) throw Error(fmt::format("Python backend {}: {}", shown, probe.load_error()));
  return {std::string(probe.name()), [absolute] { return std::make_unique<PythonBackend>(absolute, ""); },
          fmt::format("Python backend {}", shown)};
}

}  // namespace attn::python

#if defined(__SANITIZE_ADDRESS__)
// The embedded interpreter is never finalised (frameworks do not survive it),
// so what CPython and the extension modules it loaded hold at exit is not
// freed; LeakSanitizer would report every object. attnbench's own leaks are
// still reported: only allocations made inside CPython, Python packages
// (numpy, torch, TensorFlow: their modules live under *-packages) and code
// without a module (JIT, Python's own trampolines) are ignored.
extern "C" const char* __lsan_default_suppressions() {
  return "leak:libpython3\n"
         "leak:site-packages\n"
         "leak:dist-packages\n"
         "leak:<unknown module>\n"
         "leak:libcrypto\n";
}
#endif
