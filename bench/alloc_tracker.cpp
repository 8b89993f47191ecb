#include "bench/alloc_tracker.hpp"

#include <malloc.h>

#include <atomic>
#include <cerrno>
#include <cstring>

extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
void __libc_free(void*);
}

namespace {
std::atomic<std::int64_t> g_current{0}, g_peak{0};

void grew(void* p) {
  if (!p) return;
  const auto n = static_cast<std::int64_t>(malloc_usable_size(p));
  const std::int64_t now = g_current.fetch_add(n, std::memory_order_relaxed) + n;
  std::int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
void shrank(void* p) {
  if (p) g_current.fetch_sub(static_cast<std::int64_t>(malloc_usable_size(p)), std::memory_order_relaxed);
}
}  // namespace

#ifndef ATTN_NO_ALLOC_TRACKING
extern "C" {
void* malloc(size_t n) {
  void* p = __libc_malloc(n);
  grew(p);
  return p;
}
void* calloc(size_t n, size_t size) {
  void* p = __libc_calloc(n, size);
  grew(p);
  return p;
}
void* realloc(void* old, size_t n) {
  shrank(old);
  void* p = __libc_realloc(old, n);
  grew(p ? p : (n == 0 ? nullptr : old));
  return p;
}
void free(void* p) {
  shrank(p);
  __libc_free(p);
}
void* memalign(size_t alignment, size_t n) {
  void* p = __libc_memalign(alignment, n);
  grew(p);
  return p;
}
void* aligned_alloc(size_t alignment, size_t n) { return memalign(alignment, n); }
int posix_memalign(void** out, size_t alignment, size_t n) {
  void* p = memalign(alignment, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
}
#endif

namespace attn::bench {

bool AllocTracker::available() {
#ifdef ATTN_NO_ALLOC_TRACKING
  return false;
#else
  return true;
#endif
}
std::int64_t AllocTracker::current_bytes() { return g_current.load(); }
void AllocTracker::reset_peak() { g_peak.store(g_current.load()); }
std::int64_t AllocTracker::peak_bytes() { return g_peak.load(); }

}  // namespace attn::bench
