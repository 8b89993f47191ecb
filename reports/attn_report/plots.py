"""The report's figures, each a function from parsed results to PNG bytes
(None when the results hold nothing to draw)."""
import io
import math
import zlib
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

_STYLE = {"naive": "#999999", "blocked": "#1f77b4", "streaming": "#d62728", "openblas": "#2ca02c",
          "onednn": "#9467bd", "cuda-cublas": "#8c564b", "cuda-flash": "#e377c2",
          # The Python peers (impls/python), clear of the built-in ones.
          "py-numpy": "#4dabcf", "py-torch": "#222222", "py-tensorflow": "#ffa800"}
# Backends that are not built in (out of tree, other tools) take a colour and a
# marker from these by a stable hash of their name: the same name gets the
# same look in every report, and never one of the built-in colours.
_EXTRA_COLORS = ["#17becf", "#bcbd22", "#ff7f0e", "#7f7f7f", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896",
                 "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5", "#393b79", "#637939", "#8c6d31"]
_MARKERS = {"naive": "o", "blocked": "s", "streaming": "D", "openblas": "^", "onednn": "v", "cuda-cublas": "P",
            "cuda-flash": "X", "py-numpy": "p", "py-torch": "*", "py-tensorflow": "h"}
_EXTRA_MARKERS = ["<", ">", "p", "h", "*", "d", "8", "H"]


def _stable_index(name, n):
    return zlib.crc32(name.encode("utf-8")) % n


def _color(backend):
    return _STYLE.get(backend) or _EXTRA_COLORS[_stable_index(backend, len(_EXTRA_COLORS))]


def _marker(backend):
    return _MARKERS.get(backend) or _EXTRA_MARKERS[_stable_index(backend[::-1], len(_EXTRA_MARKERS))]


def _legend_outside(ax, fontsize=7):
    """The legend to the right of the axes, so it never covers the data."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _png(fig):
    """The figure as PNG, grown or cropped to every artist it holds (rotated
    tick labels, axis labels, a legend outside the axes), so nothing is clipped."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)
    return buffer.getvalue()


def _label(m, hosts):
    return m.backend if len(hosts) == 1 else f"{m.backend} @ {m.host}"


