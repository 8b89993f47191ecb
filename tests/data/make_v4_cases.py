#!/usr/bin/env python3
"""Writes format version 4 fixtures (docs/format/v4.md) with h5py + NumPy,
from encoders of their own (no ml_dtypes, no gguf), to prove that quantised
files other tools write load and verify unchanged: fp8 e4m3 K and V with a
scalar descale and one per (batch, kv head); ggml Q8_0 K and int4 V with a
scale per group of 8, in an int8 dataset; int8 K with a zero point per token;
and a file whose golden was computed from the original values instead of the
dequantised ones (attnbench must refuse it; named .refused, not .h5, so that
runs over this folder leave it out).

Run with Debian's python3-h5py and python3-numpy:  /usr/bin/python3 make_v4_cases.py
The outputs are committed; the tests only read them.
"""
import h5py
import numpy as np

rng = np.random.default_rng(4)


def e4m3_values():
    """The 256 values of float8_e4m3fn by code (NaN at 0x7F and 0xFF)."""
    out = np.empty(256)
    for code in range(256):
        e, m = (code >> 3) & 0xF, code & 7
        a = np.nan if (e == 15 and m == 7) else (m * 2.0 ** -9 if e == 0 else (8 + m) * 2.0 ** (e - 10))
        out[code] = -a if code & 0x80 else a
    return out


E4M3 = e4m3_values()


def to_e4m3(x):
    """Nearest code, ties to the even code, saturating at 448."""
    finite = np.arange(256)[~np.isnan(E4M3)]
    vals = E4M3[finite]
    x = np.clip(np.asarray(x, dtype=np.float64), -448, 448)
    d = np.abs(x[..., None] - vals)
    best = d.min(-1, keepdims=True)
    ties = np.where(d == best, finite, 1 << 20)
    even = np.where((ties & 1) == 0, ties, 1 << 20).min(-1)
    # +0 over -0 for zero; otherwise the even code among the nearest
    return np.where(even < (1 << 20), even, ties.min(-1)).astype(np.uint8)


def f16_bytes(d):
    return np.frombuffer(np.float16(d).astype("<f2").tobytes(), np.uint8)


def q8_0_row(x):
    """ggml's quantize_row_q8_0_ref on one row (a multiple of 32)."""
    blocks = []
    for b in range(0, len(x), 32):
        v = x[b:b + 32].astype(np.float32)
        d = np.float32(np.abs(v).max() / np.float32(127))
        inv = np.float32(1) / d if d else np.float32(0)
        q = np.round(v * inv).astype(np.int8)  # ties away from zero, as roundf
        blocks.append(np.concatenate([f16_bytes(d), q.view(np.uint8)]))
    return np.concatenate(blocks)


def q8_0_dequant(row, dim):
    out = np.empty(dim)
    for b in range(dim // 32):
        blk = row[b * 34:(b + 1) * 34]
        d = float(np.frombuffer(blk[:2].tobytes(), "<f2")[0])
        out[b * 32:(b + 1) * 32] = d * blk[2:].view(np.int8)
    return out


def attention(q, k, v, scale, causal="none"):
    """float64 attention; q [b, hq, sq, d], k and v [b, hkv, sk, .]."""
    b, hq, sq, _ = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    group = hq // hkv
    out = np.zeros((b, hq, sq, v.shape[3]))
    lse = np.zeros((b, hq, sq))
    for bi in range(b):
        for h in range(hq):
            s = scale * q[bi, h] @ k[bi, h // group].T
            if causal == "bottom_right":
                s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + sk - sq, s, -np.inf)
            m = s.max(-1, keepdims=True)
            p = np.exp(s - m)
            out[bi, h] = (p / p.sum(-1, keepdims=True)) @ v[bi, h // group]
            lse[bi, h] = (m + np.log(p.sum(-1, keepdims=True)))[:, 0]
    return out, lse


def write(path, attrs, datasets):
    with h5py.File(path, "w") as f:
        for key, value in attrs.items():
            f.attrs[key] = value
        for key, value in datasets.items():
            f[key] = value


def base_attrs(name, dtype, b, hq, hkv, sq, sk, d, dv, causal="none"):
    return dict(format="attn-fixture", format_version=np.int32(4), name=name, description="written by make_v4_cases.py",
                generator=f"numpy {np.__version__}", dtype=dtype, batch=b, heads_q=hq, heads_kv=hkv, seq_q=sq, seq_k=sk,
                head_dim=d, head_dim_v=dv, scale=1 / np.sqrt(d), causal=causal)


def e4m3_case(path, golden_from_originals=False):
    b, hq, hkv, sq, sk, d = 2, 4, 2, 3, 10, 16
    q = rng.standard_normal((b, hq, sq, d)).astype(np.float32)
    k = rng.standard_normal((b, hkv, sk, d)).astype(np.float32)
    v = rng.standard_normal((b, hkv, sk, d)).astype(np.float32)
    k_descale = np.float32(np.abs(k).max() / 448)
    v_descale = (np.abs(v).max(axis=(2, 3)) / 448).astype(np.float32)  # [batch, heads_kv]
    k_codes = to_e4m3(k / np.float64(k_descale))
    v_codes = to_e4m3(v / v_descale.astype(np.float64)[:, :, None, None])
    k_deq = E4M3[k_codes] * np.float64(k_descale)
    v_deq = E4M3[v_codes] * v_descale.astype(np.float64)[:, :, None, None]
    if golden_from_originals:
        out, lse = attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), 1 / np.sqrt(d))
    else:
        out, lse = attention(q.astype(np.float64), k_deq, v_deq, 1 / np.sqrt(d))
    attrs = base_attrs("numpy_v4/e4m3_kv" + ("_golden_from_originals" if golden_from_originals else ""), "float32", b, hq,
                       hkv, sq, sk, d, d)
    attrs.update(k_encoding="float8_e4m3fn", v_encoding="float8_e4m3fn")
    write(path, attrs, dict(q=q, k=k_codes, v=v_codes, k_descale=k_descale, v_descale=v_descale, k_original=k,
                            v_original=v, out=out, lse=lse))


