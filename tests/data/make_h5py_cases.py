#!/usr/bin/env python3
"""Writes fixtures with h5py + NumPy, independently of the C++ code, to prove
that files other tools write in the shared format load and verify unchanged.

Run with Debian's python3-h5py and python3-numpy:  /usr/bin/python3 make_h5py_cases.py
The outputs are committed; the tests only read them.
"""
import h5py
import numpy as np


def attention(q, k, v, scale, mask=None, bias=None, kv_len=None, causal="none"):
    """Float64 attention straight from docs/format/v1.md."""
    b_, hq, sq, _ = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    group = hq // hkv
    out = np.zeros((b_, hq, sq, v.shape[3]))
    lse = np.full((b_, hq, sq), -np.inf)
    for b in range(b_):
        for h in range(hq):
            g = h // group
            s = scale * (q[b, h].astype(np.float64) @ k[b, g].astype(np.float64).T)
            vis = np.ones((sq, sk), dtype=bool)
            if bias is not None:
                bb = bias[b % bias.shape[0], h % bias.shape[1]]
                bb = np.broadcast_to(bb, (sq, sk)).astype(np.float64)
                vis &= ~np.isneginf(bb)
                s = s + np.where(np.isneginf(bb), 0.0, bb)
            if mask is not None:
                mm = mask[b % mask.shape[0], h % mask.shape[1]]
                vis &= np.broadcast_to(mm != 0, (sq, sk))
            if kv_len is not None:
                vis &= (np.arange(sk)[None, :] < kv_len[b])
            i = np.arange(sq)[:, None]
            j = np.arange(sk)[None, :]
            if causal == "top_left":
                vis &= j <= i
            elif causal == "bottom_right":
                vis &= j <= i + sk - sq
            for r in range(sq):
                if not vis[r].any():
                    continue
                row = s[r][vis[r]]
                m = row.max()
                e = np.exp(row - m)
                out[b, h, r] = (e / e.sum()) @ v[b, g][vis[r]].astype(np.float64)
                lse[b, h, r] = m + np.log(e.sum())
    return out, lse


def case_variable_strings_bool_mask_compressed(path):
    rng = np.random.default_rng(7)
    b, hq, hkv, sq, sk, d = 2, 4, 2, 5, 7, 8
    q = rng.standard_normal((b, hq, sq, d)).astype(np.float32)
    k = rng.standard_normal((b, hkv, sk, d)).astype(np.float32)
    v = rng.standard_normal((b, hkv, sk, d)).astype(np.float32)
    mask = rng.random((1, hq, sq, sk)) > 0.3
    mask[0, 1, 2, :] = False  # one fully hidden row
    bias = rng.standard_normal((b, 1, 1, sk))
    bias[1, 0, 0, 3] = -np.inf
    bias = bias.astype(np.float32).astype(np.float64)
    kv_len = np.array([7, 4], dtype=np.int64)
    scale = 1 / np.sqrt(d)
    out, lse = attention(q, k, v, scale, mask, bias, kv_len, "bottom_right")
    with h5py.File(path, "w") as f:
        # h5py writes str attributes as variable-length UTF-8.
        f.attrs["format"] = "attn-fixture"
        f.attrs["format_version"] = np.int32(1)
        f.attrs["name"] = "h5py/vlen_bool_mask_compressed"
        f.attrs["description"] = "written by h5py: vlen strings, bool mask, gzip+shuffle+fletcher32"
        f.attrs["generator"] = f"numpy {np.__version__}"
        f.attrs["dtype"] = "float32"
        f.attrs["batch"] = np.array([b], dtype=np.int16)  # one-element array
        f.attrs["heads_q"] = np.uint8(hq)
        f.attrs["heads_kv"] = np.int64(hkv)
        f.attrs["seq_q"] = np.int32(sq)
        f.attrs["seq_k"] = np.int32(sk)
        f.attrs["head_dim"] = np.int32(d)
        f.attrs["head_dim_v"] = np.int32(d)
        f.attrs["scale"] = np.float64(scale)
        f.attrs["causal"] = "bottom_right"
        f.attrs["tags"] = "h5py, external"
        opts = dict(compression="gzip", shuffle=True, fletcher32=True, chunks=True)
        f.create_dataset("q", data=q, **opts)
        f.create_dataset("k", data=k, **opts)
        f.create_dataset("v", data=v, **opts)
        f.create_dataset("mask", data=mask, **opts)
        f.create_dataset("bias", data=bias)
        f.create_dataset("kv_len", data=kv_len)
        f.create_dataset("out", data=out, **opts)
        f.create_dataset("lse", data=lse)


