// The built-in Python backends: one file each in backends/.
#include "impls/python/bridge.hpp"

namespace attn {
std::unique_ptr<Backend> make_py_numpy_backend() { return python::make_python_backend("py_numpy.py"); }
std::unique_ptr<Backend> make_py_torch_backend() { return python::make_python_backend("py_torch.py"); }
std::unique_ptr<Backend> make_py_tensorflow_backend() { return python::make_python_backend("py_tensorflow.py"); }
std::unique_ptr<Backend> make_py_ggml_backend() { return python::make_python_backend("py_ggml.py"); }
}  // namespace attn