def gflops_vs_seq(measurements, peaks):
    """GFLOP/s against sequence length, one panel per head_dim x causal x dtype
    (x the version 2 variant: a window, packed or paged batches),
    each host's peak drawn as a dashed line. peaks: host -> {'fp32': x, 'bf16': y,
    'amx_bf16': z}; the AMX peak (often 20x the others) is written, not drawn."""
    rows = [m for m in measurements if m.gflops and not m.problem.decode and m.problem.seq_q == m.problem.seq_k]
    if not rows:
        return None
    hosts = sorted({m.host for m in rows})
    # The backward's panels beside the forward's of the same shape.
    panels = sorted({(m.problem.head_dim, m.problem.causal, m.problem.dtype, m.problem.variant, m.problem.direction)
                     for m in rows})
    columns = min(3, len(panels))
    grid_rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(grid_rows, columns, figsize=(7.2 * columns, 3.8 * grid_rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (head_dim, causal, dtype, variant, direction) in zip(axes.flat, panels):
        lines = defaultdict(list)
        for m in rows:
            if (m.problem.head_dim, m.problem.causal, m.problem.dtype, m.problem.variant,
                    m.problem.direction) == (head_dim, causal, dtype, variant, direction):
                lines[(m.backend, m.host, m.problem.heads_q, m.problem.heads_kv)].append(
                    (m.problem.seq_q, m.gflops, m.gflops_iqr))
        head_configs = {(hq, hkv) for (_, _, hq, hkv) in lines}
        for (backend, host, hq, hkv), points in sorted(lines.items()):
            points.sort()
            label = backend if len(hosts) == 1 else f"{backend} @ {host}"
            if len(head_configs) > 1:  # tell the head counts apart
                label += f" ({hq} heads" + (f", GQA {hq}:{hkv})" if hkv != hq else ")")
            style = "--" if hkv != hq else (":" if len(head_configs) > 1 and hq != min(h for h, _ in head_configs) else "-")
            # The median, with the interquartile range over the repetitions as bars.
            low = [p[1] - p[2][0] if p[2] else 0.0 for p in points]
            high = [p[2][1] - p[1] if p[2] else 0.0 for p in points]
            ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[low, high], marker=_marker(backend),
                        ms=4, color=_color(backend), linestyle=style, label=label, capsize=2, elinewidth=1)
        for host in hosts:
            at = "" if len(hosts) == 1 else f" @ {host}"
            amx = peaks.get(host, {}).get("amx_bf16") if dtype == "bf16" else None
            if amx:  # the bf16 products ran on AMX: the vdpbf16ps peak is no limit, the AMX one is off scale
                ax.text(0.99, 0.02, f"AMX peak {amx:.0f}{at} (off scale)", transform=ax.transAxes, fontsize=7,
                        ha="right", va="bottom")
                continue
            peak = peaks.get(host, {}).get("bf16" if dtype == "bf16" else "fp32")
            if peak:
                ax.axhline(peak, color="black", linestyle=":", linewidth=1)
                ax.annotate(f"peak {peak:.0f}{at}", (0.01, peak), xycoords=("axes fraction", "data"), fontsize=7,
                            va="bottom")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{dtype}, head_dim {head_dim}, causal {causal}" + (f", {variant}" if variant else "") +
                     ("" if direction == "forward" else f" [{direction}]"), fontsize=10)
        ax.set_xlabel("sequence length")
        ax.set_ylabel("useful GFLOP/s (median, IQR bars)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        _legend_outside(ax)
    fig.tight_layout()
    return _png(fig)


def memory_vs_seq(measurements):
    """Peak extra memory against sequence length, log-log, with O(S) and O(S^2) guides."""
    rows = [m for m in measurements if m.extra_mib and m.extra_mib > 0 and not m.problem.decode]
    if not rows:
        return None
    hosts = sorted({m.host for m in rows})
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    lines = defaultdict(list)
    for m in rows:
        lines[(_label(m, hosts), m.backend)].append((m.problem.seq_q, m.extra_mib))
    for (label, backend), points in sorted(lines.items()):
        by_seq = defaultdict(list)
        for s, v in points:
            by_seq[s].append(v)
        xs = sorted(by_seq)
        ax.plot(xs, [max(by_seq[x]) for x in xs], marker=_marker(backend), ms=4, color=_color(backend), label=label)
    seqs = sorted({m.problem.seq_q for m in rows})
    if len(seqs) > 1:
        # Anchored at the median of the backends' values at the smallest length,
        # so the guides run through the middle of the lines, not below them all.
        base = float(np.median([m.extra_mib for m in rows if m.problem.seq_q == seqs[0]]))
        xs = np.array([seqs[0], seqs[-1]], dtype=float)
        ax.plot(xs, base * xs / xs[0], color="black", linestyle=":", linewidth=1, label="O(S) guide")
        ax.plot(xs, base * (xs / xs[0]) ** 2, color="black", linestyle="--", linewidth=1, label="O(S^2) guide")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length")
    ax.set_ylabel("peak extra memory (MiB)")
    ax.set_title("memory beyond inputs and output (largest over shapes)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    _legend_outside(ax)
    fig.tight_layout()
    return _png(fig)


def speedup_heatmap(measurements):
    """Backend x shape: speedup against naive and against the best backend."""
    rows = [m for m in measurements if m.median_seconds]
    if not rows:
        return None
    shapes = sorted({(m.host, m.problem.text) for m in rows})
    backends = sorted({m.backend for m in rows}, key=lambda b: list(_STYLE).index(b) if b in _STYLE else 99)
    time = {(m.backend, m.host, m.problem.text): m.median_seconds for m in rows}
    vs_naive = np.full((len(backends), len(shapes)), np.nan)
    vs_best = np.full((len(backends), len(shapes)), np.nan)
    for c, (host, shape) in enumerate(shapes):
        times = {b: time.get((b, host, shape)) for b in backends}
        best = min(t for t in times.values() if t)
        for r, b in enumerate(backends):
            if times[b]:
                if times.get("naive"):
                    vs_naive[r, c] = times["naive"] / times[b]
                vs_best[r, c] = best / times[b]
    labels = []
    for host, shape in shapes:
        p = next(m.problem for m in rows if m.problem.text == shape)
        labels.append(p.shape_label + ("" if len({h for h, _ in shapes}) == 1 else f" @ {host}"))
    fig, axes = plt.subplots(2, 1, figsize=(max(7.0, 0.42 * len(shapes) + 2.5), 2.2 + 0.9 * len(backends)))
    for ax, data, title, cmap in ((axes[0], vs_naive, "speedup over naive (x)", "viridis"),
                                  (axes[1], vs_best, "fraction of the best backend's speed", "RdYlGn")):
        finite = data[np.isfinite(data)]
        if finite.size == 0:
            ax.text(0.5, 0.5, "naive was not measured on these shapes", ha="center", va="center")
            ax.axis("off")
            continue
        masked = np.ma.masked_invalid(data)
        cm = matplotlib.colormaps[cmap].copy()
        cm.set_bad("#dddddd")
        norm = matplotlib.colors.LogNorm(vmin=max(finite.min(), 1e-3), vmax=max(finite.max(), 1.0001)) \
            if title.startswith("speedup") else matplotlib.colors.Normalize(vmin=0, vmax=1)
        image = ax.imshow(masked, aspect="auto", cmap=cm, norm=norm)
        for r in range(data.shape[0]):
            for c in range(data.shape[1]):
                if np.isfinite(data[r, c]):
                    # Light text on dark cells, dark on light, by the cell's own luminance.
                    red, green, blue, _ = cm(norm(data[r, c]))
                    dark = 0.299 * red + 0.587 * green + 0.114 * blue < 0.5
                    ax.text(c, r, f"{data[r, c]:.2g}", ha="center", va="center", fontsize=6,
                            color="white" if dark else "black")
        ax.set_yticks(range(len(backends)), backends, fontsize=8)
        ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=6)
        ax.set_title(title, fontsize=10)
        fig.colorbar(image, ax=ax, fraction=0.03)
    fig.tight_layout()
    return _png(fig)


def decode_bandwidth(measurements, bandwidths):
    """KV bytes/s on decode shapes against each host's measured bandwidth."""
    rows = [m for m in measurements if m.kv_gbs and m.problem.decode]
    if not rows:
        return None
    hosts = sorted({m.host for m in rows})
    shapes = sorted({(m.host, m.problem.text) for m in rows})
    backends = sorted({m.backend for m in rows})
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(shapes) + 2), 4.2))
    width = 0.8 / len(backends)
    for n, backend in enumerate(backends):
        values, low, high = [], [], []
        for host, shape in shapes:
            m = next((m for m in rows if m.backend == backend and m.host == host and m.problem.text == shape), None)
            values.append(m.kv_gbs if m else 0)
            iqr = m.kv_gbs_iqr if m else None
            low.append(m.kv_gbs - iqr[0] if iqr else 0)
            high.append(iqr[1] - m.kv_gbs if iqr else 0)
        ax.bar(np.arange(len(shapes)) + n * width, values, width, label=backend, color=_color(backend),
               yerr=[low, high], capsize=2, error_kw={"elinewidth": 1})
    for host in hosts:
        limit = bandwidths.get(host)
        if limit:
            ax.axhline(limit, color="black", linestyle=":", linewidth=1)
            ax.annotate(f"measured bandwidth {limit:.0f} GB/s" + ("" if len(hosts) == 1 else f" @ {host}"),
                        (0.01, limit), xycoords=("axes fraction", "data"), fontsize=7, va="bottom")
    labels = [next(m.problem for m in rows if m.problem.text == s).shape_label for _, s in shapes]
    ax.set_xticks(np.arange(len(shapes)) + 0.4 - width / 2, labels, rotation=20, ha="right", fontsize=7)
    ax.set_ylabel("K and V read, GB/s (median, IQR bars)")
    ax.set_title("decode: bandwidth against the memory limit", fontsize=10)
    _legend_outside(ax)
    fig.tight_layout()
    return _png(fig)