def case_fixed_strings_int8_mask_f16(path):
    rng = np.random.default_rng(11)
    b, hq, hkv, sq, sk, d, dv = 1, 3, 1, 4, 6, 16, 8
    q = rng.standard_normal((b, hq, sq, d)).astype(np.float16).astype(np.float32)
    k = rng.standard_normal((b, hkv, sk, d)).astype(np.float16).astype(np.float32)
    v = rng.standard_normal((b, hkv, sk, dv)).astype(np.float16).astype(np.float32)
    mask = (rng.random((1, 1, sq, sk)) > 0.25).astype(np.int8)
    scale = float(np.float32(0.2))  # the value the file stores
    out, _ = attention(q, k, v, scale, mask, None, None, "top_left")
    with h5py.File(path, "w") as f:
        # Fixed-length ASCII strings, scale as float32, no lse, no description.
        for key, value in [("format", "attn-fixture"), ("name", "h5py/fixed_strings_int8_mask_f16"),
                           ("generator", "numpy"), ("dtype", "float16"), ("causal", "top_left")]:
            f.attrs[key] = np.bytes_(value)
        f.attrs["format_version"] = np.float64(1.0)  # a whole number stored as float
        for key, value in [("batch", b), ("heads_q", hq), ("heads_kv", hkv), ("seq_q", sq), ("seq_k", sk),
                           ("head_dim", d), ("head_dim_v", dv)]:
            f.attrs[key] = np.int64(value)
        f.attrs["scale"] = np.float32(scale)
        f.create_dataset("q", data=q)
        f.create_dataset("k", data=k)
        f.create_dataset("v", data=v)
        f.create_dataset("mask", data=mask)
        f.create_dataset("out", data=out)


def case_pytorch_style_layer(path):
    """A layer laid out as torch.nn.MultiheadAttention stores it (in_proj_weight
    [3E, E], out_proj.weight [E, E], weights applied as x @ W^T), transposed
    into w_q, w_k, w_v, w_o as the format asks. y from NumPy in float64."""
    rng = np.random.default_rng(5)
    embed, heads, batch, seq = 16, 2, 2, 5
    head_dim = embed // heads
    in_proj_weight = (rng.standard_normal((3 * embed, embed)) / 4).astype(np.float32)
    in_proj_bias = (rng.standard_normal(3 * embed) / 10).astype(np.float32)
    out_weight = (rng.standard_normal((embed, embed)) / 4).astype(np.float32)
    out_bias = (rng.standard_normal(embed) / 10).astype(np.float32)
    x = rng.standard_normal((batch, seq, embed)).astype(np.float32)
    key_padding = np.array([[False] * 5, [False, False, False, True, True]])  # torch: True = ignore
    w_q, w_k, w_v = (in_proj_weight[i * embed:(i + 1) * embed].T for i in range(3))
    b_q, b_k, b_v = (in_proj_bias[i * embed:(i + 1) * embed] for i in range(3))
    f64 = lambda a: a.astype(np.float64)
    q = f64(x) @ f64(w_q) + f64(b_q)
    k = f64(x) @ f64(w_k) + f64(b_k)
    v = f64(x) @ f64(w_v) + f64(b_v)
    split = lambda t: t.reshape(batch, seq, heads, head_dim).transpose(0, 2, 1, 3)
    mask = (~key_padding)[:, None, None, :]  # attend = True, [batch, 1, 1, seq]
    o, _ = attention(split(q), split(k), split(v), 1 / np.sqrt(head_dim), mask=mask)
    y = o.transpose(0, 2, 1, 3).reshape(batch, seq, embed) @ f64(out_weight.T) + f64(out_bias)
    with h5py.File(path, "w") as f:
        for key, value in [("format", "attn-fixture"), ("kind", "mha"), ("name", "h5py/pytorch_style_layer"),
                           ("description", "nn.MultiheadAttention weights transposed into w_q, w_k, w_v, w_o"),
                           ("generator", f"numpy {np.__version__}"), ("dtype", "float32"), ("causal", "none"),
                           ("tags", "h5py,layer")]:
            f.attrs[key] = value
        for key, value in [("format_version", 1), ("batch", batch), ("heads_q", heads), ("heads_kv", heads),
                           ("seq_q", seq), ("seq_k", seq), ("head_dim", head_dim), ("head_dim_v", head_dim),
                           ("model_dim", embed)]:
            f.attrs[key] = np.int64(value)
        f.attrs["scale"] = 1 / np.sqrt(head_dim)
        for name, data in [("x_q", x), ("x_k", x), ("x_v", x), ("w_q", w_q), ("w_k", w_k), ("w_v", w_v),
                           ("w_o", out_weight.T), ("b_q", b_q), ("b_k", b_k), ("b_v", b_v), ("b_o", out_bias),
                           ("mask", mask), ("y", y)]:
            f.create_dataset(name, data=np.ascontiguousarray(data))


