"""A NumPy attention kernel, forward and backward, declared to attnbench.

Everything the fixture format asks of plain attention: scale, both causal alignments, masks,
an additive bias, kv_len, GQA, the log-sum-exp, and a row whose keys are all hidden is 0. It
computes in float64 whatever the dtype and rounds once, on the way out. bfloat16 needs
ml_dtypes (NumPy has no bfloat16); without it those cases are SKIP.

    PYTHONPATH=build/python python3 -c "import attnbench, numpy_kernel as k; print(attnbench.verify(k.attention))"
    attn verify --plugin examples/python/numpy_kernel.py -b numpy-attention   (the same kernel, from attn)
"""

import numpy as np

import attnbench


def _scores(q, k, v, scale, causal, mask, bias, kv_len):
    """float64 softmax probabilities [b, hq, sq, sk] and v repeated over each group."""
    group = q.shape[1] // k.shape[1]
    k64 = np.repeat(np.asarray(k, dtype=np.float64), group, axis=1)
    v64 = np.repeat(np.asarray(v, dtype=np.float64), group, axis=1)
    s = scale * np.einsum("bhqd,bhkd->bhqk", np.asarray(q, dtype=np.float64), k64)
    b, h, sq, sk = s.shape
    visible = np.ones(s.shape, dtype=bool)
    if mask is not None:
        visible &= mask
    if kv_len is not None:
        visible &= (np.arange(sk)[None, :] < kv_len[:, None])[:, None, None, :]
    if causal != "none":
        offset = 0 if causal == "top_left" else sk - sq
        visible &= np.arange(sk)[None, :] <= np.arange(sq)[:, None] + offset
    if bias is not None:
        s = s + np.asarray(bias, dtype=np.float64)
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True) if sk > 0 else np.full((b, h, sq, 1), -np.inf)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    total = e.sum(axis=-1, keepdims=True)
    p = e / np.where(total > 0, total, 1.0)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, np.log(np.where(total > 0, total, 1.0)) + m, -np.inf)[..., 0]
    return p, v64, k64, lse


def _backward(q, k, v, out, dout, *, scale, causal, mask, bias, kv_len):
    """The gradients of sum(dout * out): dq, dk, dv (summed over each group) and dbias."""
    p, v64, k64, _ = _scores(q, k, v, scale, causal, mask, bias, kv_len)
    do = np.asarray(dout, dtype=np.float64)
    o = np.asarray(out, dtype=np.float64)
    group = q.shape[1] // k.shape[1]
    b, hkv = k.shape[0], k.shape[1]
    dv = np.einsum("bhqk,bhqd->bhkd", p, do)
    dp = np.einsum("bhqd,bhkd->bhqk", do, v64)
    ds = p * (dp - (do * o).sum(axis=-1, keepdims=True))
    dq = scale * np.einsum("bhqk,bhkd->bhqd", ds, k64)
    dk = scale * np.einsum("bhqk,bhqd->bhkd", ds, np.asarray(q, dtype=np.float64))
    fold = lambda g: g.reshape(b, hkv, group, *g.shape[2:]).sum(axis=2)
    # dbias: [batch, heads_q, seq_q, seq_k]; attnbench sums it over the bias's broadcast axes.
    return dq.astype(q.dtype), fold(dk).astype(k.dtype), fold(dv).astype(v.dtype), ds


def _attention(q, k, v, *, scale, causal, mask, bias, kv_len):
    """Attention in float64 NumPy, every plain-attention feature."""
    p, v64, _, lse = _scores(q, k, v, scale, causal, mask, bias, kv_len)
    return np.einsum("bhqk,bhkd->bhqd", p, v64).astype(q.dtype), lse


attention = attnbench.kernel(_attention, name="numpy-attention", causal="both", lse=True, backward=_backward)

# attn verify --plugin examples/python/numpy_kernel.py loads the same kernel.
BACKEND = attention
