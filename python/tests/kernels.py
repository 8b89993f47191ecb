"""Kernels the package's tests judge: the NumPy example's float64 attention (examples/python),
called with a causal flag as a bool or an alignment."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python"))
from numpy_kernel import _scores  # noqa: E402


def reference(q, k, v, *, scale, causal, mask, bias, kv_len):
    """Attention in float64 NumPy with every plain-attention feature; returns (out, lse)."""
    alignment = causal if isinstance(causal, str) else ("top_left" if causal else "none")
    p, v64, _, lse = _scores(q, k, v, scale, alignment, mask, bias, kv_len)
    return np.einsum("bhqk,bhkd->bhqd", p, v64), lse


def plain(q, k, v, *, scale, causal, mask, bias, kv_len):
    return reference(q, k, v, scale=scale, causal=causal, mask=mask, bias=bias, kv_len=kv_len)[0].astype(q.dtype)