def case_pytorch_style_layer_gradients(path):
    """A layer's gradients (format version 3) as a converter from
    torch.nn.MultiheadAttention(embed_dim=16, num_heads=2, kdim=12, vdim=6)
    writes them: separate q/k/v_proj_weight [E, in] transposed into w_q, w_k,
    w_v, cross-attention with a key padding mask, every gradient by the chain
    rule in float64 NumPy (weights' .grad transposed, as the format asks)."""
    rng = np.random.default_rng(11)
    embed, heads, kdim, vdim, batch, sq, sk = 16, 2, 12, 6, 2, 4, 5
    d = embed // heads
    f32 = lambda shape, s: (rng.standard_normal(shape) * s).astype(np.float32)
    q_proj, k_proj, v_proj = f32((embed, embed), 0.25), f32((embed, kdim), 0.3), f32((embed, vdim), 0.4)
    in_proj_bias, out_weight, out_bias = f32(3 * embed, 0.1), f32((embed, embed), 0.25), f32(embed, 0.1)
    xq, xk, xv = f32((batch, sq, embed), 1), f32((batch, sk, kdim), 1), f32((batch, sk, vdim), 1)
    dout = f32((batch, sq, embed), 1)
    key_padding = np.array([[False] * 5, [False, False, True, True, True]])  # torch: True = ignore
    f64 = lambda a: a.astype(np.float64)
    w_q, w_k, w_v, w_o = f64(q_proj.T), f64(k_proj.T), f64(v_proj.T), f64(out_weight.T)
    b_q, b_k, b_v = (f64(in_proj_bias[i * embed:(i + 1) * embed]) for i in range(3))
    split = lambda t: t.reshape(batch, -1, heads, d).transpose(0, 2, 1, 3)
    merge = lambda t: t.transpose(0, 2, 1, 3).reshape(batch, -1, embed)
    q, k, v = split(f64(xq) @ w_q + b_q), split(f64(xk) @ w_k + b_k), split(f64(xv) @ w_v + b_v)
    scale = 1 / np.sqrt(d)
    visible = ~key_padding[:, None, None, :]
    s = np.where(visible, scale * q @ k.transpose(0, 1, 3, 2), -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = p @ v
    y = merge(o) @ w_o + f64(out_bias)
    g = f64(dout)
    d_o = split(g @ w_o.T)
    dv = p.transpose(0, 1, 3, 2) @ d_o
    dp = d_o @ v.transpose(0, 1, 3, 2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq, dk = scale * ds @ k, scale * ds.transpose(0, 1, 3, 2) @ q
    flat = lambda t: t.reshape(-1, t.shape[-1])
    grads = {"dw_o": flat(merge(o)).T @ flat(g), "db_o": flat(g).sum(0)}
    for name, x, w, dproj in (("q", xq, w_q, dq), ("k", xk, w_k, dk), ("v", xv, w_v, dv)):
        m = merge(dproj)
        grads["dx_" + name] = m @ w.T
        grads["dw_" + name] = flat(f64(x)).T @ flat(m)
        grads["db_" + name] = flat(m).sum(0)
    with h5py.File(path, "w") as f:
        for key, value in [("format", "attn-fixture"), ("kind", "mha"), ("name", "h5py/pytorch_style_layer_gradients"),
                           ("description", "nn.MultiheadAttention with kdim 12 and vdim 6: its gradients, h5py-written"),
                           ("generator", f"numpy {np.__version__}"), ("dtype", "float32"), ("causal", "none"),
                           ("tags", "h5py,layer,backward")]:
            f.attrs[key] = value
        for key, value in [("format_version", 3), ("batch", batch), ("heads_q", heads), ("heads_kv", heads),
                           ("seq_q", sq), ("seq_k", sk), ("head_dim", d), ("head_dim_v", d), ("model_dim", embed),
                           ("kdim", kdim), ("vdim", vdim)]:
            f.attrs[key] = np.int64(value)
        f.attrs["scale"] = scale
        for name, data in [("x_q", xq), ("x_k", xk), ("x_v", xv), ("w_q", q_proj.T), ("w_k", k_proj.T),
                           ("w_v", v_proj.T), ("w_o", out_weight.T), ("b_q", in_proj_bias[:embed]),
                           ("b_k", in_proj_bias[embed:2 * embed]), ("b_v", in_proj_bias[2 * embed:]), ("b_o", out_bias),
                           ("mask", visible), ("y", y), ("dout", dout)] + list(grads.items()):
            f.create_dataset(name, data=np.ascontiguousarray(data))


if __name__ == "__main__":
    case_variable_strings_bool_mask_compressed("h5py_vlen_bool_mask_compressed.h5")
    case_fixed_strings_int8_mask_f16("h5py_fixed_strings_int8_mask_f16.h5")
    case_pytorch_style_layer("h5py_pytorch_style_layer.h5")
    case_pytorch_style_layer_gradients("h5py_pytorch_style_layer_gradients_kdim_vdim.h5")
