"""Kernels the package's tests judge: the NumPy example's float64 attention (examples/python),
called with the plain-attention keywords only and a causal flag as a bool or an alignment."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python"))
from numpy_kernel import _attention, _backward  # noqa: E402


_NO_V2 = dict(window_size=(-1, -1), softcap=0.0, alibi_slopes=None, sinks=None, cu_seqlens_q=None, cu_seqlens_k=None,
              block_table=None, cache_seqlens=None)


def _align(causal):
    alignment = causal if isinstance(causal, str) else ("top_left" if causal else "none")
    return alignment, "bottom_right" if alignment == "bottom_right" else "top_left"


def reference(q, k, v, *, scale, causal, mask, bias, kv_len):
    """Attention in float64 NumPy with every plain-attention feature; returns (out, lse) with out
    in float64."""
    alignment, align = _align(causal)
    as64 = lambda x: np.asarray(x, dtype=np.float64)
    return _attention(as64(q), as64(k), as64(v), scale=scale, causal=alignment, align=align, mask=mask, bias=bias,
                      kv_len=kv_len, **_NO_V2)


def plain(q, k, v, *, scale, causal, mask, bias, kv_len):
    return reference(q, k, v, scale=scale, causal=causal, mask=mask, bias=bias, kv_len=kv_len)[0].astype(q.dtype)


def plain_backward(q, k, v, out, dout, *, scale, causal, mask, bias, kv_len):
    """(dq, dk, dv, dbias) of `plain`."""
    alignment, align = _align(causal)
    return _backward(q, k, v, out, dout, scale=scale, causal=alignment, align=align, mask=mask, bias=bias,
                     kv_len=kv_len, **_NO_V2)[:4]
