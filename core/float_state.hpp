// The calling thread's floating-point state (the C fenv and, on x86, MXCSR
// with its flush-to-zero and denormals-are-zero bits), saved on construction
// and restored on destruction. A backend may change it (TensorFlow sets
// flush-to-zero; a kernel may set it for speed): the verifier's own float64
// reference and the other backends must never compute under it, so every
// backend call and every job of the thread pool runs inside one of these.
#pragma once

#include <cfenv>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace attn {

class FloatStateGuard {
 public:
  FloatStateGuard() {
    std::fegetenv(&env_);
#if defined(__SSE__)
    csr_ = _mm_getcsr();
#endif
  }
  ~FloatStateGuard() {
    std::fesetenv(&env_);
#if defined(__SSE__)
    _mm_setcsr(csr_);
#endif
  }
  FloatStateGuard(const FloatStateGuard&) = delete;
  FloatStateGuard& operator=(const FloatStateGuard&) = delete;

 private:
  std::fenv_t env_{};
#if defined(__SSE__)
  unsigned int csr_ = 0;
#endif
};

}  // namespace attn
