#!/usr/bin/env python3
"""Writes format version 2 fixtures (docs/format/v2.md) with h5py + NumPy,
from an implementation of their own, to prove that version 2 files other tools
write load and verify unchanged: a sliding window, softcap, ALiBi and sinks on
dense tensors; packed (ragged) sequences with empty ones; a paged KV cache.

Run with Debian's python3-h5py and python3-numpy:  /usr/bin/python3 make_v2_cases.py
The outputs are committed; the tests only read them.
"""
import h5py
import numpy as np


def round_bf16(x):
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32)


def in_dtype(x, dtype):
    if dtype == "float16":
        return np.asarray(x).astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return round_bf16(x)
    if dtype == "float64":
        return np.asarray(x, dtype=np.float64)
    return np.asarray(x).astype(np.float32)


def row_attention(q, keys, values, positions, diag, a, h, mask_row=None, bias_row=None):
    """One query row: scores of the keys at `positions` (their places in the
    entry), in the order scale, softcap, ALiBi, bias; the sink in the
    denominator. Returns out and lse."""
    causal, wl, wr = a["causal"], a.get("window_left", -1), a.get("window_right", -1)
    s, vals = [], []
    for n, j in enumerate(positions):
        if causal != "none" and j > diag:
            continue
        if wl >= 0 and j < diag - wl:
            continue
        if wr >= 0 and j > diag + wr:
            continue
        if mask_row is not None and mask_row[j] == 0:
            continue
        x = a["scale"] * float(np.dot(q.astype(np.float64), keys[n].astype(np.float64)))
        if a.get("softcap", 0) > 0:
            x = a["softcap"] * np.tanh(x / a["softcap"])
        if a.get("alibi") is not None:
            x -= float(a["alibi"][h]) * abs(diag - j)
        if bias_row is not None:
            if np.isneginf(bias_row[j]):
                continue
            x += float(bias_row[j])
        s.append(x)
        vals.append(values[n].astype(np.float64))
    sink = None if a.get("sinks") is None else float(a["sinks"][h])
    if not s:
        return np.zeros(values.shape[-1]), (-np.inf if sink is None else sink)
    s = np.array(s)
    m = s.max() if sink is None else max(s.max(), sink)
    e = np.exp(s - m)
    total = e.sum() + (0.0 if sink is None else np.exp(sink - m))
    return (e / total) @ np.array(vals), m + np.log(total)


def diagonal(a, i, q_len, k_len):
    align = a["causal"] if a["causal"] != "none" else a.get("align", "bottom_right")
    return i if align == "top_left" else i + k_len - q_len


def write(path, a, datasets, out, lse):
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "attn-fixture"
        f.attrs["format_version"] = np.int32(2)  # any integer width
        for key in ("name", "description", "dtype", "causal"):
            f.attrs[key] = a[key]
        f.attrs["generator"] = "numpy " + np.__version__ + ", tests/data/make_v2_cases.py"
        f.attrs["tags"] = "numpy,external,v2"
        for key in ("batch", "heads_q", "heads_kv", "seq_q", "seq_k", "head_dim", "head_dim_v"):
            f.attrs[key] = np.int64(a[key])
        f.attrs["scale"] = np.float64(a["scale"])
        for key in ("window_left", "window_right", "page_size"):
            if key in a:
                f.attrs[key] = np.int32(a[key])
        if "align" in a:
            f.attrs["align"] = a["align"]
        if a.get("softcap", 0) > 0:
            f.attrs["softcap"] = np.float64(a["softcap"])
        for key, value in datasets.items():
            f.create_dataset(key, data=value)
        f.create_dataset("out", data=out)
        f.create_dataset("lse", data=lse)


def case_dense(path):
    """GQA 2:1, not causal, a window of 3 left and 1 right of the top_left
    diagonal, softcap 4, ALiBi, sinks and a mask with a fully hidden row."""
    rng = np.random.default_rng(21)
    b, hq, hkv, sq, sk, d = 2, 4, 2, 6, 9, 8
    a = dict(name="numpy/v2_window_softcap_alibi_sinks_f32", description="h5py + NumPy: window, softcap, ALiBi, sinks",
             dtype="float32", causal="none", align="top_left", batch=b, heads_q=hq, heads_kv=hkv, seq_q=sq, seq_k=sk,
             head_dim=d, head_dim_v=d, scale=1 / np.sqrt(d), window_left=3, window_right=1, softcap=4.0)
    q = in_dtype(rng.standard_normal((b, hq, sq, d)) * 3, "float32")
    k = in_dtype(rng.standard_normal((b, hkv, sk, d)) * 3, "float32")
    v = in_dtype(rng.standard_normal((b, hkv, sk, d)), "float32")
    mask = (rng.random((b, 1, sq, sk)) > 0.2).astype(np.uint8)
    mask[1, 0, 2, :] = 0
    a["alibi"] = np.array([0.5, 0.25, 0.125, 0.0625], dtype=np.float32)
    a["sinks"] = in_dtype(rng.standard_normal(hq), "float32")
    out = np.zeros((b, hq, sq, d))
    lse = np.zeros((b, hq, sq))
    for bb in range(b):
        for h in range(hq):
            g = h // (hq // hkv)
            for i in range(sq):
                out[bb, h, i], lse[bb, h, i] = row_attention(q[bb, h, i], k[bb, g], v[bb, g], range(sk),
                                                             diagonal(a, i, sq, sk), a, h, mask_row=mask[bb, 0, i])
    write(path, a, {"q": q, "k": k, "v": v, "mask": mask, "alibi_slopes": a["alibi"], "sinks": a["sinks"]}, out, lse)


