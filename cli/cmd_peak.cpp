// attn peak: this machine's fp32 FMA and bf16 dot peaks and memory bandwidth.
#include <fmt/format.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "bench/peak.hpp"
#include "cli/commands.hpp"
#include "attnbench/error.hpp"
#include "core/output_file.hpp"

namespace attn::cli {

Runner add_peak_command(CLI::App& app) {
  auto threads = std::make_shared<int>(0);
  auto out = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("peak", "Measure this machine's fp32 FMA peak, bf16 dot peak and memory bandwidth");
  cmd->add_option("--threads", *threads, "Threads, 1 to 256 (default: OMP_NUM_THREADS or all cores)")->check(CLI::Range(1, 256));
  cmd->add_option("--out", *out, "Also write the figures as JSON");
  return [threads, out]() {
    if (!out->empty()) check_outputs({*out}, {});  // an unwritable --out is found before the measurement
    warn_above_cpus(*threads, "attn peak");
    bench::MachinePeak peak = bench::measure_peak(*threads);
    fmt::print("threads              {}\nkernels              {}\nfp32 FMA peak        {:.1f} GFLOP/s\n", peak.threads,
               peak.isa, peak.fp32_gflops);
    if (peak.bf16_gflops > 0) fmt::print("bf16 dot peak        {:.1f} GFLOP/s\n", peak.bf16_gflops);
    if (peak.amx_bf16_gflops > 0) fmt::print("bf16 AMX peak        {:.1f} GFLOP/s\n", peak.amx_bf16_gflops);
    fmt::print("memory bandwidth     {:.1f} GB/s\n", peak.bandwidth_gbs);
    if (!out->empty()) {
      nlohmann::json doc = {{"threads", peak.threads}, {"isa", peak.isa}, {"fp32_gflops", peak.fp32_gflops},
                            {"bf16_gflops", peak.bf16_gflops},
                            {"amx_bf16_gflops", peak.amx_bf16_gflops}, {"bandwidth_gbs", peak.bandwidth_gbs}};
      write_whole_file(*out, doc.dump(2) + "\n");
    }
    return 0;
  };
}

void warn_above_cpus(int threads, const char* command) {
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  if (threads > 0 && cpus > 0 && threads > cpus) {
    fmt::print(stderr, "{}: warning: --threads {} is more than the {} CPUs here; the figures will measure "
                       "oversubscription\n", command, threads, cpus);
  }
}

}  // namespace attn::cli
