"""Regression tables between two `attn bench` runs, in the manner of Google
Benchmark's tools/compare.py: per benchmark, the change of the median time and
a two-sided Mann-Whitney U test over the repetitions of each side.

The gate (`--fail-on-regression PCT`) fails a benchmark only when its median
got slower by more than PCT percent *and* the test calls the difference
significant at ALPHA. When both runs recorded `attn peak`, a benchmark is
judged by its fraction of its own run's limit (the compute peak of its dtype
or the read bandwidth, whichever its roofline meets): the new run's times are
scaled by its limit over the base run's. Where that ratio passes
MACHINE_FACTOR either way, the two machines (or loads) differ beyond what a
scale can be trusted to correct, and the benchmark is not judged: the gate
exits INCONCLUSIVE when nothing else regressed, never FAIL on a runner's load. A test needs enough repetitions to be able to say so at
all: with n and m repetitions the smallest two-sided p-value the exact test can
give is 2 / C(n + m, n), which is 0.1 for 3 against 3 (never below 0.05) and
0.029 for 4 against 4, so a benchmark with fewer than MIN_REPETITIONS on a side
is "too few repetitions": the gate reports it and exits INCONCLUSIVE, never a
silent pass and never a failure on one sample.

Google Benchmark's own tools/compare.py (Debian's libbenchmark-tools) computes
the same U test, but its command line has no exit code for a regression and it
is not installed with libbenchmark-dev; the table and the gate here are a few
lines over SciPy's mannwhitneyu, the same test it uses."""
import statistics
from dataclasses import dataclass
from math import comb

from scipy.stats import mannwhitneyu

# Below this p-value a change is called significant (compare.py uses 0.05).
ALPHA = 0.05
# Exit codes of `compare --fail-on-regression` (attn report passes them on).
PASSED, REGRESSED, INCONCLUSIVE = 0, 1, 4


def smallest_p(n, m):
    """The smallest two-sided p-value of an exact Mann-Whitney test of n against m."""
    return min(1.0, 2.0 / comb(n + m, n))


def min_repetitions(alpha=ALPHA):
    """Repetitions needed on each side before the test can call anything significant."""
    k = 1
    while smallest_p(k, k) >= alpha:
        k += 1
    return k


MIN_REPETITIONS = min_repetitions()  # 4 for ALPHA = 0.05


@dataclass
class Change:
    name: str
    base_seconds: float
    new_seconds: float
    change_pct: float      # + is slower
    p_value: float         # None when a side has fewer than MIN_REPETITIONS
    significant: bool
    base_runs: int = 0
    new_runs: int = 0
    factor: float = 1.0    # the new run's times were scaled by this (its limit over the base run's)
    limit: str = None      # the attn peak figure the factor is of (limit_of); None: raw times
    machine: str = None    # why the two machines do not compare for this benchmark; None when they do

    @property
    def testable(self):
        return self.p_value is not None

    @property
    def verdict(self):
        if self.machine:
            return f"not judged: {self.machine}"
        if not self.testable:
            return f"too few repetitions ({self.base_runs} and {self.new_runs}; the test needs {MIN_REPETITIONS})"
        if not self.significant:
            return "same (not significant)"
        return "slower" if self.change_pct > 0 else "faster"


def limit_of(m, base_file):
    """(peak key, what) of the machine limit that bounds benchmark m on the base run's machine: the
    compute peak of its dtype (the bfloat16 dot peak for 16-bit cases where the run measured one,
    else the float32 FMA peak) when its roofline is flat there, the read bandwidth when its
    arithmetic intensity puts it on the bandwidth slope; None without the figures."""
    compute = "fp32_gflops"
    if m.problem.dtype in ("bf16", "f16") and base_file.peak("bf16_gflops"):
        compute = "bf16_gflops"
    peak, bandwidth = base_file.peak(compute), base_file.peak("bandwidth_gbs")
    if not peak:
        return None
    if bandwidth and bandwidth * m.problem.useful_flops() / m.moved_bytes() < peak:
        return "bandwidth_gbs"
    return compute


def compare(base, new, base_file=None, new_file=None):
    """base, new: lists of Measurement. Benchmarks present in both, by name.

    With both runs' files carrying `attn peak` figures, each benchmark is judged by its fraction of
    its own run's limit (limit_of): the new run's times are scaled by how much faster or slower its
    machine measured, new peak over base peak. A ratio beyond MACHINE_FACTOR either way is more than
    a load or a clock can be trusted to scale by: that benchmark is not judged (`machine`)."""
    old = {m.name: m for m in base if m.seconds}
    changes = []
    for m in new:
        b = old.get(m.name)
        if b is None or not m.seconds:
            continue
        factor, machine = 1.0, None
        key = limit_of(b, base_file) if base_file and new_file else None
        if key and new_file.peak(key):
            factor = new_file.peak(key) / base_file.peak(key)
            if max(factor, 1 / factor) > MACHINE_FACTOR:
                what = dict((k, w) for k, w, _ in PEAKS)[key]
                machine = (f"the runs' {what} differ {max(factor, 1 / factor):.2f}x ({base_file.peak(key):g} and "
                           f"{new_file.peak(key):g}), beyond the {MACHINE_FACTOR}x a time can be scaled by")
        if machine:
            factor = 1.0  # shown as measured
        seconds = [t * factor for t in m.seconds]
        median = statistics.median(seconds)
        change = 100.0 * (median - b.median_seconds) / b.median_seconds
        p_value = None
        if machine is None and len(b.seconds) >= MIN_REPETITIONS and len(seconds) >= MIN_REPETITIONS:
            p_value = float(mannwhitneyu(b.seconds, seconds, alternative="two-sided").pvalue)
        changes.append(Change(m.name, b.median_seconds, median, change, p_value,
                              p_value is not None and p_value < ALPHA, len(b.seconds), len(m.seconds),
                              factor, key, machine))
    return changes


