"""The framework paths: PyTorch tensors and JAX arrays in and out, bfloat16 and float16 as they
are, autograd for the backward, NumPy bfloat16 through ml_dtypes. Each runs where its framework
can be imported (the optional venv: scripts/install-python-peers) and is skipped, with the
reason, elsewhere."""

import os
import sys

import numpy as np
import pytest

import attnbench
from kernels import reference

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))

SMOKE = attnbench.cases("smoke")
GRADIENTS = attnbench.cases("full", gradients=True)


def textbook(cases):
    """The cases a textbook float32 backward can compute: the suite's backward/huge_v_* cases hold
    V near float32's largest, where dP = dO V^T overflows and autograd's dQ and dK come out NaN
    (torch 2.15, JAX 0.10); the verifier FAILs that, rightly
    (test_a_textbook_backward_fails_where_dp_overflows)."""
    return [c for c in cases if not c.name.startswith("backward/huge_v_")]


def pick(cases, dtype, features=()):
    """The cases of a dtype that need nothing beyond `features` (quantised ones left out)."""
    return [c for c in cases if c.dtype == dtype and set(c.features) <= set(features)
            and not any(getattr(c.problem, t + "_quant") for t in "qkv")]


def test_torch_tensors_in_their_dtype_zero_copy_and_autograd():
    torch = pytest.importorskip("torch")
    import torch_kernels

    seen = []

    @attnbench.kernel(framework="torch")
    def probe(q, k, v, *, scale, out):
        seen.append((q.dtype, out.dtype, out.is_contiguous() or out.stride(), q.data_ptr()))
        out.copy_(torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale))

    for dtype, expected in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        c = pick([c for c in SMOKE if not c.gradients], dtype)[0]  # probe writes `out`: forward only
        v = attnbench.check(probe, c)
        assert v.verdict == "PASS", v.report()
        assert seen[-1][0] == expected and seen[-1][1] == expected
    # The whole smoke tier and the gradient cases of every dtype, forward and backward.
    report = attnbench.verify(torch_kernels.handwritten, SMOKE + textbook(GRADIENTS))
    assert report.ok, report.report()
    directions = {(r["direction"], r["verdict"]) for r in report.json["results"]}
    assert ("backward", "PASS") in directions
    dtypes = {r["problem"].split(",")[0] for r in report.json["results"] if r["verdict"] == "PASS"}
    assert dtypes == {"dtype=f64", "dtype=f32", "dtype=f16", "dtype=bf16"}


def test_a_torch_kernel_takes_every_version_2_case():
    """The hand-written torch kernel declares every feature: no version 2 case (quantised ones
    aside) is SKIP for it, forward or backward, and autograd gives dsinks."""
    pytest.importorskip("torch")
    import torch_kernels

    v2 = {"window", "softcap", "alibi", "sinks", "ragged", "paged"}
    cases = [c for c in textbook(attnbench.cases("full")) if set(c.features) & v2
             and not any(getattr(c.problem, t + "_quant") for t in "qkv")]
    report = attnbench.verify(torch_kernels.handwritten, cases, directions=["forward", "backward"])
    for c, v in zip(cases, report.verdicts):
        assert v.verdict in ("PASS", "MISTRUSTED"), v.report()
        ran = {r.direction for r in v.results if r.verdict != "SKIP"}
        assert ran == ({"forward", "backward"} if c.gradients else {"forward"}), (c.name, ran)
    assert any(c.gradients and "sinks" in c.features for c in cases)


def test_torch_autograd_catches_a_wrong_gradient():
    torch = pytest.importorskip("torch")

    class ScaleGrad(torch.autograd.Function):  # identity forward, doubled gradient
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return 2 * g

    @attnbench.kernel(framework="torch", features=())
    def wrong_dq(q, k, v, *, scale):
        return torch.nn.functional.scaled_dot_product_attention(ScaleGrad.apply(q), k, v, scale=scale)

    c = pick(GRADIENTS, "float32")[0]
    v = attnbench.check(wrong_dq, c)
    assert v.verdict == "FAIL" and [r.direction for r in v.results if r.verdict == "FAIL"] == ["backward"], v.report()


