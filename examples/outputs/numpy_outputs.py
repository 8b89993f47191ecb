#!/usr/bin/env python3
"""Results from outside attn, judged by attn: compute every fixture's attention with
NumPy, write DIR/<fixture name>.h5 (`out` and `lse`, or `y` for a layer case), then

    attn verify FIXTURES --outputs DIR --outputs-name numpy-f64

gives attnbench's verdicts, JSON and JUnit for them. Any tool on any machine can do the
same (a GPU host, a framework's own test): the file per fixture is the whole interface.

    examples/outputs/numpy_outputs.py FIXTURES_DIR OUT_DIR [--dtype-round] [--break-k]

--dtype-round rounds the results to the case's dtype as a kernel in that dtype would
(bfloat16 and float16 by NumPy's casts); --break-k reads K transposed (head dim and
sequence swapped where the shapes allow, else reversed), to see a wrong result fail.
Files of format version 2 (windows, softcap, ALiBi, sinks, packed or paged KV) are left
out: this example implements version 1, so attn verify reports them as SKIP
(tests/data/make_v2_cases.py has a NumPy implementation of version 2).
Needs h5py (Debian: python3-h5py).
"""

import argparse
import os
import sys

import h5py
import numpy as np


def attention(q, k, v, scale, causal, mask, bias, kv_len, break_k=False):
    b, hq, sq, _ = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    group = hq // hkv
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    if break_k:
        k = k[:, :, ::-1, :]
    s = scale * np.einsum("bhid,bhjd->bhij", q, k)
    visible = np.ones((b, hq, sq, sk), dtype=bool)
    if mask is not None:
        visible &= np.broadcast_to(mask != 0, visible.shape)
    if bias is not None:
        full = np.broadcast_to(bias, visible.shape)
        visible &= full != -np.inf
        s = s + np.where(np.isfinite(full), full, 0.0)
    if kv_len is not None:
        visible &= (np.arange(sk)[None, :] < kv_len[:, None])[:, None, None, :]
    if causal != "none":
        offset = 0 if causal == "top_left" else sk - sq
        visible &= (np.arange(sk)[None, :] <= np.arange(sq)[:, None] + offset)[None, None]
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True) if sk else np.full((b, hq, sq, 1), -np.inf)
    empty = ~np.isfinite(m)
    e = np.where(visible, np.exp(s - np.where(empty, 0.0, m)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    weights = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    out = weights @ v
    with np.errstate(divide="ignore"):
        lse = np.where(empty[..., 0], -np.inf, (m + np.log(np.where(total > 0, total, 1.0)))[..., 0])
    return out, lse


def rounded(x, dtype):
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float64)
    if dtype == "float32":
        return x.astype(np.float32).astype(np.float64)
    if dtype == "bfloat16":
        bits = x.astype(np.float32).view(np.uint32)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    return x


def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def one(path, out_dir, dtype_round, break_k):
    with h5py.File(path, "r") as f:
        a = f.attrs
        if int(a["format_version"]) != 1:
            return None
        name = text(a["name"])
        dtype = text(a["dtype"])
        scale = float(a["scale"]) if "scale" in a else None
        causal = text(a["causal"]) if "causal" in a else "none"
        get = lambda key: f[key][()] if key in f else None
        mask, bias, kv_len = get("mask"), get("bias"), get("kv_len")
        kind = text(a["kind"]) if "kind" in a else "sdpa"
        if kind == "mha":
            hq, hkv = int(a["heads_q"]), int(a["heads_kv"])
            x_q, x_k, x_v = (f[n][()].astype(np.float64) for n in ("x_q", "x_k", "x_v"))
            w = {n: f[n][()].astype(np.float64) for n in ("w_q", "w_k", "w_v", "w_o")}
            bias_of = lambda n, width: f[n][()].astype(np.float64) if n in f else np.zeros(width)
            def heads(x, wname, bname, h):
                y = x @ w[wname] + bias_of(bname, w[wname].shape[1])
                return y.reshape(y.shape[0], y.shape[1], h, -1).transpose(0, 2, 1, 3)
            q, k, v = heads(x_q, "w_q", "b_q", hq), heads(x_k, "w_k", "b_k", hkv), heads(x_v, "w_v", "b_v", hkv)
            if scale is None:
                scale = 1.0 / np.sqrt(q.shape[-1])
            o, _ = attention(q, k, v, scale, causal, mask, bias, kv_len, break_k)
            o = o.transpose(0, 2, 1, 3).reshape(o.shape[0], o.shape[2], -1)
            results = {"y": o @ w["w_o"] + bias_of("b_o", w["w_o"].shape[1])}
        else:
            q, k, v = (f[n][()].astype(np.float64) for n in ("q", "k", "v"))
            if scale is None:
                scale = 1.0 / np.sqrt(q.shape[-1])
            out, lse = attention(q, k, v, scale, causal, mask, bias, kv_len, break_k)
            results = {"out": out, "lse": lse}
    target = os.path.join(out_dir, name + ".h5")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with h5py.File(target, "w") as g:
        for key, value in results.items():
            g.create_dataset(key, data=rounded(value, dtype) if dtype_round and key != "lse" else value)
    return target


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fixtures")
    parser.add_argument("out_dir")
    parser.add_argument("--dtype-round", action="store_true")
    parser.add_argument("--break-k", action="store_true")
    args = parser.parse_args()
    count = left = 0
    for root, _, files in os.walk(args.fixtures):
        for file in sorted(files):
            if file.endswith(".h5"):
                if one(os.path.join(root, file), args.out_dir, args.dtype_round, args.break_k):
                    count += 1
                else:
                    left += 1
    print(f"wrote {count} output files into {args.out_dir}; left out {left} files of format version 2")
    return 0 if count else 1


if __name__ == "__main__":
    sys.exit(main())
