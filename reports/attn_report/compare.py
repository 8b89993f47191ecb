"""Regression tables between two `attn bench` runs, in the manner of Google
Benchmark's tools/compare.py: per benchmark, the change of the median time and
a two-sided Mann-Whitney U test over the repetitions of each side.

The gate (`--fail-on-regression PCT`) fails a benchmark only when its median
got slower by more than PCT percent *and* the test calls the difference
significant at ALPHA. A test needs enough repetitions to be able to say so at
all: with n and m repetitions the smallest two-sided p-value the exact test can
give is 2 / C(n + m, n), which is 0.1 for 3 against 3 (never below 0.05) and
0.029 for 4 against 4, so a benchmark with fewer than MIN_REPETITIONS on a side
is "too few repetitions": the gate reports it and exits INCONCLUSIVE, never a
silent pass and never a failure on one sample.

Google Benchmark's own tools/compare.py (Debian's libbenchmark-tools) computes
the same U test, but its command line has no exit code for a regression and it
is not installed with libbenchmark-dev; the table and the gate here are a few
lines over SciPy's mannwhitneyu, the same test it uses."""
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

    @property
    def testable(self):
        return self.p_value is not None

    @property
    def verdict(self):
        if not self.testable:
            return f"too few repetitions ({self.base_runs} and {self.new_runs}; the test needs {MIN_REPETITIONS})"
        if not self.significant:
            return "same (not significant)"
        return "slower" if self.change_pct > 0 else "faster"


def compare(base, new):
    """base, new: lists of Measurement. Benchmarks present in both, by name."""
    old = {m.name: m for m in base if m.seconds}
    changes = []
    for m in new:
        b = old.get(m.name)
        if b is None or not m.seconds:
            continue
        change = 100.0 * (m.median_seconds - b.median_seconds) / b.median_seconds
        p_value = None
        if len(b.seconds) >= MIN_REPETITIONS and len(m.seconds) >= MIN_REPETITIONS:
            p_value = float(mannwhitneyu(b.seconds, m.seconds, alternative="two-sided").pvalue)
        changes.append(Change(m.name, b.median_seconds, m.median_seconds, change, p_value,
                              p_value is not None and p_value < ALPHA, len(b.seconds), len(m.seconds)))
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
    unknown = untestable(changes)
    lines = []
    if bad:
        lines.append(f"{len(bad)} benchmark(s) slower by more than {threshold_pct}% and significant "
                     f"(Mann-Whitney, p < {ALPHA}):")
        lines += [f"  {c.name}: {c.change_pct:+.1f}%, p = {c.p_value:.3g}" for c in bad]
    if unknown:
        lines.append(f"{len(unknown)} benchmark(s) cannot be judged: fewer than {MIN_REPETITIONS} repetitions on a side "
                     f"(run attn bench with --benchmark_repetitions={MIN_REPETITIONS} or more):")
        lines += [f"  {c.name}: {c.base_runs} and {c.new_runs}" for c in unknown]
    if bad:
        return REGRESSED, lines
    if unknown:
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
