"""Assembling the report: a self-contained HTML page (plots embedded as data
URIs, no network needed) and a Markdown summary beside it."""
import base64
import html
import math
import os

from . import plots
from .results import check_summary, verify_summary

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1400px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.85em; } td, th { border: 1px solid #ddd; padding: 3px 8px; }
th { background: #f4f4f4; } table.sortable th { cursor: pointer; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.fail { background: #f8d0d0; } .pass { background: #d8f0d8; } .note { color: #666; font-size: 0.9em; }
img.plot { max-width: 100%; border: 1px solid #eee; }
"""


def _img(png, alt):
    data = base64.b64encode(png).decode("ascii")
    return f'<img class="plot" alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _peaks(files):
    peaks, bandwidths = {}, {}
    for f in files:
        peaks[f.host] = {"fp32": f.peak("fp32_gflops"), "bf16": f.peak("bf16_gflops"),
                         "amx_bf16": f.peak("amx_bf16_gflops")}
        bandwidths[f.host] = f.peak("bandwidth_gbs")
    return peaks, bandwidths


def figures(files, measurements):
    """(key, title, png or None, note) for every plot, in report order."""
    peaks, bandwidths = _peaks(files)
    return [
        ("gflops", "Throughput against sequence length", plots.gflops_vs_seq(measurements, peaks),
         "Useful GFLOP/s (causal counts only visible pairs); dotted: the machine's peak from `attn peak`."),
        ("memory", "Peak extra memory", plots.memory_vs_seq(measurements),
         "Heap growth of prepare plus the first call (log-log): O(S^2) backends climb twice as steeply."),
        ("speedup", "Speedup heatmap", plots.speedup_heatmap(measurements),
         "Median time of naive (top) or of the fastest backend (bottom) over this backend's; grey: not measured."),
        ("decode", "Decode bandwidth", plots.decode_bandwidth(measurements, bandwidths),
         "K and V bytes read once per call, against the measured read bandwidth."),
        ("roofline", "Roofline", plots.roofline(measurements, peaks, bandwidths),
         "Each case at its arithmetic intensity (useful flops over the bytes of Q, K, V and the output moved once); "
         "the roof is min(peak, bandwidth x intensity) from the same run's `attn peak` (the AMX tile peak for "
         "bfloat16 where the CPU has AMX). Decode sits on the bandwidth slope, long prefill under the flat roof."),
        ("threads", "Thread scaling", plots.thread_scaling(measurements),
         "Speedup over the fewest threads measured, against ideal linear scaling, prefill and decode apart; only "
         "drawn when the results hold several thread counts for one benchmark."),
    ]


FLOP_CONVENTION = (
    "FLOP convention: useful flops = 2 (d + dv) x batch x query heads x the query-key pairs the causal alignment "
    "leaves visible (all sq x sk pairs when not causal); a causal square case counts about half the pairs. Tools "
    "that count every pair report the dense-equivalent figure, given in the table beside it. Times are the "
    "backend's own timed region (manual time), medians over the repetitions; spreads are interquartile ranges. "
    "A case marked [backward] times the backward pass alone (after an untimed forward) and counts 2.5 times the "
    "forward's useful flops, [forward+backward] both passes and 3.5 times, as FlashAttention counts them (five "
    "matrix products against two); its roofline point moves twice (three times) the forward's bytes.")


def _pct(value, of):
    return f"{100.0 * value / of:.0f}%" if value and of else "-"


def _all_rows(files, measurements):
    """Every backend x case: the numbers a performance engineer reads first."""
    peaks, bandwidths = _peaks(files)
    rows = []
    for m in sorted(measurements, key=lambda m: (m.host, m.problem.shape_label, m.backend)):
        if not m.median_seconds:
            continue
        iqr = m.seconds_iqr
        spread = f"{iqr[0] * 1e3:.3g}-{iqr[1] * 1e3:.3g}" if iqr else "-"
        peak = plots._compute_peak(peaks.get(m.host), m.problem.dtype)
        dense = m.gflops * m.problem.dense_flops() / m.problem.useful_flops() if m.gflops else None
        bound = m.roofline_bound(peak, bandwidths.get(m.host))
        rows.append((m.host, m.backend, m.problem.shape_label, m.threads, m.repetitions,
                     f"{m.median_seconds * 1e3:.3f}", spread,
                     f"{m.gflops:.1f}" if m.gflops else "-", f"{dense:.1f}" if dense else "-", _pct(m.gflops, bound),
                     _pct(m.gflops, peak),
                     f"{m.kv_gbs:.1f}" if m.kv_gbs else "-", _pct(m.kv_gbs, bandwidths.get(m.host)),
                     f"{m.extra_mib:.2f}" if m.extra_mib is not None else "-"))
    return rows


ALL_HEADERS = ["host", "backend", "case", "threads", "repetitions", "median ms", "IQR ms", "GFLOP/s",
               "dense-equivalent GFLOP/s", "% of roofline", "% of peak", "KV GB/s", "% of bandwidth", "extra MiB"]


def _header(files, measurements):
    """Date, commit, host, threads and repetitions of every results file."""
    lines = []
    for f in files:
        c = f.context
        lines.append(f"{f.host}: {c.get('attn_cpu_model', '?')}, {c.get('date', '?')}, commit "
                     f"{c.get('attn_git_commit', '?')}, {c.get('attn_threads', '?')} threads, "
                     f"{c.get('attn_repetitions', '?')} repetitions "
                     f"({'interleaved' if c.get('attn_random_interleaving') == 'true' else 'not interleaved'}), "
                     f"preset {c.get('attn_preset', '?')}, {c.get('attn_build_type', '?')} build")
    return lines


def _verify_rows(results):
    rows = []
    for (backend, dtype), row in sorted(verify_summary(results).items()):
        worst = row["worst"]
        worst_text = "-" if worst is None else ("inf" if math.isinf(worst) else f"{worst:.3f}")
        rows.append((backend, dtype, row["PASS"], row["FAIL"], row["SKIP"], row["MISTRUSTED"], row["DIFFERS"], worst_text))
    return rows


def _check_rows(results):
    rows = []
    for (backend, check), row in sorted(check_summary(results).items()):
        rows.append((backend, check, row["PASS"], row["FAIL"], row["SKIP"], row["DIFFERS"],
                     row["EXACT"] + row["INVARIANT"], row["HOLDS"] + row["VARIES"]))
    return rows


def _table(headers, rows, classes=None, table_id=None):
    attributes = f' id="{table_id}" class="sortable"' if table_id else ""
    out = [f"<table{attributes}><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in headers) + "</tr>"]
    for n, row in enumerate(rows):
        cls = f' class="{classes[n]}"' if classes and classes[n] else ""
        cells = "".join(f'<td class="num">{html.escape(str(c))}</td>' if isinstance(c, (int, float)) or
                        str(c).replace(".", "", 1).isdigit() else f"<td>{html.escape(str(c))}</td>" for c in row)
        out.append(f"<tr{cls}>{cells}</tr>")
    out.append("</table>")
    return "\n".join(out)


def _best_rows(measurements):
    best = {}
    for m in measurements:
        if not m.median_seconds:
            continue
        key = (m.host, m.problem.text)
        if key not in best or m.median_seconds < best[key].median_seconds:
            best[key] = m
    rows = []
    for (host, _), m in sorted(best.items(), key=lambda kv: (kv[0][0], kv[1].problem.shape_label)):
        rows.append((host, m.problem.shape_label, m.backend, f"{m.median_seconds * 1e3:.2f}",
                     f"{m.gflops:.1f}" if m.gflops else "-", f"{m.kv_gbs:.1f}" if m.kv_gbs else "-"))
    return rows


def write_report(files, measurements, verify_results, weights_png, out_dir):
    """Writes out_dir/report.html (self-contained), out_dir/summary.md and the
    plots as out_dir/plots/*.png. Returns the list of plot keys drawn."""
    os.makedirs(os.path.join(out_dir, "plots"), exist_ok=True)
    drawn = []
    body = ["<h1>attnbench report</h1>"]
    md = ["# attnbench report", ""]
    hosts = sorted({f.host for f in files})
    body.append(f'<p class="note">Results from {html.escape(", ".join(hosts))}; {len(measurements)} benchmarks. '
                'Files from one host (same host name and CPU model) are pooled: their repetitions of a benchmark '
                'count together; other hosts stay side by side.</p>')
    header = _header(files, measurements)
    if header:
        body.append("<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in header) + "</ul>")
        md += [f"- {line}" for line in header] + [""]
    body.append(f'<p class="note">{html.escape(FLOP_CONVENTION)}</p>')
    md += [FLOP_CONVENTION, ""]
    for key, title, png, note in figures(files, measurements):
        if png is None:
            continue
        drawn.append(key)
        with open(os.path.join(out_dir, "plots", f"{key}.png"), "wb") as f:
            f.write(png)
        body += [f"<h2>{html.escape(title)}</h2>", f'<p class="note">{html.escape(note)}</p>', _img(png, title)]
        md += [f"## {title}", "", note, "", f"![{title}](plots/{key}.png)", ""]
        if key == "roofline":  # the key to the numbers beside its points
            cases = [(n, dtype, label) for n, dtype, label in plots.roofline_cases(measurements)]
            body += ['<p class="note">The numbers beside the points:</p>', _table(["case", "dtype", "shape"], cases)]
            md += ["| case | dtype | shape |", "| --- | --- | --- |"]
            md += [f"| {n} | {dtype} | {label} |" for n, dtype, label in cases] + [""]
    every = _all_rows(files, measurements)
    if every:
        body += ["<h2>Every backend and case</h2>",
                 '<p class="note">Click a column to sort. % of roofline is against the smaller of the same run\'s '
                 'compute peak and its read bandwidth times the case\'s arithmetic intensity (useful flops per byte '
                 'of Q, K, V and the output moved once; a paged or packed decode counts its entries\' own K and V): '
                 'how far the case is from what this machine allows. % of peak is against the compute peak alone '
                 '(float32 FMA for f32 and f16, AMX or vdpbf16ps for bf16).</p>',
                 _table(ALL_HEADERS, every, table_id="all")]
        md += ["## Every backend and case", "", "| " + " | ".join(ALL_HEADERS) + " |", "|" + " --- |" * len(ALL_HEADERS)]
        md += ["| " + " | ".join(str(c) for c in row) + " |" for row in every] + [""]
    best = _best_rows(measurements)
    if best:
        headers = ["host", "shape", "fastest backend", "median ms", "GFLOP/s", "KV GB/s"]
        body += ["<h2>Fastest backend per shape</h2>", _table(headers, best)]
        md += ["## Fastest backend per shape", "", "| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
        md += ["| " + " | ".join(str(c) for c in row) + " |" for row in best] + [""]
    skipped = sorted({(m.backend, m.skipped) for m in measurements if m.skipped})
    if skipped:
        body += ["<h2>Skipped</h2>", _table(["backend", "reason"], skipped)]
    if verify_results is not None:
        rows = _verify_rows(verify_results.results)
        headers = ["backend", "dtype", "PASS", "FAIL", "SKIP", "MISTRUSTED", "DIFFERS", "worst error/bound"]
        classes = ["fail" if r[3] else ("pass" if r[2] else "") for r in rows]
        body += ["<h2>Verification</h2>", '<p class="note">From <code>attn verify --json</code>.</p>',
                 _table(headers, rows, classes)]
        md += ["## Verification", "", "| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
        md += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows] + [""]
        checks = _check_rows(verify_results.results)
        if checks:
            headers = ["backend", "check", "PASS", "FAIL", "SKIP", "DIFFERS", "bit for bit", "within the bound"]
            classes = ["fail" if r[3] else ("pass" if r[2] else "") for r in checks]
            note = ("The checks that need no golden, each a row of its own per case: batch invariance (the same bits "
                    "alone and in other batches) and the metamorphic relations (the backend against its own results "
                    "on a transformed case); bit for bit counts EXACT and INVARIANT, within the bound HOLDS and VARIES.")
            body += ["<h3>Checks without a golden</h3>", f'<p class="note">{html.escape(note)}</p>',
                     _table(headers, checks, classes)]
            md += ["### Checks without a golden", "", note, "", "| " + " | ".join(headers) + " |",
                   "|" + " --- |" * len(headers)]
            md += ["| " + " | ".join(str(c) for c in r) + " |" for r in checks] + [""]
        budget = plots.verify_budget(verify_results.results, verify_results.limits)
        if budget is not None:
            drawn.append("budget")
            with open(os.path.join(out_dir, "plots", "budget.png"), "wb") as f:
                f.write(budget)
            note = ("How close each backend runs to its limits: per tensor scored (out, lse, the probe, each "
                    "gradient), its worst error over the a-priori bound, and its error over the plain same-precision "
                    "implementation's (dashed: the limit).")
            body += ["<h3>Budget use</h3>", f'<p class="note">{html.escape(note)}</p>', _img(budget, "budget use")]
            md += ["### Budget use", "", note, "", "![budget](plots/budget.png)", ""]
    if weights_png:
        drawn.append("weights")
        with open(os.path.join(out_dir, "plots", "weights.png"), "wb") as f:
            f.write(weights_png)
        body += ["<h2>Attention weights of a small case</h2>",
                 '<p class="note">Which key each query attends to, one panel per head (grey: hidden).</p>',
                 _img(weights_png, "attention weights")]
        md += ["## Attention weights of a small case", "", "![weights](plots/weights.png)", ""]
    for f in files:
        rows = sorted((k, v) for k, v in f.context.items() if not isinstance(v, (list, dict)))
        body += [f"<h2>Environment: {html.escape(f.host)}</h2>", _table(["key", "value"], rows)]
        md += [f"## Environment: {f.host}", ""] + [f"- {k}: {v}" for k, v in rows] + [""]
    # Marks each figure once it has decoded, so a headless browser can check that every plot drew.
    script = ("<script>window.addEventListener('load', () => { for (const img of document.images) "
              "img.dataset.drawn = (img.complete && img.naturalWidth > 0) ? '1' : '0'; "
              "document.body.dataset.figures = document.images.length; "
              # Sortable tables: a click on a header sorts by that column (numbers as numbers), again reverses.
              "for (const table of document.querySelectorAll('table.sortable')) { "
              "table.querySelectorAll('th').forEach((th, col) => th.addEventListener('click', () => { "
              "const rows = Array.from(table.rows).slice(1); const up = th.dataset.up !== '1'; th.dataset.up = up ? '1' : '0'; "
              "const key = r => { const t = r.cells[col].textContent; const n = parseFloat(t); return isNaN(n) ? t : n; }; "
              "rows.sort((a, b) => { const x = key(a), y = key(b); return (x < y ? -1 : x > y ? 1 : 0) * (up ? 1 : -1); }); "
              "rows.forEach(r => table.tBodies[0].appendChild(r)); })); } });</script>")
    page = ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>attnbench report</title>"
            f"<style>{_CSS}</style>{script}</head><body>" + "\n".join(body) + "</body></html>")
    with open(os.path.join(out_dir, "report.html"), "w") as f:
        f.write(page)
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write("\n".join(md))
    return drawn