def thread_scaling(measurements):
    """Speedup over the fewest threads measured, against the ideal (linear)
    line, one panel per regime: prefill (many query rows) and decode (one)."""
    groups = defaultdict(dict)
    labels = {}
    for m in measurements:
        if m.median_seconds:
            groups[(m.backend, m.host, m.problem.text)][m.threads] = m.median_seconds
            labels[m.problem.text] = m.problem
    groups = {k: v for k, v in groups.items() if len(v) > 1}
    if not groups:
        return None
    regimes = [("prefill", lambda p: not p.decode), ("decode", lambda p: p.decode)]
    regimes = [(name, test) for name, test in regimes if any(test(labels[k[2]]) for k in groups)]
    fig, axes = plt.subplots(1, len(regimes), figsize=(7.5 * len(regimes), 4.2), squeeze=False)
    for ax, (regime, test) in zip(axes[0], regimes):
        threads = set()
        for (backend, host, problem), points in sorted(groups.items()):
            if not test(labels[problem]):
                continue
            xs = sorted(points)
            threads.update(xs)
            ax.plot(xs, [points[xs[0]] / points[x] for x in xs], marker=_marker(backend), color=_color(backend),
                    label=f"{backend}: {labels[problem].shape_label}")
        lo, hi = min(threads), max(threads)
        ax.plot([lo, hi], [1.0, hi / lo], color="black", linestyle=":", linewidth=1, label="ideal (linear)")
        ax.set_xlabel("threads")
        ax.set_xticks(sorted(threads))
        ax.set_ylabel(f"speedup over {lo} thread(s), median times")
        ax.set_title(f"thread scaling: {regime}", fontsize=10)
        ax.grid(alpha=0.3)
        _legend_outside(ax, fontsize=6)
    fig.tight_layout()
    return _png(fig)


