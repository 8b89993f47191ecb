"""Kernels the package's tests judge: a correct float64 NumPy one and broken variants of it."""

import numpy as np


def reference(q, k, v, *, scale, causal, mask, bias, kv_len):
    """Attention in float64 NumPy with every plain-attention feature; returns (out, lse)."""
    group = q.shape[1] // k.shape[1]
    k = np.repeat(np.asarray(k, dtype=np.float64), group, axis=1)
    v = np.repeat(np.asarray(v, dtype=np.float64), group, axis=1)
    s = scale * np.einsum("bhqd,bhkd->bhqk", np.asarray(q, dtype=np.float64), k)
    b, h, sq, sk = s.shape
    visible = np.ones(s.shape, dtype=bool)
    if mask is not None:
        visible &= mask
    if kv_len is not None:
        visible &= (np.arange(sk)[None, :] < kv_len[:, None])[:, None, None, :]
    if causal not in (False, "none"):
        offset = sk - sq if causal == "bottom_right" else 0
        visible &= np.arange(sk)[None, :] <= np.arange(sq)[:, None] + offset
    if bias is not None:
        s = s + np.asarray(bias, dtype=np.float64)
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True) if sk else np.full((b, h, sq, 1), -np.inf)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    total = e.sum(axis=-1, keepdims=True)
    p = e / np.where(total > 0, total, 1.0)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, np.log(np.where(total > 0, total, 1.0)) + m, -np.inf)[..., 0]
    return np.einsum("bhqk,bhkd->bhqd", p, v), lse


def plain(q, k, v, *, scale, causal, mask, bias, kv_len):
    return reference(q, k, v, scale=scale, causal=causal, mask=mask, bias=bias, kv_len=kv_len)[0].astype(q.dtype)
