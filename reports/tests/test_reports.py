"""Tests of the report code, fed by stored JSON in tests/data (real `attn bench`
and `attn verify --json` output from this project, trimmed, plus small
hand-made files for a second host and for comparisons)."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from attn_report import compare, html, plots, results  # noqa: E402

DATA = os.path.join(HERE, "data")
REPORT = os.path.join(os.path.dirname(HERE), "report.py")


def data(name):
    return os.path.join(DATA, name)


class Results(unittest.TestCase):
    def test_problem_strings(self):
        p = results.parse_problem("dtype=bf16,b=2,hq=16,hkv=2,sq=1,sk=4096,d=128,dv=64,scale=0.1,causal=bottom_right")
        self.assertEqual((p.dtype, p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_k), ("bf16", 2, 16, 2, 1, 4096))
        self.assertEqual((p.head_dim, p.head_dim_v, p.causal), (128, 64, "bottom_right"))
        self.assertTrue(p.decode)
        self.assertEqual(p.shape_label, "bf16 h16:2 q1 k4096 d128 causal")
        with self.assertRaises(ValueError):
            results.parse_problem("b=1,hq=1")

    def test_bench_file(self):
        f = results.load_bench(data("bench_cpu.json"))
        self.assertEqual(f.host, "vm")
        self.assertGreater(f.peak("fp32_gflops"), 100)
        by = {(m.backend, m.problem.text): m for m in f.measurements}
        streaming = by[("streaming", "dtype=f32,b=1,hq=8,hkv=8,sq=4096,sk=4096,d=64,dv=64,scale=0.125")]
        self.assertGreater(streaming.gflops, 50)
        self.assertGreater(streaming.extra_mib, 0)
        skipped = [m for m in f.measurements if m.skipped]
        self.assertTrue(any("no CUDA device" in m.skipped for m in skipped))
        self.assertTrue(all(not m.seconds for m in skipped))

    def test_roofline_bound_is_the_smaller_of_peak_and_bandwidth_times_intensity(self):
        f = results.load_bench(data("bench_cpu.json"))
        by = {(m.backend, m.problem.text): m for m in f.measurements}
        decode = by[("streaming", "dtype=f32,b=1,hq=8,hkv=8,sq=1,sk=65536,d=64,dv=64,scale=0.125")]
        prefill = by[("streaming", "dtype=f32,b=1,hq=8,hkv=8,sq=4096,sk=4096,d=64,dv=64,scale=0.125")]
        # Decode: K and V (65536 x 8 heads x 128 floats) and Q and O (8 x 128 floats) moved once, 2 flops per
        # 4-byte element of K and V: on the bandwidth slope, at half the bandwidth in GFLOP/s.
        kv = 65536 * 8 * 128 * 4
        self.assertAlmostEqual(decode.moved_bytes() / (kv + 8 * 128 * 4), 1.0, places=6)
        self.assertAlmostEqual(decode.roofline_bound(200.0, 40.0), 40.0 * decode.problem.useful_flops() / decode.moved_bytes())
        self.assertAlmostEqual(decode.roofline_bound(200.0, 40.0), 20.0, delta=0.01)
        # A paged decode moves its entries' own K and V (what the bench counted), not the table's capacity.
        paged = results.Measurement(host="vm", backend="streaming", name="x", threads=2, problem=results.parse_problem(
            "dtype=bf16,b=8,hq=32,hkv=8,sq=1,sk=4096,d=128,dv=128,scale=0.088,causal=bottom_right,paged=16x2049"))
        paged.seconds, paged.kv_bytes = [0.01], [3.0e9]  # 30 MB a call, where the capacity holds 134 MB
        self.assertAlmostEqual(paged.moved_bytes(), 3.0e7 + 2 * 8 * 32 * 256, places=3)
        self.assertLess(paged.moved_bytes(), paged.problem.min_bytes() / 4)
        # Prefill: intensity in the hundreds, under the flat roof.
        self.assertEqual(prefill.roofline_bound(200.0, 40.0), 200.0)
        self.assertIsNone(prefill.roofline_bound(None, 40.0))

    def test_backward_directions_are_cases_of_their_own_with_their_flops(self):
        # attn bench --direction forward,backward,forward+backward (bench_backward.json, a real run).
        f = results.load_bench(data("bench_backward.json"))
        by = {(m.backend, m.problem.direction): m for m in f.measurements}
        self.assertEqual({d for _, d in by}, {"forward", "backward", "forward+backward"})
        forward, backward, both = (by[("streaming", d)] for d in ("forward", "backward", "forward+backward"))
        self.assertAlmostEqual(backward.problem.useful_flops() / forward.problem.useful_flops(), 2.5)
        self.assertAlmostEqual(both.problem.useful_flops() / forward.problem.useful_flops(), 3.5)
        self.assertEqual(backward.problem.min_bytes(), 2 * forward.problem.min_bytes())
        self.assertTrue(backward.problem.shape_label.endswith("[backward]"))
        self.assertNotEqual(backward.problem.text, forward.problem.text)
        self.assertEqual(len({m.problem.shape_label for m in f.measurements if m.backend == "streaming"}), 3)
        # The backward panels beside the forward ones, and every direction on the roofline.
        self.assertIsNotNone(plots.gflops_vs_seq(f.measurements, {"vm": {"fp32": 200.0}}))
        self.assertEqual(len(plots.roofline_cases(f.measurements)), 3)

    def test_repetitions_and_aggregates(self):
        f = results.load_bench(data("compare_new.json"))
        self.assertEqual(len(f.measurements), 2)  # aggregates are not measurements
        slow = next(m for m in f.measurements if m.backend == "streaming")
        self.assertEqual(len(slow.seconds), 5)
        self.assertAlmostEqual(slow.median_seconds, 12.0e-3)

    def test_merging_hosts(self):
        files = [results.load_bench(data("bench_cpu.json")), results.load_bench(data("bench_gpu.json"))]
        merged = results.merge(files)
        self.assertEqual({m.host for m in merged}, {"vm", "gpu-host"})
        twice = [results.load_bench(data("bench_cpu.json")), results.load_bench(data("compare_base.json"))]
        self.assertEqual(len({m.host for m in results.merge(twice)}), 2)  # same host name, another CPU: apart
        # Two files of one machine are one host: each benchmark's repetitions pooled (5 + 5).
        same = [results.load_bench(data("gate_same_commit_a.json")), results.load_bench(data("gate_same_commit_b.json"))]
        pooled = results.merge(same)
        self.assertEqual(len({m.host for m in pooled}), 1)
        self.assertEqual(len(pooled), 9)
        self.assertTrue(all(m.repetitions == 10 for m in pooled), [m.repetitions for m in pooled])
        q1, q3 = pooled[0].gflops_iqr
        self.assertLessEqual(q1, pooled[0].gflops)
        self.assertLessEqual(pooled[0].gflops, q3)

    def test_verify_summary(self):
        summary = results.verify_summary(results.load_verify(data("verify.json")))
        naive_f32 = summary[("naive", "f32")]
        self.assertGreater(naive_f32["PASS"], 0)
        self.assertEqual(naive_f32["FAIL"], 0)
        self.assertLess(naive_f32["worst"], 1)
        self.assertEqual(summary[("blocked", "f64")]["SKIP"], 1)
        self.assertEqual(summary[("broken", "bf16")]["FAIL"], 1)

    def test_checks_without_a_golden_are_their_own_rows(self):
        # A relation row far beyond its bound and a VARIES row: neither moves the
        # golden table (its counts, its worst error/bound); both count in the
        # checks' table, by how they held.
        base = results.load_verify(data("verify.json"))
        golden = results.verify_summary(base)
        extra = [dict(base[0], check="relation v_scale", verdict="FAIL", reason="v_scale (V x 8) breaks: ...",
                      tensors=[{"name": "out", "error_over_bound": 1e6}]),
                 dict(base[0], check="relation layout", verdict="PASS", reason="EXACT: layout ...", tensors=[]),
                 dict(base[0], check="batch invariance", verdict="DIFFERS", reason="VARIES in 1 of 9 ...", tensors=[])]
        mixed = results.VerifyResults(list(base) + extra, base.limits)
        self.assertEqual(results.verify_summary(mixed), golden)
        checks = results.check_summary(mixed)
        backend = base[0]["backend"]
        self.assertEqual(checks[(backend, "relation v_scale")]["FAIL"], 1)
        self.assertEqual(checks[(backend, "relation layout")]["EXACT"], 1)
        self.assertEqual(checks[(backend, "batch invariance")]["VARIES"], 1)
        self.assertEqual(results.check_summary(base), {})

    def test_detect_and_errors(self):
        self.assertEqual(results.detect(data("verify.json"))[0], "verify")
        self.assertEqual(results.detect(data("bench_gpu.json"))[0], "bench")
        with self.assertRaises(ValueError):
            results.load_verify(data("bench_gpu.json"))
        with self.assertRaises(ValueError):
            results.load_bench(data("verify.json"))

    def test_inputs_are_checked_against_the_report_input_schema(self):
        # A value of the wrong type, a verdict that does not exist, a file that
        # is not JSON: each names the file and the field, and the report exits 2.
        with tempfile.TemporaryDirectory() as tmp:
            cases = {
                "time.json": ({"context": {}, "benchmarks": [{"name": "naive/dtype=f32,b=1", "real_time": "fast"}]},
                              "benchmarks/0/real_time: 'fast' is not of type 'number'"),
                "verdict.json": ({"schema": "attn-verify-1", "results": [{"backend": "naive", "problem": "p",
                                                                           "verdict": "OK"}]},
                                 "results/0/verdict: 'OK' is not one of"),
                "peak.json": ({"context": {"attn_peak_fp32_gflops": "lots"}, "benchmarks": []},
                              "context/attn_peak_fp32_gflops"),
            }
            for name, (doc, words) in cases.items():
                path = os.path.join(tmp, name)
                with open(path, "w") as f:
                    json.dump(doc, f)
                with self.assertRaises(ValueError) as caught:
                    results.detect(path)
                self.assertIn(path, str(caught.exception))
                self.assertIn(words, str(caught.exception))
            with open(os.path.join(tmp, "broken.json"), "w") as f:
                f.write('{"context": ')
            run = subprocess.run([sys.executable, REPORT, "report", os.path.join(tmp, "broken.json"), "--out",
                                  os.path.join(tmp, "out")], capture_output=True, text=True)
            self.assertEqual(run.returncode, 2, run.stderr)
            self.assertIn("broken.json: not JSON", run.stderr)
            # What attnbench itself wrote passes.
            for sample in ("bench_cpu.json", "bench_gpu.json", "compare_base.json", "verify.json"):
                results.detect(data(sample))


class Compare(unittest.TestCase):
    def test_one_sided_benchmarks_and_different_machines_are_said(self):
        with open(data("gate_same_commit_a.json")) as f:
            raw = json.load(f)
        base = results.load_bench(data("gate_same_commit_a.json"), raw)
        moved = json.loads(json.dumps(raw))
        moved["context"]["attn_peak_fp32_gflops"] = float(raw["context"]["attn_peak_fp32_gflops"]) / 4
        moved["benchmarks"] = [b for b in raw["benchmarks"] if "sq=1024" not in b["name"]]
        first = raw["benchmarks"][0]
        renamed = "newcomer/" + first.get("run_name", first["name"]).split("/", 1)[1]
        moved["benchmarks"].append(dict(first, name=renamed, run_name=renamed))
        new = results.load_bench(data("gate_same_commit_a.json"), moved)
        warnings = compare.machine_warnings(base, new)
        self.assertEqual(len(warnings), 1, warnings)
        self.assertIn("float32 FMA peak differ 4.0x", warnings[0])
        self.assertEqual(compare.machine_warnings(base, base), [])
        only_base, only_new = compare.one_sided(base.measurements, new.measurements)
        self.assertTrue(only_base and all("sq=1024" in name for name in only_base), only_base)
        self.assertEqual(only_new, [renamed])

    def test_significant_slowdown_is_a_regression(self):
        base = results.load_bench(data("compare_base.json")).measurements
        new = results.load_bench(data("compare_new.json")).measurements
        changes = {c.name.split("/")[0]: c for c in compare.compare(base, new)}
        self.assertAlmostEqual(changes["streaming"].change_pct, 20.0, places=6)
        self.assertTrue(changes["streaming"].significant)
        self.assertEqual(changes["streaming"].verdict, "slower")
        self.assertFalse(changes["blocked"].significant)
        self.assertEqual(changes["blocked"].verdict, "same (not significant)")
        self.assertEqual([c.name.split("/")[0] for c in compare.regressions(changes.values(), 10)], ["streaming"])
        self.assertEqual(compare.regressions(changes.values(), 25), [])

    def test_the_minimum_repetitions_follow_from_the_test(self):
        # 3 against 3 can never reach p < 0.05 (the exact test's smallest p is 0.1); 4 against 4 can (0.029).
        self.assertAlmostEqual(compare.smallest_p(3, 3), 0.1)
        self.assertLess(compare.smallest_p(4, 4), 0.05)
        self.assertEqual(compare.MIN_REPETITIONS, 4)

    def test_single_runs_are_inconclusive_never_a_pass_or_a_fail(self):
        cpu = results.load_bench(data("bench_cpu.json")).measurements
        changes = compare.compare(cpu, cpu)
        self.assertTrue(changes)
        self.assertTrue(all(c.p_value is None and c.verdict.startswith("too few repetitions") for c in changes))
        code, lines = compare.gate(changes, 10)
        self.assertEqual(code, compare.INCONCLUSIVE)
        self.assertIn("cannot be judged", "\n".join(lines))
        self.assertIn("benchmark", compare.format_table(changes))

    def test_two_runs_of_one_commit_on_different_host_states_never_fail(self):
        # Stored runs of `attn bench --preset quick -b blocked,streaming,openblas '--benchmark_filter=sq=(1|1024),'`
        # on the AMD EPYC development host (2026-12-01), 5 interleaved repetitions each: two at 2 threads from
        # one commit a minute apart, whose `attn peak` read bandwidth moved 1.56x (47.4 and 30.4 GB/s) while
        # the decodes ran 16-32% faster; and one at 1 thread, whose peaks halved with its times.
        run = lambda *args: subprocess.run([sys.executable, REPORT, "compare", *args], capture_output=True, text=True)
        same = run(data("gate_same_commit_a.json"), data("gate_same_commit_b.json"), "--fail-on-regression", "10")
        self.assertEqual(same.returncode, compare.INCONCLUSIVE, same.stdout)
        self.assertIn("6 benchmark(s) judged by their fraction of their own run's `attn peak` limit", same.stdout)
        self.assertIn("3 benchmark(s) not judged", same.stdout)
        self.assertIn("read bandwidth differ 1.56x", same.stdout)
        # On raw times (no peaks) the same pair judges all nine and finds no regression either.
        base = results.load_bench(data("gate_same_commit_a.json")).measurements
        other = results.load_bench(data("gate_same_commit_b.json")).measurements
        self.assertEqual(compare.regressions(compare.compare(base, other), 10), [])
        # The one-thread run's machine limits halved with its times: not judged, never a FAIL.
        slow = run(data("gate_same_commit_a.json"), data("gate_one_thread.json"), "--fail-on-regression", "10")
        self.assertEqual(slow.returncode, compare.INCONCLUSIVE, slow.stdout)
        self.assertNotIn("slower by more than", slow.stdout)

    def test_a_slowdown_of_the_code_fails_and_one_of_the_machine_is_scaled_away(self):
        with open(data("gate_same_commit_a.json")) as f:
            raw = json.load(f)
        base = results.load_bench(data("gate_same_commit_a.json"), raw)

        def slower(factor, peaks_factor):
            moved = json.loads(json.dumps(raw))
            for b in moved["benchmarks"]:
                if b.get("run_name", b["name"]).startswith("streaming/"):
                    for key in ("real_time", "cpu_time"):
                        if key in b:
                            b[key] *= factor
            for key in ("fp32_gflops", "bf16_gflops", "bandwidth_gbs"):
                moved["context"][f"attn_peak_{key}"] = float(raw["context"][f"attn_peak_{key}"]) * peaks_factor
            return results.load_bench(data("gate_same_commit_a.json"), moved)

        # streaming 30% slower on the same machine: a regression of the code.
        code_slower = slower(1.3, 1.0)
        code, lines = compare.gate(compare.compare(base.measurements, code_slower.measurements, base, code_slower), 10)
        self.assertEqual(code, compare.REGRESSED, lines)
        self.assertTrue(all(n.strip().startswith("streaming/") for n in "\n".join(lines).split("significant")[-1]
                            .split("\n")[1:] if n.startswith("  ")), lines)
        # The same times with every limit 1/1.3 of the base run's: the machine was slower, not the code.
        machine_slower = slower(1.3, 1 / 1.3)
        changes = compare.compare(base.measurements, machine_slower.measurements, base, machine_slower)
        self.assertEqual(compare.regressions(changes, 10), [])
        self.assertTrue(all(c.limit and abs(c.factor - 1 / 1.3) < 1e-9 for c in changes))
        # Decode is judged by the bandwidth, prefill by its dtype's compute peak.
        limits = {c.name.split("/")[1].split(",")[0] + ("/decode" if "sq=1," in c.name else ""): c.limit for c in changes}
        self.assertEqual(limits["dtype=f32/decode"], "bandwidth_gbs")
        self.assertEqual(limits["dtype=f32"], "fp32_gflops")
        self.assertEqual(limits["dtype=bf16"], "bf16_gflops")

    def test_command_line_exit_codes(self):
        run = lambda *args: subprocess.run([sys.executable, REPORT, "compare", *args], capture_output=True, text=True)
        self.assertEqual(run(data("compare_base.json"), data("compare_new.json")).returncode, 0)
        failing = run(data("compare_base.json"), data("compare_new.json"), "--fail-on-regression", "10")
        self.assertEqual(failing.returncode, 1)
        self.assertIn("slower by more than 10.0% and significant", failing.stdout)
        self.assertEqual(run(data("compare_base.json"), data("compare_new.json"), "--fail-on-regression", "30").returncode, 0)
        single = run(data("bench_cpu.json"), data("bench_cpu.json"), "--fail-on-regression", "10")
        self.assertEqual(single.returncode, compare.INCONCLUSIVE, single.stdout)
        self.assertEqual(run(data("verify.json"), data("compare_new.json")).returncode, 2)


class Report(unittest.TestCase):
    def setUp(self):
        self.out = tempfile.mkdtemp()

    def tearDown(self):
        shutil.rmtree(self.out)

    def write(self, names, verify=True, weights=None):
        files = [results.load_bench(data(n)) for n in names]
        verify_results = results.load_verify(data("verify.json")) if verify else None
        return html.write_report(files, results.merge(files), verify_results, weights, self.out)

    def test_the_table_roofline_header_and_flop_convention(self):
        drawn = self.write(["gate_same_commit_a.json"], verify=False)
        self.assertIn("roofline", drawn)
        with open(os.path.join(self.out, "report.html")) as f:
            page = f.read()
        self.assertIn('<table id="all" class="sortable">', page)
        for header in html.ALL_HEADERS:
            self.assertIn(f"<th>{header}</th>", page)
        # One row per measured benchmark, with its repetitions and a % of the run's own peak.
        table = page.split('<table id="all"')[1].split("</table>")[0]
        self.assertEqual(table.count("<tr>") - 1, 9)
        self.assertRegex(table, r'<td class="num">5</td>')
        self.assertRegex(table, r"\d+%</td>")
        self.assertIn("FLOP convention", page)
        self.assertIn("5 repetitions (interleaved)", page)
        self.assertIn("commit", page)

    def test_backends_from_outside_get_stable_distinct_colours(self):
        self.assertEqual(plots._color("my-backend"), plots._color("my-backend"))
        self.assertNotIn(plots._color("my-backend"), plots._STYLE.values())
        self.assertNotIn(plots._color("someone-elses"), plots._STYLE.values())
        self.assertIsNotNone(plots._marker("my-backend"))

    def test_the_python_peers_have_their_own_colours(self):
        peers = [plots._color(b) for b in ("py-numpy", "py-torch", "py-tensorflow")]
        builtin = [plots._color(b) for b in ("naive", "blocked", "streaming", "openblas", "onednn")]
        self.assertEqual(len(set(peers + builtin)), len(peers) + len(builtin))
        self.assertFalse(set(plots._STYLE.values()) & set(plots._EXTRA_COLORS))

    def test_every_plot_is_drawn_and_embedded(self):
        png = b"\x89PNG\r\n\x1a\n" + b"0" * 64
        drawn = self.write(["bench_cpu.json", "bench_gpu.json"], weights=png)
        self.assertEqual(drawn, ["gflops", "memory", "speedup", "decode", "roofline", "budget", "weights"])
        with open(os.path.join(self.out, "report.html")) as f:
            page = f.read()
        self.assertEqual(page.count('<img class="plot"'), len(drawn))
        self.assertNotRegex(page, r"(src|href)=\"https?:")  # self-contained: nothing fetched
        for key in drawn:
            with open(os.path.join(self.out, "plots", f"{key}.png"), "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        self.assertIn("gpu-host", page)
        self.assertIn("Verification", page)
        self.assertIn("attn_peak_fp32_gflops", page)  # the environment context
        with open(os.path.join(self.out, "summary.md")) as f:
            summary = f.read()
        self.assertIn("![Throughput against sequence length](plots/gflops.png)", summary)
        self.assertRegex(summary, r"\| broken \| bf16 \| 0 \| 1 \|")

    def test_the_heatmap_draws_nothing_outside_its_image(self):
        """attn show --heatmap: tick labels, axis labels and the colour bar's
        label stay inside the image, on the linear and the logarithmic scale."""
        import heatmap
        import matplotlib.pyplot as plt
        original = plt.Figure.savefig
        boxes = []

        def spy(fig, *args, **kwargs):
            fig.canvas.draw()
            boxes.append((fig.get_tightbbox(fig.canvas.get_renderer()), fig.get_size_inches()))
            return original(fig, *args, **kwargs)

        plt.Figure.savefig = spy
        try:
            for heads, queries, keys in ((1, 4, 4), (8, 10, 10), (2, 100, 1000)):
                spec = {"title": "weights", "heads": [
                    {"label": f"head {h}", "weights": [[(i + j + 1) / (keys * queries) for j in range(keys)]
                                                       for i in range(queries)],
                     "hidden": [[False] * keys for _ in range(queries)]} for h in range(heads)]}
                heatmap.draw(spec, os.path.join(self.out, "h.png"))
        finally:
            plt.Figure.savefig = original
        for box, (width, height) in boxes:
            self.assertGreaterEqual(box.x0, 0)
            self.assertGreaterEqual(box.y0, 0)
            self.assertLessEqual(box.x1, width)
            self.assertLessEqual(box.y1, height)

    def test_roofline_points_carry_their_case_numbers(self):
        self.write(["bench_cpu.json"], verify=False)
        with open(os.path.join(self.out, "report.html")) as f:
            page = f.read()
        key = page.split("The numbers beside the points:")[1].split("</table>")[0]
        measured = {(m.problem.dtype, m.problem.shape_label)
                    for m in results.load_bench(data("bench_cpu.json")).measurements if m.gflops}
        self.assertEqual(key.count("<tr>") - 1, len(measured))
        self.assertEqual([n for n, _, _ in plots.roofline_cases(results.load_bench(data("bench_cpu.json")).measurements)],
                         list(range(1, len(measured) + 1)))

    def test_budget_histogram_draws_both_limits(self):
        rows = [{"backend": "naive", "verdict": "PASS",
                 "tensors": [{"name": "out", "error_over_bound": 0.05, "error_over_baseline": 1.1}]},
                {"backend": "mine", "verdict": "FAIL",
                 "tensors": [{"name": "dq", "error_over_bound": 0.2, "error_over_baseline": 7.0}]},
                {"backend": "mine", "verdict": "SKIP", "tensors": []}]
        png = plots.verify_budget(results.VerifyResults(rows, {"error_over_bound": 1, "error_over_baseline": {"f16": 3, "f32": 4}}))
        self.assertEqual(png[:8], b"\x89PNG\r\n\x1a\n")
        self.assertIsNone(plots.verify_budget([{"backend": "naive", "verdict": "SKIP", "tensors": []}]))

    def test_thread_scaling_appears_with_several_thread_counts(self):
        one = results.load_bench(data("bench_cpu.json"))
        two = results.load_bench(data("bench_cpu.json"))
        for m in two.measurements:
            m.threads = 1
            m.flops = [f / 1.8 for f in m.flops]
        two.host = one.host
        drawn = html.write_report([one], one.measurements + two.measurements, None, None, self.out)
        self.assertIn("threads", drawn)

    def test_headless_chromium_draws_every_plot(self):
        browser = shutil.which("chromium") or shutil.which("chromium-browser")
        if not browser:
            self.skipTest("chromium is not installed: the rendering check needs Debian's chromium")
        self.write(["bench_cpu.json"], weights=None)
        page = os.path.join(self.out, "report.html")
        dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                              "--dump-dom", f"file://{page}"], capture_output=True, text=True, timeout=120).stdout
        images = re.findall(r"<img[^>]*>", dom)
        self.assertEqual(len(images), 6)  # gflops, memory, speedup, decode, roofline, budget
        self.assertIn('<table id="all" class="sortable">', dom)
        for img in images:
            self.assertIn('data-drawn="1"', img)


if __name__ == "__main__":
    unittest.main()
