#!/usr/bin/env python3
"""attnbench reports (run by `attn report`, or directly):

  report.py report RESULT.json... [--verify VERIFY.json] [--weights PNG] --out DIR
  report.py compare BASE.json NEW.json [--fail-on-regression PCT]

RESULT files may come from several machines; a file's kind is read from its
content, so a VERIFY file may also be given among the results."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from attn_report import compare as cmp  # noqa: E402
from attn_report import html as report_html  # noqa: E402
from attn_report import results  # noqa: E402


def run_report(args):
    bench_files, verify = [], None
    for path in args.results + ([args.verify] if args.verify else []):
        kind, data = results.detect(path)
        if kind == "bench":
            bench_files.append(results.load_bench(path, data))
        else:
            verify = results.load_verify(path, data)
    if not bench_files and verify is None:
        sys.exit("report: no results given")
    measurements = results.merge(bench_files)
    weights = None
    if args.weights:
        with open(args.weights, "rb") as f:
            weights = f.read()
    drawn = report_html.write_report(bench_files, measurements, verify, weights, args.out)
    # No folder in the message: attn draws into a temporary one and names the final one itself.
    print(f"wrote report.html and summary.md ({len(drawn)} plots: {', '.join(drawn)})")
    return 0


def run_compare(args):
    base_file, new_file = results.load_bench(args.base), results.load_bench(args.new)
    base, new = base_file.measurements, new_file.measurements
    changes = cmp.compare(base, new, base_file, new_file)
    if not changes:
        sys.exit("compare: the two files share no benchmark")
    for line in cmp.machine_warnings(base_file, new_file):
        print(line)
    print(cmp.format_table(changes))
    only_base, only_new = cmp.one_sided(base, new)
    for names, side in ((only_base, "only in the base run"), (only_new, "only in the new run")):
        if names:
            print(f"\n{len(names)} benchmark(s) {side}, not compared:")
            print("\n".join(f"  {name}" for name in names))
    if args.fail_on_regression is not None:
        code, lines = cmp.gate(changes, args.fail_on_regression)
        print()
        print("\n".join(lines))
        return code
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description="attnbench reports")
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("report")
    r.add_argument("results", nargs="+")
    r.add_argument("--verify")
    r.add_argument("--weights")
    r.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("base")
    c.add_argument("new")
    c.add_argument("--fail-on-regression", type=float)
    args = parser.parse_args(argv)
    try:
        return run_report(args) if args.command == "report" else run_compare(args)
    except (ValueError, OSError) as error:
        print(f"attn: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