def test_a_textbook_backward_fails_where_dp_overflows():
    """The hand-written torch kernel's autograd on V near float32's largest: dP = dO V^T overflows,
    dQ and dK are NaN where the truth is finite, and the verdict says so."""
    pytest.importorskip("torch")
    import torch_kernels

    c = next(c for c in GRADIENTS if c.name == "backward/huge_v_ds_overflow_f32")
    v = attnbench.check(torch_kernels.handwritten, c, directions=["backward"])
    assert v.verdict == "FAIL" and "NaN" in v.report(), v.report()


def test_jax_arrays_and_vjp():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    @attnbench.kernel(framework="jax", features=("causal", "mask", "kv_len", "bias"), causal="both")
    def jattn(q, k, v, *, scale, causal, mask, bias, kv_len):
        assert isinstance(q, jax.Array)
        g = q.shape[1] // k.shape[1]
        k, v = jnp.repeat(k, g, axis=1), jnp.repeat(v, g, axis=1)
        s = scale * jnp.einsum("bhqd,bhkd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32))
        sq, sk = s.shape[2], s.shape[3]
        visible = jnp.ones(s.shape, bool)
        if mask is not None:
            visible = visible & mask
        if kv_len is not None:
            visible = visible & (jnp.arange(sk)[None, :] < kv_len[:, None])[:, None, None, :]
        if causal != "none":
            offset = 0 if causal == "top_left" else sk - sq
            visible = visible & (jnp.arange(sk)[None, :] <= jnp.arange(sq)[:, None] + offset)
        if bias is not None:
            s = s + bias.astype(jnp.float32)
        s = jnp.where(visible, s, -jnp.inf)
        m = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True)) if sk else jnp.zeros(s.shape[:-1] + (1,))
        m = jnp.where(jnp.isfinite(m), m, 0.0)
        e = jnp.exp(s - m)
        t = e.sum(-1, keepdims=True)
        return jnp.einsum("bhqk,bhkd->bhqd", e / jnp.where(t > 0, t, 1.0), v.astype(jnp.float32)).astype(q.dtype)

    v1 = ("mask", "bias", "kv_len", "causal", "gqa")
    cases = pick(SMOKE, "float32", v1) + pick(SMOKE, "bfloat16") + pick(textbook(GRADIENTS), "float32", v1)
    report = attnbench.verify(jattn, cases)
    assert report.ok, report.report()
    assert ("backward", "PASS") in {(r["direction"], r["verdict"]) for r in report.json["results"]}
    assert all(v.verdict == "PASS" for v in report.verdicts), report.report()
    assert any("copies" in n for v in report.verdicts for n in v.notes)


