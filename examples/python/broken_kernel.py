"""A deliberately broken kernel: the softmax skips the subtraction of each row's maximum.

It computes exp(s) / sum(exp(s)) in float32. On small random inputs that is as good as the
stable form, and tests with a hand-set atol on such inputs pass it; once a logit passes 88.7,
exp overflows to inf and the row becomes NaN. attnbench's suite holds such rows, so this kernel
FAILs there, with the same verdict from Python as from attn:

    attn verify --plugin examples/python/broken_kernel.py -b broken-softmax
"""

import numpy as np

import attnbench


@attnbench.kernel(name="broken-softmax", dtypes=("float32",), causal="both")
def attention(q, k, v, *, scale, causal, mask, bias, kv_len):
    """Attention whose softmax does not subtract the row maximum (overflows)."""
    group = q.shape[1] // k.shape[1]
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    s = scale * np.einsum("bhqd,bhkd->bhqk", q, k)
    sq, sk = s.shape[2], s.shape[3]
    visible = np.ones(s.shape, dtype=bool)
    if mask is not None:
        visible &= mask
    if kv_len is not None:
        visible &= (np.arange(sk)[None, :] < kv_len[:, None])[:, None, None, :]
    if causal != "none":
        offset = 0 if causal == "top_left" else sk - sq
        visible &= np.arange(sk)[None, :] <= np.arange(sq)[:, None] + offset
    if bias is not None:
        s = s + bias
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.where(visible, np.exp(s), np.float32(0))  # the bug: no maximum subtracted
        total = e.sum(axis=-1, keepdims=True)
        p = e / np.where(total > 0, total, np.float32(1))
    return np.einsum("bhqk,bhkd->bhqd", p, v).astype(np.float32)


BACKEND = attention