def _compute_peak(peaks_of_host, dtype):
    """The roof for a dtype: float32 FMA for f32 and f16 (widened), the AMX
    tile peak for bf16 where measured, else the vdpbf16ps one."""
    if not peaks_of_host:
        return None
    if dtype == "bf16":
        return peaks_of_host.get("amx_bf16") or peaks_of_host.get("bf16")
    if dtype in ("f32", "f16"):
        return peaks_of_host.get("fp32")
    return None


def roofline_cases(measurements):
    """The case numbers the roofline writes beside its points: 1, 2, ... per
    case (shape and dtype), in a stable order, the same number for every
    backend and host that measured it. [(number, dtype, shape label)]."""
    cases = sorted({(m.problem.dtype, m.problem.shape_label) for m in measurements if m.gflops})
    return [(n + 1, dtype, label) for n, (dtype, label) in enumerate(cases)]


def roofline(measurements, peaks, bandwidths):
    """Every measured case at its arithmetic intensity (useful flops over the
    bytes of Q, K, V and the output moved once) against the roofline of its
    host: min(compute peak, bandwidth x intensity), both measured by `attn
    peak` in the same run. One panel per dtype; each point carries its case
    number (roofline_cases(), listed under the plot in the report)."""
    rows = [m for m in measurements if m.gflops]
    if not rows:
        return None
    number = {(dtype, label): n for n, dtype, label in roofline_cases(rows)}
    dtypes = sorted({m.problem.dtype for m in rows})
    hosts = sorted({m.host for m in rows})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(7.0 * len(dtypes), 4.4), squeeze=False)
    for ax, dtype in zip(axes[0], dtypes):
        points = [m for m in rows if m.problem.dtype == dtype]
        for backend, direction in sorted({(m.backend, m.problem.direction) for m in points}):
            mine = [m for m in points if m.backend == backend and m.problem.direction == direction]
            label = backend if direction == "forward" else f"{backend} [{direction}]"
            hollow = {} if direction == "forward" else {"mfc": "none"}
            low = [m.gflops - m.gflops_iqr[0] if m.gflops_iqr else 0.0 for m in mine]
            high = [m.gflops_iqr[1] - m.gflops if m.gflops_iqr else 0.0 for m in mine]
            xs = [m.problem.useful_flops() / m.moved_bytes() for m in mine]
            ax.errorbar(xs, [m.gflops for m in mine],
                        yerr=[low, high], color=_color(backend), marker=_marker(backend), ms=4, linestyle="none",
                        label=label, zorder=3, capsize=2, elinewidth=1, **hollow)
            for x, m in zip(xs, mine):
                ax.annotate(str(number[(dtype, m.problem.shape_label)]), (x, m.gflops), xytext=(3, 2),
                            textcoords="offset points", fontsize=6, color=_color(backend), zorder=4)
        intensities = [m.problem.useful_flops() / m.moved_bytes() for m in points]
        xs = np.geomspace(min(intensities) / 2, max(intensities) * 2, 200)
        for n, host in enumerate(hosts):
            peak, bandwidth = _compute_peak(peaks.get(host), dtype), bandwidths.get(host)
            if not peak or not bandwidth:
                continue
            at = "" if len(hosts) == 1 else f" @ {host}"
            ax.plot(xs, np.minimum(peak, bandwidth * xs), color="black", linestyle=["-", "--", ":"][n % 3],
                    linewidth=1, label=f"roof{at}: {peak:.0f} GFLOP/s, {bandwidth:.0f} GB/s")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (useful flop per byte of Q, K, V, O)")
        ax.set_ylabel("useful GFLOP/s (median, IQR bars)")
        ax.set_title(f"roofline, {dtype} (numbers: the cases listed below)", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        _legend_outside(ax)
    fig.tight_layout()
    return _png(fig)


def verify_budget(results, limits=None):
    """How much of each limit every backend uses: one row of panels per limit
    (err/bound, err/baseline), a histogram per backend over every tensor scored
    on a log axis, with the limit as a line. None when no result carries the ratios."""
    limits = limits or {"error_over_bound": 1.0, "error_over_baseline": {"f16": 3.0, "bf16": 3.0, "f32": 4.0, "f64": 4.0}}
    keys = [("error_over_bound", "error / a-priori bound"), ("error_over_baseline", "error / plain implementation's")]
    per_backend = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r.get("check", "golden") != "golden":  # a relation's ratios are to its own bound
            continue
        for t in r.get("tensors", []):  # every tensor scored: out, lse, the probe, y, each gradient
            for key, _ in keys:
                v = t.get(key)
                if v is not None and v > 0 and math.isfinite(v):
                    per_backend[r["backend"]][key].append(v)
    backends = sorted(b for b in per_backend if any(per_backend[b].values()))
    if not backends:
        return None
    fig, axes = plt.subplots(len(keys), 1, figsize=(9, 3.2 * len(keys)), squeeze=False)
    for row, (key, title) in enumerate(keys):
        ax = axes[row][0]
        values = [v for b in backends for v in per_backend[b][key]]
        if not values:
            ax.set_visible(False)
            continue
        limit = limits.get(key)
        # One limit, or one per dtype: a line for each distinct value.
        lines = defaultdict(list)
        if isinstance(limit, dict):
            for dtype, value in limit.items():
                lines[value].append(dtype)
        elif limit:
            lines[limit] = []
        low = min(values + list(lines) + [1.0]) / 2
        high = max(values + list(lines) + [1.0]) * 2
        bins = np.geomspace(low, high, 40)
        for n, b in enumerate(backends):
            data = per_backend[b][key]
            if data:
                ax.hist(data, bins=bins, histtype="step", linewidth=1.6, color=_color(b) or f"C{n}",
                        label=f"{b} (n={len(data)}, max {max(data):.2g})")
        for value, dtypes in sorted(lines.items()):
            ax.axvline(value, color="black", linestyle="--", linewidth=1)
            text = "limit" + (f" ({', '.join(dtypes)})" if dtypes else "")
            ax.annotate(text, (value, ax.get_ylim()[1] * 0.9), textcoords="offset points", xytext=(4, 0), fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel(title)
        ax.set_ylabel("tensors")
        ax.legend(fontsize=7, loc="upper left", ncol=2, frameon=False)
    fig.tight_layout()
    return _png(fig)
