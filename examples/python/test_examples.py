"""The examples under pytest, through attnbench's plugin (pytest -p attnbench.pytest_plugin):
one test per case of the tier (--attnbench-tier, smoke by default)."""

import pytest

import attnbench
import broken_kernel
import numpy_kernel
import torch_kernels


def test_numpy_kernel(attnbench_check):
    attnbench_check(numpy_kernel.attention)


# The backward: the full tier's gradient cases in float32 (the smoke tier holds none).
@pytest.mark.attnbench(tier="full", gradients=True, dtypes=["float32"])
def test_numpy_kernel_gradients(attnbench_check):
    attnbench_check(numpy_kernel.attention)


def test_torch_handwritten(attnbench_check):
    attnbench_check(torch_kernels.handwritten)


def test_torch_sdpa(attnbench_check):
    attnbench_check(torch_kernels.sdpa)


# Every paged case of the suite (the smoke tier holds one).
@pytest.mark.attnbench(tier="full", tags=["paged"])
def test_torch_paged_decode(attnbench_check):
    attnbench_check(torch_kernels.paged_decode)


# The broken kernel must fail where its softmax overflows, and only there: the test passes when
# attnbench's verdict is FAIL on such a case and PASS on a case whose logits stay small.
@pytest.mark.parametrize("name, expected", [("large_logits/scores_300_f32", "FAIL"), ("mha/b2_h4_q17_k33_d64_f32", "PASS")])
def test_broken_kernel_is_caught(name, expected):
    case = next(c for c in attnbench.cases() if c.name == name)
    verdict = attnbench.check(broken_kernel.attention, case)
    assert verdict.verdict == expected, verdict.report()