def q8_0_int4_case(path):
    b, hq, hkv, sq, sk, d, dv, group = 1, 4, 1, 2, 12, 64, 16, 8
    q = rng.standard_normal((b, hq, sq, d)).astype(np.float32)
    q = q.view(np.uint32) & np.uint32(0xFFFF0000)  # bfloat16 values
    q = q.view(np.float32)
    k = rng.standard_normal((b, hkv, sk, d)).astype(np.float32)
    v = rng.standard_normal((b, hkv, sk, dv)).astype(np.float32)
    k_rows = np.stack([q8_0_row(row) for row in k.reshape(-1, d)]).reshape(b, hkv, sk, d // 32 * 34)
    k_deq = np.stack([q8_0_dequant(row, d) for row in k_rows.reshape(-1, d // 32 * 34)]).reshape(k.shape)
    # int4 V, symmetric, a scale per group of 8 per token: [b, hkv, sk, dv / 8]
    groups = v.reshape(b, hkv, sk, dv // group, group)
    v_scale = (np.abs(groups).max(-1) / 7).astype(np.float32)
    codes = np.clip(np.rint(groups / v_scale[..., None].astype(np.float64)), -8, 7).astype(np.int8).reshape(b, hkv, sk, dv)
    nibbles = codes.astype(np.uint8) & 0xF
    packed = (nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)).astype(np.uint8).view(np.int8)  # element 2n low, 2n + 1 high
    v_deq = (codes.reshape(b, hkv, sk, dv // group, group) * v_scale[..., None].astype(np.float64)).reshape(v.shape)
    out, lse = attention(q.astype(np.float64), k_deq, v_deq, 1 / np.sqrt(d), "bottom_right")
    attrs = base_attrs("numpy_v4/q8_0_k_int4_v", "bfloat16", b, hq, hkv, sq, sk, d, dv, "bottom_right")
    attrs.update(k_encoding="q8_0", v_encoding="int4")
    write(path, attrs, dict(q=q, k=k_rows, v=packed, v_scale=v_scale, out=out, lse=lse))


def int8_zero_point_case(path):
    b, hq, hkv, sq, sk, d = 1, 2, 2, 4, 9, 8
    q = rng.standard_normal((b, hq, sq, d)).astype(np.float32)
    k = (rng.standard_normal((b, hkv, sk, d)) + 0.5).astype(np.float32)
    v = rng.standard_normal((b, hkv, sk, d)).astype(np.float32)
    lo, hi = k.min(-1, keepdims=True), k.max(-1, keepdims=True)
    k_scale = ((hi - lo) / 255).astype(np.float32)
    k_zero = np.clip(np.rint(-128 - lo / k_scale), -128, 127).astype(np.int32)
    k_codes = np.clip(np.rint(k / k_scale) + k_zero, -128, 127).astype(np.int8)
    k_deq = (k_codes.astype(np.float64) - k_zero) * k_scale.astype(np.float64)
    out, lse = attention(q.astype(np.float64), k_deq, v.astype(np.float64), 1 / np.sqrt(d))
    attrs = base_attrs("numpy_v4/int8_k_zero_point", "float32", b, hq, hkv, sq, sk, d, d)
    attrs.update(k_encoding="int8")
    write(path, attrs, dict(q=q, k=k_codes, k_scale=k_scale, k_zero_point=k_zero, v=v, out=out, lse=lse))


if __name__ == "__main__":
    e4m3_case("numpy_v4_e4m3_kv_f32.h5")
    # Not .h5: the runs over this folder (make verify's tests) would report it; the test names it.
    e4m3_case("numpy_v4_e4m3_golden_from_originals_f32.refused", golden_from_originals=True)
    q8_0_int4_case("numpy_v4_q8_0_k_int4_v_bf16.h5")
    int8_zero_point_case("numpy_v4_int8_k_zero_point_f32.h5")
