#!/usr/bin/env python3
"""Writes format version 4 fixtures (docs/format/v4.md) as a converter outside
attnbench would, with the quantisers of other tools: ml_dtypes' float8 casts
(e4m3fn, e5m2) and int4, and gguf-py's Q8_0 and Q4_0 quantizer (the bytes a
GGUF tensor holds). Written from the docs page alone; the golden is NumPy's
float64 attention of the exactly dequantised values.

- fp8 e4m3 K and V, a descale per (batch, kv head), GQA 8:2 decode, kv_len;
- a bfloat16 case: Q e5m2 with its descale per (batch, kv head) (FlashAttention-3's
  indexing), K e4m3 with one descale, V Q8_0, causal bottom-right, seq_q < seq_k;
- a paged float16 decode: K Q8_0 and V Q4_0 in pages of 16 in shuffled order,
  free pages and slots past each length holding blocks of d = 65504 and the
  largest q (values of 8.3e6, beyond float16's range, that no entry reads);
- uint8 K with a scale and zero point per group of 16 per token (a min/max
  quantiser), int4 V with a scale per token, causal top-left.

Needs a venv with h5py, ml_dtypes and gguf (pip install h5py ml_dtypes gguf):
    V/bin/python make_outside_v4_cases.py tests/data
The outputs are committed (written with ml_dtypes 0.7.0 and gguf 0.19.0); the tests only read them.
"""
import sys
from importlib.metadata import version

import h5py
import ml_dtypes
import numpy as np
from gguf.quants import quantize, dequantize
from gguf import GGMLQuantizationType as T

out_dir = sys.argv[1]
rng = np.random.default_rng(7)


