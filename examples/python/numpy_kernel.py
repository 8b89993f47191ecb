"""A NumPy attention kernel, forward and backward, declared to attnbench.

Everything the fixture format asks of attention: scale, both causal alignments, masks, an
additive bias, kv_len, GQA, format version 2's sliding windows, softcap, ALiBi, sinks, packed
(ragged) batches and paged K/V, and format version 4's quantised q, k and v in every encoding
(dequantised exactly, descales per entry and kv head); the log-sum-exp; a row whose keys are
all hidden is 0.
It computes in float64 whatever the dtype, one batch entry at a time, and rounds once, on the
way out. bfloat16 needs ml_dtypes (NumPy has no bfloat16); without it those cases are SKIP.

    PYTHONPATH=build/python python3 -c "import attnbench, numpy_kernel as k; print(attnbench.verify(k.attention))"
    attn verify --plugin examples/python/numpy_kernel.py -b numpy-attention   (the same kernel, from attn)
"""

import numpy as np

import attnbench


def _entries(q, k, v, kv_len, cu_seqlens_q, cu_seqlens_k, block_table, cache_seqlens):
    """Each batch entry as (rows of q, qe [hq, lq, d], ke [hkv, lk, d], ve, keys visible): q, k, v
    dense [b, h, s, d], packed [h, total, d], or k, v paged [pages, hkv, page_size, d]."""
    if cu_seqlens_q is not None:
        for b in range(len(cu_seqlens_q) - 1):
            rows = slice(int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]))
            keys = slice(int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1]))
            yield (slice(None), rows), q[:, rows], k[:, keys], v[:, keys], keys.stop - keys.start
        return
    for b in range(q.shape[0]):
        if block_table is not None:
            n = int(cache_seqlens[b])
            used = block_table[b, :-(-n // k.shape[2])]  # the pages that hold the entry's n keys
            gather = lambda x: (np.concatenate([x[page] for page in used], axis=1)[:, :n] if n
                                else np.zeros((x.shape[1], 0, x.shape[3]), x.dtype))
            yield (b,), q[b], gather(k), gather(v), n
        else:
            limit = k.shape[2] if kv_len is None else min(int(kv_len[b]), k.shape[2])
            yield (b,), q[b], k[b], v[b], limit


def _weights(b, qe, ke, limit, o):
    """float64 softmax weights [hq, lq, lk] of one entry, its lse [hq, lq], the weight of the sink
    [hq, lq] and tanh of the capped scores (or None). `o` holds the case's keywords."""
    hq, lq = qe.shape[0], qe.shape[1]
    group = hq // ke.shape[0]
    k64 = np.repeat(np.asarray(ke, dtype=np.float64), group, axis=0)
    lk = k64.shape[1]
    s = o["scale"] * np.einsum("hqd,hkd->hqk", np.asarray(qe, dtype=np.float64), k64)
    t = None
    if o["softcap"]:
        t = np.tanh(s / o["softcap"])
        s = o["softcap"] * t
    i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
    diag = i if o["align"] == "top_left" else i + lk - lq
    visible = np.broadcast_to(j < limit, (hq, lq, lk))
    if o["causal"] != "none":
        visible = visible & (j <= diag)
    left, right = o["window_size"]
    if left >= 0:
        visible = visible & (diag - j <= left)
    if right >= 0:
        visible = visible & (j - diag <= right)
    if o["mask"] is not None:  # [.., seq_k]: an entry's keys are its first lk (paged: of its pages)
        visible = visible & o["mask"][b][..., :lk]
    if o["alibi_slopes"] is not None:
        s = s - np.asarray(o["alibi_slopes"], dtype=np.float64)[:, None, None] * np.abs(diag - j)
    if o["bias"] is not None:
        s = s + np.asarray(o["bias"][b][..., :lk], dtype=np.float64)
    s = np.where(visible, s, -np.inf)
    sink = np.full((hq, 1, 1), -np.inf)
    if o["sinks"] is not None:
        sink = np.asarray(o["sinks"], dtype=np.float64)[:, None, None]
    m = np.maximum(s.max(axis=-1, keepdims=True) if lk else np.full((hq, lq, 1), -np.inf), sink)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    e_sink = np.exp(sink - m)
    total = e.sum(axis=-1, keepdims=True) + e_sink
    safe = np.where(total > 0, total, 1.0)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, np.log(safe) + m, -np.inf)[..., 0]
    return e / safe, lse, (e_sink / safe)[..., 0], t


def _descaled(b, qe, ke, ve, quant):
    """An entry's tensors times their descales (format version 4: one per (entry, kv head); the
    query's indexed by kv head)."""
    if not quant:
        return qe, ke, ve
    out = []
    for t, x in zip("qkv", (qe, ke, ve)):
        spec = quant[t]
        if spec is not None and spec.descale is not None:
            d = np.asarray(spec.descale, dtype=np.float64)[b]  # [heads_kv]
            x = x * np.repeat(d, x.shape[0] // len(d))[:, None, None]
        out.append(x)
    return out


def _values(x, t, quant):
    """A tensor's values: itself, or its codes dequantised (zero point, scale; not the descale)."""
    return attnbench.dequantize(x, quant[t]) if quant and quant[t] is not None else x


def _keywords(scale, causal, align, mask, bias, window_size, softcap, alibi_slopes, sinks):
    causal = causal if isinstance(causal, str) else ("top_left" if causal else "none")
    return dict(scale=scale, causal=causal, align=align, mask=mask, bias=bias, window_size=window_size,
                softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks)


def _attention(q, k, v, *, scale, causal, align, mask, bias, kv_len, window_size, softcap, alibi_slopes, sinks,
               cu_seqlens_q, cu_seqlens_k, block_table, cache_seqlens, quant=None):
    """Attention in float64 NumPy, every feature of the fixture format."""
    o = _keywords(scale, causal, align, mask, bias, window_size, softcap, alibi_slopes, sinks)
    dtype = q.dtype if not (quant and quant["q"]) else np.float64  # the verifier rounds float64 once
    q, k, v = (_values(x, t, quant) for x, t in zip((q, k, v), "qkv"))
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    lse = np.full(q.shape[:-1], -np.inf if sinks is None else 0.0)
    if sinks is not None:  # rows of no entry (past a packed batch's last) hold the sink's lse
        lse[...] = np.asarray(sinks, dtype=np.float64).reshape((-1, 1) if q.ndim == 3 else (1, -1, 1))
    for b, (at, qe, ke, ve, limit) in enumerate(_entries(q, k, v, kv_len, cu_seqlens_q, cu_seqlens_k,
                                                         block_table, cache_seqlens)):
        qe, ke, ve = _descaled(b, qe, ke, ve, quant)
        p, lse[at], _, _ = _weights(b, qe, ke, limit, o)
        v64 = np.repeat(np.asarray(ve, dtype=np.float64), q.shape[-3] // ve.shape[0], axis=0)
        out[at] = np.einsum("hqk,hkd->hqd", p, v64)
    return out.astype(dtype), lse


def _backward(q, k, v, out, dout, *, scale, causal, align, mask, bias, kv_len, window_size, softcap, alibi_slopes,
              sinks, cu_seqlens_q, cu_seqlens_k, block_table, cache_seqlens, quant=None):
    """The gradients of sum(dout * out): dq, dk, dv (dk, dv summed over each kv head's query
    heads), dbias ([batch, heads_q, seq_q, seq_k], or None) and dsinks (or None)."""
    o = _keywords(scale, causal, align, mask, bias, window_size, softcap, alibi_slopes, sinks)
    dq, dk, dv = (np.zeros(x.shape) for x in (q, k, v))
    dbias = None if bias is None else np.zeros(np.broadcast_shapes(q.shape[:-1] + (k.shape[-2],), bias.shape))
    dsinks = None if sinks is None else np.zeros(len(sinks))
    do_all = np.asarray(dout, dtype=np.float64)
    for b, (at, qe, ke, ve, limit) in enumerate(_entries(q, k, v, kv_len, cu_seqlens_q, cu_seqlens_k,
                                                         block_table, cache_seqlens)):
        p, _, p_sink, t = _weights(b, qe, ke, limit, o)
        hq, hkv = qe.shape[0], ke.shape[0]
        group = hq // hkv
        v64 = np.repeat(np.asarray(ve, dtype=np.float64), group, axis=0)
        k64 = np.repeat(np.asarray(ke, dtype=np.float64), group, axis=0)
        do = do_all[at]
        dp = np.einsum("hqd,hkd->hqk", do, v64)
        d_row = (p * dp).sum(axis=-1, keepdims=True)  # dout . out, out in float64
        ds = p * (dp - d_row)  # the gradient of the final score (after the cap, ALiBi and bias)
        dx = ds if t is None else ds * (1.0 - t * t)
        fold = lambda g: g.reshape(hkv, group, *g.shape[1:]).sum(axis=1)
        keys = slice(None) if cu_seqlens_k is None else slice(int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1]))
        dq[at] = scale * np.einsum("hqk,hkd->hqd", dx, k64)
        dk_e = fold(scale * np.einsum("hqk,hqd->hkd", dx, np.asarray(qe, dtype=np.float64)))
        dv_e = fold(np.einsum("hqk,hqd->hkd", p, do))
        if cu_seqlens_k is None:
            dk[b], dv[b] = dk_e, dv_e
        else:
            dk[:, keys], dv[:, keys] = dk_e, dv_e
        if dbias is not None:
            dbias[b] = ds
        if dsinks is not None:  # d lse / d sink is the sink's weight: dsink = -sum_i p_sink,i D_i
            dsinks -= (p_sink * d_row[..., 0]).sum(axis=-1)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dbias, dsinks


attention = attnbench.kernel(_attention, name="numpy-attention", causal="both", lse=True, backward=_backward,
                             encodings=("float8_e4m3fn", "float8_e5m2", "int8", "uint8", "int4", "uint4", "q8_0",
                                        "q4_0"))

# attn verify --plugin examples/python/numpy_kernel.py loads the same kernel.
BACKEND = attention
