// Registers one Google Benchmark per (backend, problem) from main (never by
// static registration) and runs them. Inputs are random, made once per
// benchmark; prepare() is outside the timed loop, run() inside.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bench/peak.hpp"
#include "attnbench/backend.hpp"
#include "core/shard.hpp"

namespace attn::bench {

// What one benchmark times: the forward pass, the backward pass alone (the
// forward ran once in prepare, untimed, for out and lse), or both in a row.
enum class Direction { forward, backward, both };
const char* direction_name(Direction d);                       // "forward", "backward", "forward+backward"
Direction parse_direction(const std::string& text);            // throws attn::Error naming the choices
// Useful FLOPs of a direction per forward useful FLOP, as FlashAttention
// counts them: the backward's five matrix products against the forward's two
// (2.5), both together 3.5.
double direction_flops_factor(Direction d);
// What a preset times when --direction does not say: training the backward,
// every other preset the forward.
std::vector<Direction> preset_directions(const std::string& preset);

struct BenchOptions {
  std::string preset = "quick";
  // Problems to time instead of the preset's (Problem::parse's syntax).
  std::vector<std::string> problems;
  std::vector<Direction> directions{Direction::forward};
  int threads = 0;
  // Skip a backend on a problem whose estimated time per call exceeds this
  // (the naive backend at long sequences), with the reason. 0: by preset
  // (quick 2 s, full 60 s, the others 5 s).
  double max_seconds_per_call = 0;
  std::string out;           // Google Benchmark JSON to this file (with the context block)
  bool measure_peak = true;  // put this machine's peaks in the context
  // The peaks, when the caller measured them already: before the backends were
  // made, since a framework's thread pools (TensorFlow, torch) started by a
  // Python backend take CPU from the measurement (f32 peak 233 -> 143 GFLOP/s here).
  std::optional<MachinePeak> peak;
  // Extra context entries (library versions and the like) from the caller.
  std::vector<std::pair<std::string, std::string>> context;
  // Time only this shard's (backend, problem) benchmarks (core/shard.hpp),
  // split by their flops; shard_source says what chose it.
  std::optional<Shard> shard;
  std::string shard_source;
};

// argv holds only Google Benchmark's own flags (--benchmark_*).
int run_benchmarks(const std::vector<std::unique_ptr<Backend>>& backends, const BenchOptions& options,
                   std::vector<std::string> benchmark_args);

}  // namespace attn::bench