def case_ragged(path):
    """Four packed sequences, q lengths 3, 0, 5, 2 and k lengths 4, 6, 0, 7, with
    a tail of 2 queries and 3 keys; causal bottom_right in each, a window of 2."""
    rng = np.random.default_rng(22)
    hq, hkv, d = 2, 1, 8
    q_lens, k_lens = [3, 0, 5, 2], [4, 6, 0, 7]
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int64)
    cu_k = np.concatenate([[0], np.cumsum(k_lens)]).astype(np.int64)
    sq, sk = int(cu_q[-1]) + 2, int(cu_k[-1]) + 3
    a = dict(name="numpy/v2_ragged_f16", description="h5py + NumPy: packed sequences, empty ones, tails",
             dtype="float16", causal="bottom_right", batch=len(q_lens), heads_q=hq, heads_kv=hkv, seq_q=sq, seq_k=sk,
             head_dim=d, head_dim_v=d, scale=1 / np.sqrt(d), window_left=2)
    q = in_dtype(rng.standard_normal((1, hq, sq, d)), "float16")
    k = in_dtype(rng.standard_normal((1, hkv, sk, d)), "float16")
    v = in_dtype(rng.standard_normal((1, hkv, sk, d)), "float16")
    v[0, :, int(cu_k[-1]):] = 1000.0  # the tail: no sequence's keys
    out = np.zeros((1, hq, sq, d))
    lse = np.full((1, hq, sq), -np.inf)
    for e in range(len(q_lens)):
        for h in range(hq):
            for i in range(q_lens[e]):
                row = int(cu_q[e]) + i
                keys = slice(int(cu_k[e]), int(cu_k[e + 1]))
                out[0, h, row], lse[0, h, row] = row_attention(q[0, h, row], k[0, 0, keys], v[0, 0, keys], range(k_lens[e]),
                                                               diagonal(a, i, q_lens[e], k_lens[e]), a, h)
    write(path, a, {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k}, out, lse)


def case_paged(path):
    """A paged cache: pages of 4 keys in a pool of 7, the table shuffled, a
    partly filled last page, -1 in the unused slots; decode of 2 queries,
    causal bottom_right from each entry's length, sinks."""
    rng = np.random.default_rng(23)
    b, hq, hkv, sq, d, ps, pages = 3, 2, 2, 2, 8, 4, 7
    seq_lens = np.array([10, 0, 5], dtype=np.int64)
    per_entry = 3
    table = np.full((b, per_entry), -1, dtype=np.int64)
    order = rng.permutation(pages)
    used = 0
    for bb in range(b):
        for n in range(-(-int(seq_lens[bb]) // ps)):
            table[bb, n] = order[used]
            used += 1
    a = dict(name="numpy/v2_paged_bf16", description="h5py + NumPy: paged KV, shuffled table, partly filled pages",
             dtype="bfloat16", causal="bottom_right", batch=b, heads_q=hq, heads_kv=hkv, seq_q=sq, seq_k=per_entry * ps,
             head_dim=d, head_dim_v=d, scale=1 / np.sqrt(d), page_size=ps)
    q = in_dtype(rng.standard_normal((b, hq, sq, d)), "bfloat16")
    k = in_dtype(rng.standard_normal((pages, hkv, ps, d)), "bfloat16")
    v = in_dtype(rng.standard_normal((pages, hkv, ps, d)), "bfloat16")
    a["sinks"] = in_dtype(rng.standard_normal(hq), "float32")
    out = np.zeros((b, hq, sq, d))
    lse = np.zeros((b, hq, sq))
    for bb in range(b):
        n = int(seq_lens[bb])
        for h in range(hq):
            g = h // (hq // hkv)
            keys = np.array([k[table[bb, j // ps], g, j % ps] for j in range(n)]).reshape(n, d)
            vals = np.array([v[table[bb, j // ps], g, j % ps] for j in range(n)]).reshape(n, d)
            for i in range(sq):
                out[bb, h, i], lse[bb, h, i] = row_attention(q[bb, h, i], keys, vals, range(n), diagonal(a, i, sq, n), a, h)
    write(path, a, {"q": q, "k": k, "v": v, "page_table": table, "seq_lens": seq_lens, "sinks": a["sinks"]}, out, lse)


if __name__ == "__main__":
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    case_dense(os.path.join(here, "numpy_v2_window_softcap_alibi_sinks_f32.h5"))
    case_ragged(os.path.join(here, "numpy_v2_ragged_f16.h5"))
    case_paged(os.path.join(here, "numpy_v2_paged_bf16.h5"))