def test_a_jax_kernel_takes_every_version_2_case():
    """Windows, softcap, ALiBi, sinks, packed and paged batches reach a JAX kernel as jax arrays,
    and jax.vjp differentiates through them (dsinks among the gradients)."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def entry(qe, ke, ve, limit, *, scale, causal, align, mask, bias, window_size, softcap, alibi_slopes, sinks):
        hq, lq = qe.shape[0], qe.shape[1]
        g = hq // ke.shape[0]
        ke, ve = jnp.repeat(ke, g, axis=0).astype(jnp.float32), jnp.repeat(ve, g, axis=0).astype(jnp.float32)
        lk = ke.shape[1]
        s = scale * jnp.einsum("hqd,hkd->hqk", qe.astype(jnp.float32), ke)
        if softcap:
            s = softcap * jnp.tanh(s / softcap)
        i, j = jnp.arange(lq)[:, None], jnp.arange(lk)[None, :]
        diag = i if align == "top_left" else i + lk - lq
        visible = jnp.broadcast_to(j < limit, (hq, lq, lk))
        if causal != "none":
            visible = visible & (j <= diag)
        if window_size[0] >= 0:
            visible = visible & (diag - j <= window_size[0])
        if window_size[1] >= 0:
            visible = visible & (j - diag <= window_size[1])
        if mask is not None:
            visible = visible & mask[..., :lk]
        if alibi_slopes is not None:
            s = s - alibi_slopes[:, None, None] * jnp.abs(diag - j)
        if bias is not None:
            s = s + bias[..., :lk].astype(jnp.float32)
        s = jnp.where(visible, s, -jnp.inf)
        sink = jnp.full((hq, 1, 1), -jnp.inf) if sinks is None else sinks[:, None, None]
        m = jnp.maximum(jnp.max(s, axis=-1, keepdims=True) if lk else jnp.full((hq, lq, 1), -jnp.inf), sink)
        m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
        e = jnp.exp(s - m)
        total = e.sum(-1, keepdims=True) + jnp.exp(sink - m)
        return jnp.einsum("hqk,hkd->hqd", e / jnp.where(total > 0, total, 1.0), ve)

    @attnbench.kernel(framework="jax", causal="both")
    def everything(q, k, v, *, scale, causal, align, mask, bias, kv_len, window_size, softcap, alibi_slopes, sinks,
                   cu_seqlens_q, cu_seqlens_k, block_table, cache_seqlens):
        o = dict(scale=scale, causal=causal, align=align, window_size=window_size, softcap=softcap,
                 alibi_slopes=alibi_slopes, sinks=sinks)
        if cu_seqlens_q is not None:
            out = jnp.zeros(q.shape[:-1] + (v.shape[-1],), jnp.float32)
            for b in range(len(cu_seqlens_q) - 1):
                r0, r1, k0, k1 = (int(x) for x in (cu_seqlens_q[b], cu_seqlens_q[b + 1], cu_seqlens_k[b],
                                                   cu_seqlens_k[b + 1]))
                out = out.at[:, r0:r1].set(entry(q[:, r0:r1], k[:, k0:k1], v[:, k0:k1], k1 - k0, mask=None,
                                                 bias=None, **o))
            return out
        outs = []
        for b in range(q.shape[0]):
            if block_table is not None:
                n = int(cache_seqlens[b])
                pages = block_table[b, :-(-n // k.shape[2])]
                gather = lambda x: jnp.swapaxes(x[pages], 0, 1).reshape(x.shape[1], -1, x.shape[3])[:, :n]
                ke, ve, limit = gather(k), gather(v), n
            else:
                ke, ve = k[b], v[b]
                limit = k.shape[2] if kv_len is None else min(int(kv_len[b]), k.shape[2])
            outs.append(entry(q[b], ke, ve, limit, mask=None if mask is None else mask[b],
                              bias=None if bias is None else bias[b], **o))
        return jnp.stack(outs)

    v2 = {"window", "softcap", "alibi", "sinks", "ragged", "paged"}
    # XLA's CPU flushes subnormals (as TensorFlow does): sinks/far_above's outputs near 1e-40 and
    # backward/subnormal_weights_sink_*'s gradients, made of weights near e^-95, FAIL (jax 0.10).
    flushed = ("far_above", "subnormal_weights")
    cases = [c for c in textbook(attnbench.cases("full")) if set(c.features) & v2 and c.dtype == "float32"
             and not any(getattr(c.problem, t + "_quant") for t in "qkv") and not any(f in c.name for f in flushed)]
    report = attnbench.verify(everything, cases, directions=["forward", "backward"])
    for c, v in zip(cases, report.verdicts):
        assert v.verdict in ("PASS", "MISTRUSTED"), v.report()
    assert ("backward", "PASS") in {(r["direction"], r["verdict"]) for r in report.json["results"]}


def test_numpy_bfloat16_through_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    import numpy_kernel

    seen = []

    def record(q, k, v, *, scale, causal, mask, bias, kv_len):
        seen.append(q.dtype)
        out, lse = reference(q, k, v, scale=scale, causal=causal, mask=mask, bias=bias, kv_len=kv_len)
        return out.astype(q.dtype), lse

    k = attnbench.kernel(record, causal="both", lse=True, dtypes=("bfloat16",))
    report = attnbench.verify(k, pick(SMOKE, "bfloat16", attnbench.FEATURES))
    assert report.ok and report.counts().get("PASS", 0) >= 2, report.report()
    assert set(seen) == {np.dtype(ml_dtypes.bfloat16)}


def test_a_torch_kernel_on_a_cuda_device_is_copied_or_skipped():
    torch = pytest.importorskip("torch")

    @attnbench.kernel(framework="torch", device="cuda", features=())
    def on_device(q, k, v, *, scale):
        assert q.device.type == "cuda"
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)

    v = attnbench.check(on_device, pick(SMOKE, "float32")[0])
    if torch.cuda.is_available():
        assert v.verdict == "PASS" and any("copied to cuda" in n for n in v.notes), v.report()
    else:
        assert v.verdict == "SKIP" and "sees no CUDA device" in v.reason, v.report()
