"""attnbench's Python API: cases, kernel declarations, check, verify (NumPy only: Debian's
python3-numpy; the frameworks are test_frameworks.py's)."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import attnbench
from kernels import plain, plain_backward, reference

FULL = attnbench.cases("full")
BY_NAME = {c.name: c for c in FULL}


def named(name):
    return BY_NAME[name]


# --- cases ------------------------------------------------------------------------------------

def test_tiers_and_filters():
    smoke = attnbench.cases("smoke")
    assert smoke and {c.name for c in smoke} < {c.name for c in FULL}
    assert all("smoke" in c.tags for c in smoke)
    assert [c.name for c in FULL] == sorted(c.name for c in FULL)
    f32 = attnbench.cases("full", dtypes=["float32"])
    assert f32 and all(c.dtype == "float32" for c in f32)
    assert any(c.dtype != "float32" for c in FULL)
    plain_only = attnbench.cases("full", features=())
    assert plain_only and all(c.features == () for c in plain_only)
    masked = attnbench.cases("full", features=("mask",))
    assert {c.name for c in plain_only} < {c.name for c in masked}
    grads = attnbench.cases("full", gradients=True)
    assert grads and all(c.gradients and c.format_version == 3 for c in grads)
    assert all(c.kind == "sdpa" for c in FULL)
    assert any(c.kind == "layer" for c in attnbench.cases("full", kinds=None))
    with pytest.raises(ValueError, match="tier 'medium'"):
        attnbench.cases("medium")


def test_case_features_and_inputs():
    c = named("kv_len/b3_q17_k65_f16")
    assert "kv_len" in c.features and c.problem.kv_len
    x = c.inputs()
    p = c.problem
    assert x.q.shape == (p.batch, p.heads_q, p.seq_q, p.head_dim) and x.q.dtype == np.float64
    assert x.kv_len.shape == (p.batch,)
    # The golden is the float64 truth of these inputs.
    out, _ = reference(x.q, x.k, x.v, scale=p.scale, causal=p.causal, mask=x.mask, bias=x.bias, kv_len=x.kv_len)
    assert np.allclose(out, x.out, rtol=0, atol=1e-12)
    assert attnbench.case(c.path) == c


def test_a_missing_fixture_is_a_clear_error(tmp_path):
    with pytest.raises((ValueError, RuntimeError), match="no-such"):
        attnbench.case(tmp_path / "no-such.h5")
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"not an HDF5 file")
    with pytest.raises((ValueError, RuntimeError), match="bad.h5"):
        attnbench.case(bad)


# --- declarations -----------------------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    ({"dtypes": ("float8",)}, "dtype 'float8'"),
    ({"layout": "sbhd"}, "layout 'sbhd'"),
    ({"causal": "diagonal"}, "causal 'diagonal'"),
    ({"framework": "mxnet"}, "framework 'mxnet'"),
    ({"features": ("flash",)}, "features"),
    ({"features": ("window",)}, "declares the feature 'window' but its signature takes no `window_size`"),
    ({"features": ("paged",)}, "takes no `block_table`, `cache_seqlens` argument"),
    ({"backward": "autograd"}, "NumPy has no autograd"),
    ({"empty_rows": "inf"}, "empty_rows 'inf'"),
])
def test_bad_declarations_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        attnbench.kernel(plain, **options)


def test_the_signature_says_what_a_kernel_supports():
    def no_mask(q, k, v, *, scale, causal):
        return plain(q, k, v, scale=scale, causal=causal, mask=None, bias=None, kv_len=None)

    k = attnbench.kernel(no_mask)
    v = attnbench.check(k, named("mask/random_2x3x17_f32"))
    assert v.verdict == "SKIP" and "takes no mask" in v.reason
    v = attnbench.check(k, named("causal_top_left/q33_k33_f32"))
    assert v.verdict == "PASS", v.report()

    def no_scale(q, k, v, *, causal, mask, bias, kv_len):
        return plain(q, k, v, scale=1 / np.sqrt(q.shape[-1]), causal=causal, mask=mask, bias=bias, kv_len=kv_len)

    scaled = [c for c in FULL if c.dtype == "float32" and abs(c.problem.scale * np.sqrt(c.problem.head_dim) - 1) > 1e-9
              and set(c.features) <= {"mask", "bias", "kv_len", "causal", "gqa"}]
    assert scaled, "the suite holds a case with a scale other than 1/sqrt(d)"
    v = attnbench.check(no_scale, scaled[0])
    assert v.verdict == "SKIP" and "takes no scale" in v.reason
    v = attnbench.check(no_scale, named("mha/b2_h4_q17_k33_d64_f32"))
    assert v.verdict == "PASS", v.report()


def test_gqa_causal_alignment_and_dtypes_are_skips_with_reasons():
    k = attnbench.kernel(plain, gqa=False)
    v = attnbench.check(k, named("gqa/b1_hq6_hkv3_q3_k2_d8_f64"))
    assert v.verdict == "SKIP" and "GQA" in v.reason
    bottom_right = [c for c in FULL if c.dtype == "float32" and c.problem.causal == "bottom_right" and c.problem.seq_q != c.problem.seq_k
                    and c.features == ("causal",)]
    v = attnbench.check(attnbench.kernel(plain, causal="top_left"), bottom_right[0])
    assert v.verdict == "SKIP" and "aligns causal masks top_left" in v.reason
    v = attnbench.check(attnbench.kernel(plain, causal="both"), bottom_right[0])
    assert v.verdict == "PASS", v.report()
    v = attnbench.check(attnbench.kernel(plain, dtypes=("float64",)), named("mha/b2_h4_q17_k33_d64_f32"))
    assert v.verdict == "SKIP"


def test_version_2_cases_are_skipped():
    v2 = [c for c in attnbench.cases("smoke") if set(c.features) & {"window", "paged", "sinks"}]
    assert v2
    for c in v2:
        v = attnbench.check(plain, c)
        assert v.verdict == "SKIP" and "format version 2" in v.reason


# --- verdicts ---------------------------------------------------------------------------------

def test_a_correct_kernel_passes_the_smoke_tier_in_both_layouts():
    k = attnbench.kernel(plain, causal="both", dtypes=("float64", "float32", "float16"))
    report = attnbench.verify(k, tier="smoke", layouts=["bhsd", "bshd"], threads=[1, 2])
    assert report.ok, report.report()
    counts = report.counts()
    assert counts.get("PASS", 0) >= 12 and "FAIL" not in counts
    # `plain` takes no `threads`: the count never reaches it, so it is judged at the first one only.
    assert {(r.layout, r.threads) for v in report.verdicts for r in v.results if r.verdict == "PASS"} == \
        {("bhsd", 1), ("bshd", 1)}
    at_two = [r for v in report.verdicts for r in v.results if r.threads == 2]
    assert at_two and all(r.verdict == "SKIP" for r in at_two)
    assert sum("judged at 1 threads" in r.reason for r in at_two) >= 12
    # A kernel that takes `threads` is judged at every count.
    def threaded(q, k, v, *, scale, causal, threads):
        return plain(q, k, v, scale=scale, causal=causal, mask=None, bias=None, kv_len=None)

    threaded = attnbench.kernel(threaded, causal="both", dtypes=("float32",))
    both = attnbench.verify(threaded, tier="smoke", threads=[1, 2])
    assert {r.threads for v in both.verdicts for r in v.results if r.verdict == "PASS"} == {1, 2}


def test_bshd_kernels_get_and_return_seq_major_arrays():
    seen = {}

    def bshd(q, k, v, *, scale):
        seen["shape"] = q.shape
        out = plain(np.swapaxes(q, 1, 2), np.swapaxes(k, 1, 2), np.swapaxes(v, 1, 2), scale=scale, causal=False,
                    mask=None, bias=None, kv_len=None)
        return np.swapaxes(out, 1, 2)

    c = named("mha/b2_h4_q17_k33_d64_f32")
    v = attnbench.check(attnbench.kernel(bshd, layout="bshd"), c, layouts=["bhsd", "bshd"])
    assert v.verdict == "PASS", v.report()
    p = c.problem
    assert seen["shape"] == (p.batch, p.seq_q, p.heads_q, p.head_dim)
    # Returned in bhsd order by a kernel declared bshd: the shape is wrong and the verdict says so.
    def bhsd_shaped(q, k, v):
        return np.zeros((q.shape[0], q.shape[2], q.shape[1], v.shape[3]), dtype=q.dtype)

    v = attnbench.check(attnbench.kernel(bhsd_shaped, layout="bshd"), c)
    assert v.verdict == "FAIL" and "has shape" in v.reason, v.report()


def test_writing_into_out_is_zero_copy():
    def into(q, k, v, *, scale, out):
        assert out.flags.writeable and not out.flags.owndata
        out[...] = plain(q, k, v, scale=scale, causal=False, mask=None, bias=None, kv_len=None)

    v = attnbench.check(into, named("mha/b2_h4_q17_k33_d64_f32"))
    assert v.verdict == "PASS", v.report()

    def returns_none(q, k, v, *, scale):
        return None

    v = attnbench.check(returns_none, named("mha/b2_h4_q17_k33_d64_f32"))
    assert v.verdict == "FAIL" and "returned None" in v.reason


def test_a_wrong_kernel_fails_with_figures_and_a_reproduce_line():
    def dropped_tail(q, k, v, *, scale):  # forgets the last key
        return plain(q, k[:, :, :-1], v[:, :, :-1], scale=scale, causal=False, mask=None, bias=None, kv_len=None)

    c = named("mha/b2_h4_q17_k33_d64_f32")
    v = attnbench.check(dropped_tail, c)
    assert v.verdict == "FAIL" and not v.ok
    assert v.max_abs_error > 1e-3 and v.error_over_bound > 1
    assert v.worst_tensor == "out" and len(v.worst_index) == 4
    worst = v.results[0].worst
    assert worst["name"] == "out" and worst["worst_index"] == v.worst_index and worst["error_over_bound"] > 1
    # Defined inside this function, no line can load it: the reproduce line says so.
    assert "<the kernel object 'dropped_tail'>" in v.reproduce and "not a module-level name" in v.reproduce
    assert c.path in v.reproduce
    text = v.report()
    assert "FAIL" in text and "reproduce:" in text and c.problem.text in text
    with pytest.raises(AssertionError, match="FAIL"):
        attnbench.assert_passes(dropped_tail, c)


def test_lse_is_judged():
    def with_lse(q, k, v, *, scale, causal, mask, bias, kv_len, shift=0.0):
        out, lse = reference(q, k, v, scale=scale, causal=causal, mask=mask, bias=bias, kv_len=kv_len)
        return out.astype(q.dtype), lse + shift

    c = named("mha/b2_h4_q17_k33_d64_f32")
    assert attnbench.check(attnbench.kernel(with_lse, lse=True), c).verdict == "PASS"
    wrong = attnbench.kernel(lambda *a, **kw: with_lse(*a, shift=1e-3, **kw), name="lse_off", lse=True,
                             features=("mask", "bias", "kv_len", "causal"))
    v = attnbench.check(wrong, c)
    assert v.verdict == "FAIL" and "lse" in v.reason.lower(), v.report()
    v = attnbench.check(attnbench.kernel(plain, lse=True), c)
    assert v.verdict == "FAIL" and "must return (out, lse)" in v.reason


def test_gradients_are_judged():
    cases = [c for c in attnbench.cases("full", gradients=True, dtypes=["float64"])][:3]
    assert cases

    def backward(q, k, v, out, dout, *, scale, causal, mask, bias, kv_len, factor=1.0):
        dq, dk, dv, ds = plain_backward(q, k, v, out, dout, scale=scale, causal=causal, mask=mask, bias=bias,
                                        kv_len=kv_len)
        return dq * factor, dk, dv, ds

    good = attnbench.kernel(plain, causal="both", backward=backward)
    for c in cases:
        v = attnbench.check(good, c)
        assert v.verdict == "PASS", v.report()
        assert {r.direction for r in v.results if r.verdict == "PASS"} == {"forward", "backward"}
    bad = attnbench.kernel(plain, name="dq_doubled", causal="both",
                           backward=lambda *a, **kw: backward(*a, factor=2.0, **kw))
    v = attnbench.check(bad, cases[0])
    assert v.verdict == "FAIL"
    assert [r.direction for r in v.results if r.verdict == "FAIL"] == ["backward"]
    assert "directions=['backward']" in v.reproduce
    v = attnbench.check(plain, cases[0])
    assert [r.verdict for r in v.results if r.direction == "backward"] == ["SKIP"]


def test_verify_writes_attn_verify_reports(tmp_path):
    def dropped_tail(q, k, v, *, scale, causal, mask, bias, kv_len):
        return plain(q, k[:, :, :-1], v[:, :, :-1], scale=scale, causal=causal, mask=None, bias=None, kv_len=None)

    cases = attnbench.cases("smoke", dtypes=["float32"])
    report = attnbench.verify(dropped_tail, cases, json=tmp_path / "v.json", junit=tmp_path / "v.xml")
    assert report.exit_code == 1 and not report.ok and report.failures()
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["schema"] == "attn-verify-2" and data["summary"]["failed"] == len(
        [r for r in data["results"] if r["verdict"] == "FAIL"])
    suites = ET.parse(tmp_path / "v.xml").getroot()
    failures = suites.findall(".//failure")
    assert len(failures) == data["summary"]["failed"]
    assert "FAIL" in report.report()


def test_a_kernel_that_raises_fails_with_its_error():
    def raises(q, k, v):
        raise RuntimeError("kernel exploded")

    v = attnbench.check(raises, named("mha/b2_h4_q17_k33_d64_f32"))
    assert v.verdict == "FAIL" and "kernel exploded" in v.reason


def test_builtin_backends_by_name():
    assert "streaming" in attnbench.backends()
    v = attnbench.check("streaming", named("mha/b2_h4_q17_k33_d64_bf16"))
    assert v.verdict == "PASS"
    with pytest.raises((ValueError, RuntimeError), match="nonesuch"):
        attnbench.check("nonesuch", named("mha/b2_h4_q17_k33_d64_bf16"))


# --- the pytest plugin ------------------------------------------------------------------------

def test_the_pytest_plugin_makes_one_test_per_case(tmp_path):
    (tmp_path / "test_user.py").write_text(
        "import attnbench\n"
        "from kernels import plain\n"
        "kernel = attnbench.kernel(plain, causal='both', dtypes=('float32', 'float64', 'float16'))\n"
        "def test_kernel(attnbench_check):\n"
        "    attnbench_check(kernel)\n"
        "def dropped_tail(q, k, v, *, scale):\n"
        "    return plain(q, k[:, :, :-1], v[:, :, :-1], scale=scale, causal=False, mask=None, bias=None, kv_len=None)\n"
        "def test_broken(attnbench_check):\n"
        "    attnbench_check(dropped_tail)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__)] + sys.path))
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "attnbench.pytest_plugin", "-q", "-rs",
                          f"--junitxml={tmp_path / 'junit.xml'}", "-p", "no:cacheprovider", str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    smoke = attnbench.cases("smoke")
    root = ET.parse(tmp_path / "junit.xml").getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == 2 * len(smoke), run.stdout
    ours = [c for c in cases if "test_kernel[" in c.get("name")]
    assert not any(c.find("failure") is not None for c in ours), run.stdout
    broken = [c for c in cases if "test_broken[" in c.get("name") and c.find("failure") is not None]
    message = broken[0].find("failure").get("message", "") + (broken[0].find("failure").text or "") if broken else ""
    line = next((l.split("reproduce: ", 1)[1] for l in message.splitlines() if "reproduce: " in l), "")
    assert line.startswith("import attnbench; attnbench.check(attnbench.load_kernel("), message
    # Pasted as printed, in a fresh interpreter elsewhere, it runs and gives the same verdict.
    again = subprocess.run([sys.executable, "-c", line.replace("attnbench.check(", "print(attnbench.check(", 1)
                            + ".verdict)"], capture_output=True, text=True, env=env, cwd="/")
    assert again.returncode == 0 and again.stdout.strip() == "FAIL", again.stdout + again.stderr
    props = {p.get("name") for c in ours for p in c.findall(".//property")}
    assert {"attnbench_verdict", "attnbench_max_abs_error"} <= props
    assert run.returncode == 1 and "takes no mask" in run.stdout


# --- format version 2 through the kernel's keywords ---------------------------------------------

V2 = {"window", "softcap", "alibi", "sinks", "ragged", "paged"}


def _numpy_example():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
    import numpy_kernel
    return numpy_kernel


def test_declared_features_need_their_arguments():
    def causal_free(q, k, v, *, scale):
        return plain(q, k, v, scale=scale, causal=False, mask=None, bias=None, kv_len=None)

    with pytest.raises(ValueError, match="declares the feature 'causal' but its signature takes no `causal`"):
        attnbench.kernel(causal_free, features=("causal",))
    with pytest.raises(ValueError, match="`cu_seqlens_k`"):
        attnbench.kernel(lambda q, k, v, *, cu_seqlens_q: q, features=("ragged",))
    # **kwargs takes everything; the signature's arguments declare the features by themselves.
    assert attnbench.kernel(lambda q, k, v, **kw: q, features=("ragged", "paged")).FEATURES == ("ragged", "paged")
    assert set(attnbench.kernel(_numpy_example().attention.fn).FEATURES) == V2


def test_every_version_2_case_reaches_a_complete_kernel():
    """The NumPy example implements every feature: no version 2 case, forward or backward, is
    SKIP for it (bfloat16 aside, without ml_dtypes) and none fails."""
    cases = [c for c in FULL if set(c.features) & V2 and c.dtype != "bfloat16"
             and not any(getattr(c.problem, t + "_quant") for t in "qkv")]
    assert {f for c in cases for f in c.features} >= V2
    assert any(c.gradients for c in cases) and any("paged" in c.features for c in cases)
    report = attnbench.verify(_numpy_example().attention, cases, directions=["forward", "backward"])
    for c, v in zip(cases, report.verdicts):
        assert v.verdict in ("PASS", "MISTRUSTED"), f"{c.name}: {v.report()}"
        directions = {r.direction for r in v.results if r.verdict != "SKIP"}
        assert directions == ({"forward", "backward"} if c.gradients else {"forward"}), f"{c.name}: {directions}"


def test_a_missing_ml_dtypes_is_said_once(monkeypatch):
    import attnbench._kernel as kernel_module

    monkeypatch.setattr(kernel_module, "_ml_dtypes", lambda: None)
    monkeypatch.setattr(kernel_module, "_SAID", set())
    bf16 = [c for c in attnbench.cases("smoke", features=("mask", "bias", "kv_len", "causal", "gqa"))
            if c.dtype == "bfloat16" and not c.problem.k_quant]
    assert len(bf16) >= 2
    with pytest.warns(kernel_module.MissingPeerWarning, match="ml_dtypes is not installed") as said:
        verdicts = attnbench.verify(plain, bf16).verdicts
    assert all(v.verdict == "SKIP" and "ml_dtypes" in v.reason for v in verdicts)
    assert len([w for w in said if issubclass(w.category, kernel_module.MissingPeerWarning)]) == 1


def test_the_plugin_loads_by_its_entry_point_and_by_name(tmp_path):
    """As pip installs it: pytest registers the plugin from the package's entry point (read from
    pyproject.toml here, in a dist-info of its own), and `-p attnbench.pytest_plugin` on top of
    that must not load it a second time ("Plugin already registered")."""
    import tomllib

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        points = tomllib.load(f)["project"]["entry-points"]["pytest11"]
    info = tmp_path / "site" / "attnbench-0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: attnbench\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("[pytest11]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()))
    (tmp_path / "test_one.py").write_text(
        "import numpy as np, attnbench\n"
        "@attnbench.kernel(dtypes=('float64',), gqa=False)\n"
        "def k(q, k, v, *, scale):\n"
        "    s = scale * q @ np.swapaxes(k, -1, -2)\n"
        "    p = np.exp(s - s.max(-1, keepdims=True)) if s.shape[-1] else s\n"
        "    return (p / p.sum(-1, keepdims=True)) @ v if s.shape[-1] else np.zeros(q.shape)\n"
        "def test_k(attnbench_check):\n"
        "    attnbench_check(k)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site")] + sys.path))
    for extra in ([], ["-p", "attnbench.pytest_plugin"]):
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra,
                              str(tmp_path / "test_one.py")], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert run.returncode == 0 and " passed" in run.stdout, run.stdout + run.stderr


def test_a_builder_without_wheel_is_named_with_the_fix(tmp_path):
    """pip --no-build-isolation from a venv of another Python (no `wheel`) used to die with
    "invalid command 'bdist_wheel'"; setup.py now says which interpreter and what to run."""
    setuptools = pytest.importorskip("setuptools")
    if tuple(int(x) for x in setuptools.__version__.split(".")[:2]) >= (70, 1):
        pytest.skip(f"setuptools {setuptools.__version__} builds wheels without the wheel package")
    (tmp_path / "wheel").mkdir()
    (tmp_path / "wheel" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    run = subprocess.run([sys.executable, "setup.py", "dist_info", "--output-dir", str(tmp_path)], cwd=root,
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(tmp_path)))
    assert run.returncode != 0
    assert sys.executable in run.stderr and "/usr/bin/python3 -m venv --system-site-packages" in run.stderr, run.stderr


# --- format version 4 through the kernel's keywords ---------------------------------------------

def _quantised(c):
    return any(getattr(c.problem, t + "_quant") for t in "qkv")


def test_quantised_codes_reach_a_kernel_and_a_dropped_descale_fails():
    nk = _numpy_example()
    cases = [c for c in FULL if _quantised(c) and c.dtype != "bfloat16"]
    encodings = {getattr(c.problem, t + "_quant").encoding for c in cases for t in "qkv"
                 if getattr(c.problem, t + "_quant")}
    assert len(encodings) >= 6 and encodings <= set(nk.attention.ENCODINGS)
    report = attnbench.verify(nk.attention, cases)
    for c, v in zip(cases, report.verdicts):
        assert v.verdict == "PASS", v.report()

    def no_k_descale(q, k, v, *, quant, **kw):
        """Reads K's codes but forgets K's descale (FlashInfer #4979's bug)."""
        if quant["k"] is not None:
            quant = dict(quant, k=attnbench._kernel._Quant(**dict(vars(quant["k"]), descale=None)))
        return nk._attention(q, k, v, quant=quant, **kw)

    dropped = attnbench.kernel(no_k_descale, name="no_k_descale", causal="both", lse=True,
                               encodings=nk.attention.ENCODINGS,
                               features=[f for f in attnbench.FEATURES if f != "gqa"])
    with_descale = [c for c in cases if c.problem.k_quant and c.problem.k_quant.descale]
    assert with_descale
    for c in with_descale:
        assert attnbench.check(dropped, c).verdict == "FAIL", c.name
    with pytest.raises(ValueError, match="neither `quant` nor a descale"):
        attnbench.kernel(plain, encodings=("q8_0",))
    with pytest.raises(ValueError, match="encoding 'nf4'"):
        attnbench.kernel(nk._attention, encodings=("nf4",))


STAGED_PLUGIN = '''
import json
import numpy as np
import attnbench
import attnbench._kernel as K

COUNTS = {COUNTS!r}


class StandIn(K._NumPy):
    """A device whose memory is the host's: uploads copy, synchronize and downloads are counted."""
    counts = {"upload": 0, "sync": 0, "download": 0, "calls": 0}

    def staged(self):
        return True

    def synchronize(self):
        self.counts["sync"] += 1
        self._save()

    def array(self, view, dtype):
        self.counts["upload"] += 1
        self._save()
        return np.array(super().array(view, dtype))

    def to_numpy(self, x):
        self.counts["download"] += 1
        self._save()
        return np.asarray(x)

    def _save(self):
        with open(COUNTS, "w") as f:
            json.dump(self.counts, f)


def staged(q, k, v, *, scale):
    StandIn.counts["calls"] += 1
    s = scale * np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64))
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdims=True), v.astype(np.float64))


BACKEND = attnbench.kernel(staged, name="staged", dtypes=("float32",), gqa=False)
BACKEND.framework = StandIn()
'''


def test_a_device_kernel_uploads_once_and_times_only_its_runs(tmp_path):
    """The path of a torch kernel on a GPU (device="cuda"), proven without one: a stand-in device
    that copies on upload. Verified, the results come back through read_output; benchmarked,
    attn times run_timed (between two synchronizations) and brings results back once."""
    counts = tmp_path / "counts.json"
    plugin = tmp_path / "staged_plugin.py"
    plugin.write_text(STAGED_PLUGIN.replace("{COUNTS!r}", repr(str(counts))))
    kernel = attnbench.load_kernel(str(plugin), "BACKEND")
    v = attnbench.check(kernel, named("mha/b2_h4_q17_k33_d64_f32"))
    assert v.verdict == "PASS", v.report()
    seen = json.loads(counts.read_text())
    assert seen["upload"] == 3 * 2 and seen["download"] == seen["calls"] == 2, seen  # the case and its V = 1 probe
    run = subprocess.run([os.environ["ATTN_CLI"], "bench", "--plugin", str(plugin), "-b", "staged", "--no-peak",
                          "--problem", "dtype=f32,b=1,hq=2,hkv=2,sq=16,sk=16,d=32"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    seen = json.loads(counts.read_text())
    assert seen["calls"] >= 20 and seen["sync"] >= 2 * (seen["calls"] - 2), seen  # every timed call synchronized
    # Inputs up once per plan, results back at most once per plan, so never once per call: how many
    # calls a plan gets follows the host's speed, but every plan is timed more than once.
    plans = seen["upload"] // 3
    assert seen["upload"] == 3 * plans and seen["download"] <= plans and 2 * plans <= seen["calls"], seen


def test_an_interpreter_without_numpy_is_told_which_to_use():
    """Another python3 first on the PATH (pyenv's) has no NumPy: the import says which interpreter
    attnbench is built for instead of a bare ModuleNotFoundError (-S hides site-packages here)."""
    package = os.path.dirname(os.path.dirname(attnbench.__file__))
    run = subprocess.run([sys.executable, "-S", "-c", "import attnbench"], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=package))
    assert run.returncode != 0
    assert "attnbench needs NumPy" in run.stderr and "/usr/bin/python3 -m venv" in run.stderr, run.stderr
