"""Verdicts from Python are attn verify's.

1. Built-in backends: attnbench.verify over the fixture folders make verify runs (the standard
   suite, tests/data, ONNX's conformance cases), against the JSON of ctest's verify.make_verify
   (ATTN_MAKE_VERIFY_JSON): the backends' results at make verify's first thread count and layout
   compared, field by field, but the seconds. `make test` takes a sample (the smoke tier, the
   first two cases of every folder, every tenth case: every kind of case the module passes on);
   `make test-full` (ATTN_TEST_FULL) every case.
2. Python kernels: the examples (a correct NumPy kernel, forward and backward, and the broken
   softmax) through attnbench.verify and through `attn verify --plugin` on the smoke tier and the
   float32 and float64 cases with gradients or large logits: the same results.
"""

import json
import os
import subprocess
import sys

import pytest

import attnbench

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples", "python")
sys.path.insert(0, EXAMPLES)

# One CPU backend that runs every case (forward, backward, every dtype but float64) and one that
# SKIPs here (no device): the module's path is the same code for every backend, so a second CPU
# backend would prove the same thing again at twice the CI time.
BACKENDS = ["streaming", "cuda-flash"]


def comparable(result):
    return {k: v for k, v in result.items() if k != "seconds"}


def keyed(results, backends):
    out = {}
    for r in results:
        if r["backend"] in backends and r.get("check", "golden") == "golden":  # the golden comparison's rows
            key = (r["backend"], os.path.abspath(r["file"]), r["threads"], r["layout"], r.get("direction", "forward"))
            assert key not in out, key
            out[key] = comparable(r)
    return out


def assert_same(ours, theirs):
    assert set(ours) == set(theirs), (sorted(set(ours) ^ set(theirs))[:5])
    differing = [k for k in ours if ours[k] != theirs[k]]
    assert not differing, "\n".join(f"{k}:\n  python {ours[k]}\n  attn   {theirs[k]}" for k in differing[:3])


def sample(cases):
    """The smoke tier, the first two cases of every folder and every tenth case."""
    seen = {}
    kept = []
    for n, c in enumerate(sorted(cases, key=lambda c: c.path)):
        folder = os.path.dirname(os.path.abspath(c.path))
        seen[folder] = seen.get(folder, 0) + 1
        if "smoke" in c.tags or seen[folder] <= 2 or n % 10 == 0:
            kept.append(c)
    return kept


def test_builtin_backends_on_every_standard_case():
    path = os.environ.get("ATTN_MAKE_VERIFY_JSON")
    if not path or not os.path.exists(path):
        pytest.skip("ATTN_MAKE_VERIFY_JSON names no JSON of make verify's run (ctest runs verify.make_verify first)")
    with open(path) as f:
        theirs = json.load(f)
    folders = os.environ["ATTN_FIXTURE_FOLDERS"].split(os.pathsep)
    cases = attnbench.cases(path=folders, kinds=None)
    standard = attnbench.cases(kinds=None)
    assert {c.path for c in standard} <= {c.path for c in cases}
    if not os.environ.get("ATTN_TEST_FULL"):
        cases = sample(cases)
        standard = [c for c in standard if c in cases]
    # One of make verify's run configurations (its first thread count and layout): each result
    # of a configuration stands alone, so the others' are the same code again.
    threads, layouts = theirs["run"]["threads"][:1], theirs["run"]["layouts"][:1]
    report = attnbench.verify(BACKENDS, cases, threads=threads, layouts=layouts)
    ours = report.json
    assert len(report.verdicts) == len(BACKENDS) * len(cases)
    mine = keyed(ours["results"], BACKENDS)
    asked = {os.path.abspath(c.path) for c in cases}
    assert_same(mine, {k: r for k, r in keyed(theirs["results"], BACKENDS).items()
                       if k[2] == threads[0] and k[3] == layouts[0] and k[1] in asked})
    files = {os.path.abspath(c.path) for c in standard}
    assert files <= {k[1] for k in mine}, "every standard case asked for has a result"
    assert ours["input_errors"] == theirs["input_errors"]
    assert (ours["schema"], ours["tool"], ours["host"]) == (theirs["schema"], theirs["tool"], theirs["host"])


def attn_verify(plugin, backend, files, tmp_path):
    # The golden rows are compared: the checks without a golden (attn verify's
    # default, attnbench.verify's opt-in) would only run the kernel again.
    out = tmp_path / f"{backend}.json"
    run = subprocess.run([os.environ["ATTN_CLI"], "verify", *files, "--plugin", plugin, "-b", backend, "--quiet",
                          "--skip-check", "invariance,relations", "--json", str(out)], capture_output=True, text=True)
    return run.returncode, json.loads(out.read_text())


@pytest.mark.parametrize("example, backend, exit_code", [("numpy_kernel", "numpy-attention", 0),
                                                         ("broken_kernel", "broken-softmax", 1)])
def test_python_kernels_as_attn_plugins(example, backend, exit_code, tmp_path):
    module = __import__(example)
    cases = attnbench.cases("smoke") + [c for c in attnbench.cases("full", dtypes=["float32", "float64"])
                                        if c.gradients or c.name.startswith(("large_logits/", "rescale/"))]
    files = [c.path for c in cases]
    code, theirs = attn_verify(os.path.join(EXAMPLES, f"{example}.py"), backend, files, tmp_path)
    report = attnbench.verify(module.BACKEND, cases)
    assert (report.exit_code, code) == (exit_code, exit_code), report.report()
    assert_same(keyed(report.json["results"], [backend]), keyed(theirs["results"], [backend]))
    verdicts = {r["verdict"] for r in theirs["results"]}
    assert ("FAIL" in verdicts) == (exit_code == 1)
