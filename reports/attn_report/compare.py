"""Regression tables between two `attn bench` runs, in the manner of Google
Benchmark's tools/compare.py: per benchmark, the change of the median time and
a Mann-Whitney U test over the repetitions."""
from dataclasses import dataclass

from scipy.stats import mannwhitneyu

# Below this p-value a change is called significant (compare.py uses 0.05).
ALPHA = 0.05


@dataclass
class Change:
    name: str
    base_seconds: float
    new_seconds: float
    change_pct: float      # + is slower
    p_value: float         # None with fewer than 2 repetitions on a side
    significant: bool

    @property
    def verdict(self):
        if self.p_value is None:
            return "too few repetitions"
        if not self.significant:
            return "same"
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
        if len(b.seconds) >= 2 and len(m.seconds) >= 2:
            p_value = float(mannwhitneyu(b.seconds, m.seconds, alternative="two-sided").pvalue)
        changes.append(Change(m.name, b.median_seconds, m.median_seconds, change, p_value,
                              p_value is not None and p_value < ALPHA))
    return changes


def regressions(changes, threshold_pct):
    """Changes slower by more than threshold_pct. With repetitions on both sides
    the slowdown must also be significant; without, the median alone decides."""
    return [c for c in changes
            if c.change_pct > threshold_pct and (c.p_value is None or c.significant)]


def format_table(changes):
    lines = [f"{'benchmark':<90} {'base':>10} {'new':>10} {'change':>8} {'p-value':>8}  verdict"]
    for c in changes:
        p = f"{c.p_value:.3f}" if c.p_value is not None else "-"
        lines.append(f"{c.name[:90]:<90} {c.base_seconds * 1e3:>8.3f}ms {c.new_seconds * 1e3:>8.3f}ms "
                     f"{c.change_pct:>+7.1f}% {p:>8}  {c.verdict}")
    return "\n".join(lines)
