"""attnbench from Python: judge an attention kernel against the standard suite with the same
C++ verifier and tolerance policy as `attn verify`.

    import attnbench

    @attnbench.kernel(dtypes=("float32", "float64"))
    def attention(q, k, v, *, scale, causal, mask):
        ...

    verdict = attnbench.check(attention, attnbench.cases("smoke")[0])
    assert verdict.ok, verdict.report()

cases() lists the fixtures, check() judges one, verify() a suite (with attn verify's JSON and
JUnit), kernel() declares what a function supports; the pytest plugin (attnbench.pytest_plugin)
makes one test per case. The docs page "From Python" has the rest.
"""

import sys as _sys

try:
    import numpy as _numpy  # noqa: F401
except ImportError as _e:
    raise ImportError(
        f"attnbench needs NumPy, which {_sys.executable} (Python {_sys.version.split()[0]}) cannot import ({_e}). "
        "attnbench is built for Debian's /usr/bin/python3 (python3-numpy): run /usr/bin/python3, or a venv made "
        "from it: /usr/bin/python3 -m venv --system-site-packages V (another python3 first on the PATH, "
        "pyenv's or conda's, is not it)") from _e

from ._kernel import DTYPES, FEATURES, Kernel, dequantize, kernel
from ._api import (TIERS, Case, Report, Result, Verdict, backends, case, cases, check, default_fixtures,
                   load_kernel, verify)

__all__ = ["DTYPES", "FEATURES", "TIERS", "Kernel", "kernel", "Case", "Result", "Verdict", "Report", "cases",
           "case", "check", "verify", "backends", "default_fixtures", "assert_passes", "load_kernel", "dequantize"]


def __getattr__(name):
    if name == "__version__":
        from ._api import _c
        return _c().__version__
    raise AttributeError(name)


def assert_passes(kernel, case, **options):
    """check(), then: SKIP becomes pytest.skip with the reason (when pytest runs), FAIL and ERROR an
    AssertionError whose message is the verdict's report. Returns the Verdict."""
    v = check(kernel, case, **options)
    if v.skipped:
        try:
            import pytest
        except ImportError:
            return v
        pytest.skip(v.reason)
    if not v.ok:
        raise AssertionError(v.report())
    return v
