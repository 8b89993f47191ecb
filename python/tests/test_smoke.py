"""The pytest plugin's defaults (the smoke tier) catch the classic bugs: each broken variant of the
NumPy example below FAILs at least one smoke case under `pytest -p attnbench.pytest_plugin`, and
the example itself fails none. Run through pytest itself, as a user would."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples", "python")

USER_TESTS = '''
import numpy as np
import attnbench
import broken_kernel
import numpy_kernel as nk

good = nk.attention

def _no_max(q, k, v, **kw):
    """float32 softmax without the row maximum subtracted (the example broken_kernel)."""
    return broken_kernel.attention.fn(q, k, v, scale=kw["scale"], causal=kw["causal"], mask=kw["mask"],
                                      bias=kw["bias"], kv_len=kw["kv_len"])

def _top_left(q, k, v, *, causal, **kw):
    """Causal masking aligned top-left, declared bottom-right."""
    return nk._attention(q, k, v, causal="top_left" if causal else "none", **dict(kw, align="top_left"))

def _no_right_edge(q, k, v, *, window_size, **kw):
    """A window whose right edge is ignored."""
    return nk._attention(q, k, v, window_size=(window_size[0], -1), **kw)

def _dk_unscaled(q, k, v, out, dout, *, scale, **kw):
    """A backward that forgets the scale in dK."""
    dq, dk, dv, dbias, dsinks = nk._backward(q, k, v, out, dout, scale=scale, **kw)
    return dq, (dk / scale).astype(dk.dtype), dv, dbias, dsinks

KW = ("scale", "causal", "align", "mask", "bias", "kv_len", "window_size", "softcap", "alibi_slopes", "sinks",
      "cu_seqlens_q", "cu_seqlens_k", "block_table", "cache_seqlens")
no_max = attnbench.kernel(_no_max, name="no_max", dtypes=("float32",), causal="both",
                          features=("mask", "bias", "kv_len", "causal"))
top_left = attnbench.kernel(_top_left, name="top_left", causal="bottom_right",
                            features=[f for f in attnbench.FEATURES if f != "gqa"], lse=True)
no_right_edge = attnbench.kernel(_no_right_edge, name="no_right_edge", causal="both",
                                 features=[f for f in attnbench.FEATURES if f != "gqa"], lse=True)
dk_unscaled = attnbench.kernel(nk._attention, name="dk_unscaled", causal="both", lse=True, backward=_dk_unscaled)

def test_good(attnbench_check):
    attnbench_check(good)

def test_no_max(attnbench_check):
    attnbench_check(no_max)

def test_top_left(attnbench_check):
    attnbench_check(top_left)

def test_no_right_edge(attnbench_check):
    attnbench_check(no_right_edge)

def test_dk_unscaled(attnbench_check):
    attnbench_check(dk_unscaled)
'''


def test_the_plugin_defaults_catch_the_classic_bugs(tmp_path):
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    xml = tmp_path / "junit.xml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([EXAMPLES, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "attnbench.pytest_plugin", "-p", "no:cacheprovider",
                          "-q", str(tmp_path / "test_user.py"), f"--junitxml={xml}"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode in (0, 1), run.stdout + run.stderr
    failed, passed = {}, {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        test, _, fixture = case.get("name").partition("[")
        outcome = failed if case.find("failure") is not None or case.find("error") is not None else \
            None if case.find("skipped") is not None else passed
        if outcome is not None:
            outcome.setdefault(test, []).append(fixture.rstrip("]"))
    assert "test_good" not in failed, failed.get("test_good")
    assert len(passed.get("test_good", [])) > 20, passed
    # Each bug is caught where it lives.
    assert "large_logits/scores_300_f32" in failed.get("test_no_max", []), failed
    assert any(c.startswith("causal_bottom_right/") for c in failed.get("test_top_left", [])), failed
    assert any(c.startswith("window/") for c in failed.get("test_no_right_edge", [])), failed
    assert any(c.startswith("backward/") for c in failed.get("test_dk_unscaled", [])), failed
    # and by nothing else: the variants pass the cases their bug does not reach.
    assert all(c.startswith("backward/") for c in failed["test_dk_unscaled"]), failed["test_dk_unscaled"]