def attention(q, k, v, scale, causal="none", kv_len=None, lens=None):
    """float64 reference; q [b,hq,sq,d], k/v [b,hkv,sk,.] dense (lens: per-entry key count, bottom-right from it)."""
    b, hq, sq, _ = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    g = hq // hkv
    kk = np.repeat(k, g, 1)
    vv = np.repeat(v, g, 1)
    s = np.einsum("bhid,bhjd->bhij", q, kk) * scale
    vis = np.ones((b, 1, sq, sk), bool)
    j = np.arange(sk)
    for e in range(b):
        klen = sk if lens is None else lens[e]
        vis[e, :, :, klen:] = False
        if kv_len is not None:
            vis[e, :, :, kv_len[e]:] = False
        if causal != "none":
            for i in range(sq):
                diag = i if causal == "top_left" else i + klen - sq
                vis[e, :, i, j > diag] = False
    s = np.where(vis, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    p = np.exp(s - m)
    z = p.sum(-1, keepdims=True)
    out = np.where(z > 0, np.einsum("bhij,bhjd->bhid", p, vv) / np.where(z > 0, z, 1), 0)
    lse = np.where(z[..., 0] > 0, (m + np.log(np.where(z > 0, z, 1)))[..., 0], -np.inf)
    return out, lse


def header(f, name, dtype, b, hq, hkv, sq, sk, d, dv, scale, causal="none", **extra):
    f.attrs.update(dict(format="attn-fixture", format_version=4, name=name, description="written by tests/data/make_outside_v4_cases.py",
                        generator=f"ml_dtypes {ml_dtypes.__version__}, gguf {version('gguf')}", dtype=dtype, causal=causal, batch=b,
                        heads_q=hq, heads_kv=hkv, seq_q=sq, seq_k=sk, head_dim=d, head_dim_v=dv, scale=scale, **extra))


def fp8(x, kind, axes_descale):
    """codes, descale (float32) and exact values: amax per (batch, kv head) or per tensor."""
    top = float(ml_dtypes.finfo(kind).max)
    amax = np.abs(x).max(axis=axes_descale, keepdims=True) if axes_descale else np.abs(x).max(keepdims=True)
    descale = (amax / np.float32(top)).astype(np.float32)
    codes = (x / descale).astype(np.float32).astype(kind)
    values = codes.astype(np.float64) * descale.astype(np.float64)
    return codes.view(np.uint8), descale, values


# A. e4m3 K and V from ml_dtypes, descale per (batch, kv head), GQA 8:2 decode, kv_len.
b, hq, hkv, sq, sk, d = 2, 8, 2, 1, 77, 64
q = rng.standard_normal((b, hq, sq, d)).astype(np.float32)
k = (rng.standard_normal((b, hkv, sk, d)) * 3).astype(np.float32)
v = rng.standard_normal((b, hkv, sk, d)).astype(np.float32)
kc, kd, kv_ = fp8(k, ml_dtypes.float8_e4m3fn, (2, 3))
vc, vd, vv_ = fp8(v, ml_dtypes.float8_e4m3fn, (2, 3))
kv_len = np.array([77, 50], np.int64)
o, l = attention(q.astype(np.float64), kv_, vv_, 1 / np.sqrt(d), kv_len=kv_len)
with h5py.File(f"{out_dir}/mldtypes_v4_e4m3_kv_head_descale_gqa_decode_f32.h5", "w") as f:
    header(f, "outside/mldtypes_e4m3_kv", "float32", b, hq, hkv, sq, sk, d, d, 1 / np.sqrt(d),
           k_encoding="float8_e4m3fn", v_encoding="float8_e4m3fn")
    f["q"], f["k"], f["v"] = q, kc, vc
    f["k_descale"], f["v_descale"] = kd.reshape(b, hkv), vd.reshape(b, hkv)
    f["kv_len"] = kv_len
    f["k_original"], f["v_original"] = k, v
    f["out"], f["lse"] = o, l

# B. bfloat16 case: q e5m2 (descale per (batch, kv head), as FA3 indexes it), k e4m3 per tensor,
# v Q8_0 from gguf; causal bottom-right prefill, seq_q < seq_k.
b, hq, hkv, sq, sk, d = 1, 4, 2, 5, 40, 64
q = rng.standard_normal((b, hq, sq, d)).astype(np.float32)
k = rng.standard_normal((b, hkv, sk, d)).astype(np.float32)
v = rng.standard_normal((b, hkv, sk, d)).astype(np.float32)
# q's descale per (b, kv head): amax over each group of query heads
qg = q.reshape(b, hkv, hq // hkv, sq, d)
qc, qd, qv_ = fp8(qg, ml_dtypes.float8_e5m2, (2, 3, 4))
qc, qv_ = qc.reshape(q.shape), qv_.reshape(q.shape)
kc, kd, kv_ = fp8(k, ml_dtypes.float8_e4m3fn, None)
vc = quantize(v, T.Q8_0)
vv_ = dequantize(vc, T.Q8_0).astype(np.float64).reshape(v.shape)
o, l = attention(qv_, kv_, vv_, 1 / np.sqrt(d), causal="bottom_right")
with h5py.File(f"{out_dir}/mldtypes_gguf_v4_e5m2_q_e4m3_k_q8_0_v_causal_bf16.h5", "w") as f:
    header(f, "outside/e5m2_q_e4m3_k_q8_0_v", "bfloat16", b, hq, hkv, sq, sk, d, d, 1 / np.sqrt(d),
           causal="bottom_right", q_encoding="float8_e5m2", k_encoding="float8_e4m3fn", v_encoding="q8_0")
    f["q"], f["k"], f["v"] = qc, kc, vc
    f["q_descale"], f["k_descale"] = qd.reshape(b, hkv), kd.reshape(())
    f["q_original"], f["k_original"], f["v_original"] = q, k, v
    f["out"], f["lse"] = o, l

# C. Paged float16 decode: K Q8_0 and V Q4_0 from gguf, pages of 16 in shuffled order, free pages and
# slots past each length holding huge valid blocks (d = 65504, q = 127 / nibble 15).
b, hq, hkv, sq, d, ps = 3, 8, 2, 1, 64, 16
lens = np.array([33, 70, 5])
pages_per = 5
num_pages = b * pages_per + 3
sk = pages_per * ps
q = rng.standard_normal((b, hq, sq, d)).astype(np.float16).astype(np.float32)
k = rng.standard_normal((b, hkv, sk, d)).astype(np.float32)
v = rng.standard_normal((b, hkv, sk, d)).astype(np.float32)
kq = quantize(k, T.Q8_0)
vq = quantize(v, T.Q4_0)
kd_ = dequantize(kq, T.Q8_0).astype(np.float64).reshape(k.shape)
vd_ = dequantize(vq, T.Q4_0).astype(np.float64).reshape(v.shape)
def huge_block(kind, width):
    blk = np.zeros(width // 32 * (34 if kind == "q8" else 18), np.uint8)
    for n in range(width // 32):
        o0 = n * (34 if kind == "q8" else 18)
        blk[o0:o0 + 2] = np.frombuffer(np.float16(65504).tobytes(), np.uint8)
        blk[o0 + 2:o0 + (34 if kind == "q8" else 18)] = 127 if kind == "q8" else 0xFF
    return blk
kpool = np.broadcast_to(huge_block("q8", d), (num_pages, hkv, ps, kq.shape[-1])).copy()
vpool = np.broadcast_to(huge_block("q4", d), (num_pages, hkv, ps, vq.shape[-1])).copy()
perm = rng.permutation(num_pages)
table = perm[: b * pages_per].reshape(b, pages_per).astype(np.int64)
for e in range(b):
    for p in range(pages_per):
        for slot in range(ps):
            j = p * ps + slot
            if j < lens[e]:
                kpool[table[e, p], :, slot] = kq[e, :, j]
                vpool[table[e, p], :, slot] = vq[e, :, j]
o, l = attention(q.astype(np.float64), kd_, vd_, 1 / np.sqrt(d), lens=lens)
with h5py.File(f"{out_dir}/gguf_v4_q8_0_k_q4_0_v_paged_huge_free_slots_f16.h5", "w") as f:
    header(f, "outside/gguf_paged", "float16", b, hq, hkv, sq, sk, d, d, 1 / np.sqrt(d),
           k_encoding="q8_0", v_encoding="q4_0", page_size=ps)
    f["q"], f["k"], f["v"] = q, kpool, vpool
    f["page_table"], f["seq_lens"] = table, lens.astype(np.int64)
    f["out"], f["lse"] = o, l

# D. uint8 K with a scale and zero point per group of 16 per token (ml_dtypes-free, asymmetric
# min/max quantiser as KIVI writes it), int4 V per token via ml_dtypes.int4, packed low nibble first.
b, hq, hkv, sq, sk, d, G = 2, 2, 1, 6, 23, 48, 16
q = rng.standard_normal((b, hq, sq, d)).astype(np.float32)
k = rng.standard_normal((b, hkv, sk, d)).astype(np.float32)
v = rng.standard_normal((b, hkv, sk, d)).astype(np.float32)
kg = k.reshape(b, hkv, sk, d // G, G)
lo, hi = kg.min(-1), kg.max(-1)
kscale = ((hi - lo) / 255).astype(np.float32)
kzp = np.clip(np.rint(-lo / kscale), 0, 255).astype(np.int64)
kcodes = np.clip(np.rint(kg / kscale[..., None]) + kzp[..., None], 0, 255).astype(np.uint8).reshape(k.shape)
kvals = ((kcodes.reshape(kg.shape).astype(np.float64) - kzp[..., None]) * kscale[..., None]).reshape(k.shape)
vscale = (np.abs(v).max(-1, keepdims=True) / 7).astype(np.float32)
vint = np.clip(np.rint(v / vscale), -8, 7).astype(ml_dtypes.int4)
vvals = vint.astype(np.float64) * vscale.astype(np.float64)
nib = vint.astype(np.int8).view(np.uint8) & 15
vcodes = (nib[..., 0::2] | (nib[..., 1::2] << 4)).astype(np.uint8)
o, l = attention(q.astype(np.float64), kvals, vvals, 0.2, causal="top_left")
with h5py.File(f"{out_dir}/mldtypes_v4_u8_k_group_zp_int4_v_causal_f32.h5", "w") as f:
    header(f, "outside/u8_int4", "float32", b, hq, hkv, sq, sk, d, d, 0.2, causal="top_left",
           k_encoding="uint8", v_encoding="int4")
    f["q"], f["k"], f["v"] = q, kcodes, vcodes
    f["k_scale"], f["k_zero_point"] = kscale, kzp
    f["v_scale"] = vscale
    f["k_original"], f["v_original"] = k, v
    f["out"], f["lse"] = o, l
print("wrote 4 files to", out_dir)
