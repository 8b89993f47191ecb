"""attnbench's pytest plugin: one test per case of the standard suite.

Load it with `pytest -p attnbench.pytest_plugin` (or `addopts = -p attnbench.pytest_plugin` in
pytest.ini; a pip-installed attnbench registers it by itself; `pytest_plugins =
["attnbench.pytest_plugin"]` in a test file works too, without the command-line options). Then
a test that takes the `attnbench_check` fixture runs once per case:

    import attnbench

    @attnbench.kernel(dtypes=("float32", "float64"))
    def attention(q, k, v, *, scale, mask):
        ...

    def test_attention(attnbench_check):
        attnbench_check(attention)

A case the kernel does not support is skipped with the reason; a failure's message is the
verdict's report (figures, reason, reproduce command); the verdict and its figures go into the
test's user properties, so pytest's --junitxml carries them.

Options: --attnbench-tier smoke|full (default smoke; the ini value attnbench_tier too),
--attnbench-fixtures PATH (another folder of fixtures). Narrow the cases of one test with
@pytest.mark.attnbench(tags=..., features=..., dtypes=..., gradients=..., tier=...), the filters
of attnbench.cases() (a tier given there wins over the command line's: the smoke tier holds no
gradient case, so a test of the backward names tier="full", gradients=True).
"""

import pytest

from . import _api


def pytest_addoption(parser):
    group = parser.getgroup("attnbench")
    group.addoption("--attnbench-tier", choices=_api.TIERS, default=None,
                    help="the standard suite's tier the attnbench_case tests run over (default: smoke)")
    group.addoption("--attnbench-fixtures", default=None, metavar="PATH",
                    help="fixture files or a folder of them instead of the standard suite")
    parser.addini("attnbench_tier", "the default of --attnbench-tier", default="smoke")


def pytest_configure(config):
    config.addinivalue_line("markers", "attnbench(tags=None, features=None, dtypes=None, gradients=None, tier=None): "
                                       "the cases attnbench_case runs over (attnbench.cases' filters)")


def pytest_generate_tests(metafunc):
    if "attnbench_case" not in metafunc.fixturenames:
        return
    config = metafunc.config
    # Loaded late (pytest_plugins in a test module), the options were never added: the defaults.
    tier = config.getoption("attnbench_tier", default=None)
    try:
        tier = tier or config.getini("attnbench_tier")
    except ValueError:
        tier = tier or "smoke"
    path = config.getoption("attnbench_fixtures", default=None)
    marker = metafunc.definition.get_closest_marker("attnbench")
    filters = dict(marker.kwargs) if marker else {}
    tier = filters.pop("tier", tier)
    found = _api.cases(None if path else tier, path=path, **filters)
    metafunc.parametrize("attnbench_case", found, ids=[c.name for c in found])


@pytest.fixture
def attnbench_check(request, attnbench_case):
    """check(kernel) for this test's case: skip with the reason, or fail with the report."""

    def run(kernel, **options):
        v = _api.check(kernel, attnbench_case, **options)
        props = request.node.user_properties
        props.append(("attnbench_verdict", v.verdict))
        for name in ("max_abs_error", "rms_error", "error_over_bound", "error_over_baseline"):
            value = getattr(v, name)
            if value is not None:
                props.append((f"attnbench_{name}", f"{value:.6g}"))
        if v.skipped:
            pytest.skip(v.reason)
        if not v.ok:
            pytest.fail(v.report(), pytrace=False)
        return v

    return run