def one_sided(base, new):
    """(names only in base, names only in new): benchmarks the comparison cannot judge."""
    old = {m.name for m in base if m.seconds}
    now = {m.name for m in new if m.seconds}
    return sorted(old - now), sorted(now - old)


# Two runs whose recorded peaks differ by more than this factor ran on machines
# (or under loads) too different for a time to mean the same thing; the same
# host's peaks moved by up to a third between runs minutes apart.
MACHINE_FACTOR = 1.5
PEAKS = (("fp32_gflops", "float32 FMA peak", "GFLOP/s"), ("bf16_gflops", "bfloat16 dot peak", "GFLOP/s"),
         ("amx_bf16_gflops", "AMX peak", "GFLOP/s"), ("bandwidth_gbs", "read bandwidth", "GB/s"))


def machine_warnings(base_file, new_file):
    """Lines warning that the two runs' recorded peaks or bandwidths differ beyond the noise."""
    lines = []
    for key, what, unit in PEAKS:
        a, b = base_file.peak(key), new_file.peak(key)
        if not a or not b:
            continue
        ratio = max(a, b) / min(a, b)
        if ratio > MACHINE_FACTOR:
            lines.append(f"warning: the two runs' {what} differ {ratio:.1f}x ({a:g} and {b:g} {unit}): they ran on "
                         f"different machines or under different loads, and their times do not compare")
    models = [f.context.get("attn_cpu_model", "") for f in (base_file, new_file)]
    if all(models) and models[0] != models[1]:
        lines.append(f"warning: the two runs come from different CPUs ({models[0]} and {models[1]})")
    return lines


def regressions(changes, threshold_pct):
    """Changes slower by more than threshold_pct and significant."""
    return [c for c in changes if c.testable and c.significant and c.change_pct > threshold_pct]


def untestable(changes):
    return [c for c in changes if not c.testable]


def gate(changes, threshold_pct):
    """(exit code, lines to print) of --fail-on-regression."""
    bad = regressions(changes, threshold_pct)
    unknown = [c for c in untestable(changes) if not c.machine]
    elsewhere = [c for c in changes if c.machine]
    lines = []
    scaled = [c for c in changes if c.limit and not c.machine]
    if scaled:
        lines.append(f"{len(scaled)} benchmark(s) judged by their fraction of their own run's `attn peak` limit "
                     f"(the new run's times scaled by its limit over the base run's)")
    if bad:
        lines.append(f"{len(bad)} benchmark(s) slower by more than {threshold_pct}% and significant "
                     f"(Mann-Whitney, p < {ALPHA}):")
        lines += [f"  {c.name}: {c.change_pct:+.1f}%, p = {c.p_value:.3g}" for c in bad]
    if elsewhere:
        lines.append(f"{len(elsewhere)} benchmark(s) not judged: the two runs' machines (or loads) differ beyond "
                     f"what their measured limits correct:")
        lines += [f"  {c.name}: {c.machine}" for c in elsewhere]
    if unknown:
        lines.append(f"{len(unknown)} benchmark(s) cannot be judged: fewer than {MIN_REPETITIONS} repetitions on a side "
                     f"(run attn bench with --benchmark_repetitions={MIN_REPETITIONS} or more):")
        lines += [f"  {c.name}: {c.base_runs} and {c.new_runs}" for c in unknown]
    if bad:
        return REGRESSED, lines
    if unknown or elsewhere:
        lines.append(f"inconclusive (exit {INCONCLUSIVE}): nothing judged regressed, but not everything could be judged")
        return INCONCLUSIVE, lines
    lines.append(f"no benchmark slower by more than {threshold_pct}% with significance "
                 f"({len(changes)} judged, each with at least {MIN_REPETITIONS} repetitions a side)")
    return PASSED, lines


def format_table(changes):
    lines = [f"{'benchmark':<90} {'base':>10} {'new':>10} {'change':>8} {'p-value':>8}  verdict"]
    for c in changes:
        p = f"{c.p_value:.3f}" if c.p_value is not None else "-"
        lines.append(f"{c.name[:90]:<90} {c.base_seconds * 1e3:>8.3f}ms {c.new_seconds * 1e3:>8.3f}ms "
                     f"{c.change_pct:>+7.1f}% {p:>8}  {c.verdict}")
    return "\n".join(lines)
