"""py-numpy-layer (test side): a multi-head attention layer of its own, forward and backward, in
NumPy float64, for the Python contract's layer_backward(): x @ w + b split into heads, the
textbook attention (hidden keys at -inf, a row with none gives 0), merged, @ w_o + b_o; its
gradients by hand. ATTN_TEST_LAYER_FLAW breaks one thing, to prove the verifier sees it through
the bridge: "dw_o_transposed" (the [out, in] torch layout left in), "db_v_left_out"."""

import os

import numpy as np

import attn_common as ac

NAME = "py-numpy-layer"
DESCRIPTION = "test side: a NumPy multi-head attention layer with its own backward"
USES_THREADS = False


def available():
    return None


def supports(problem):
    if problem.softcap or problem.alibi or problem.sinks or problem.window_left >= 0 or problem.window_right >= 0:
        return "the test layer has no window, softcap, ALiBi or sinks"
    return None


def _attention(problem, q, k, v, attend, bias):
    """q [b, hq, sq, d], k/v [b, hq, sk, d] (kv heads repeated): out, P."""
    s = problem.scale * q @ k.transpose(0, 1, 3, 2)
    if bias is not None:
        s = s + bias
    s = np.where(attend, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    total = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return p @ v, p


def prepare(problem, io, threads):
    q = ac.tensor(problem, io, "q").astype(np.float64)
    k = ac.repeat_kv(problem, ac.tensor(problem, io, "k").astype(np.float64))
    v = ac.repeat_kv(problem, ac.tensor(problem, io, "v").astype(np.float64))
    attend = ac.attend(problem, io)
    bias = None if io.bias is None else ac.load(problem, io.bias).astype(np.float64)

    def run():
        out, _ = _attention(problem, q, k, v, attend, bias)
        ac.store(problem, io.out, out)

    return run


def supports_layer(problem, model_dim, kdim=None, vdim=None):
    return supports(problem)


def _split(x, heads):
    b, s, width = x.shape
    return x.reshape(b, s, heads, width // heads).transpose(0, 2, 1, 3)


def _merge(x):
    b, h, s, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, s, h * d)


def _bias(b, width):
    return np.zeros(width) if b is None else b


def _forward(problem, data):
    q = _split(data.x_q @ data.w_q + _bias(data.b_q, data.w_q.shape[1]), problem.heads_q)
    k = _split(data.x_k @ data.w_k + _bias(data.b_k, data.w_k.shape[1]), problem.heads_kv)
    v = _split(data.x_v @ data.w_v + _bias(data.b_v, data.w_v.shape[1]), problem.heads_kv)
    attend = ac.attend(problem, data)
    out, p = _attention(problem, q, ac.repeat_kv(problem, k), ac.repeat_kv(problem, v), attend, data.bias)
    y = _merge(out) @ data.w_o + _bias(data.b_o, data.w_o.shape[1])
    return q, k, v, p, out, y


def layer(problem, data, threads):
    return _forward(problem, data)[5]


def layer_backward(problem, data, dout, bias_requires_grad, threads):
    flaw = os.environ.get("ATTN_TEST_LAYER_FLAW", "")
    q, k, v, p, out, _ = _forward(problem, data)
    m = _merge(out)
    flat = lambda x: x.reshape(-1, x.shape[-1])
    grads = {"dw_o": flat(m).T @ flat(dout)}
    if flaw == "dw_o_transposed":
        grads["dw_o"] = grads["dw_o"].T.reshape(grads["dw_o"].shape)
    if data.b_o is not None:
        grads["db_o"] = flat(dout).sum(axis=0)
    d_o = _split(dout @ data.w_o.T, problem.heads_q)
    kr, vr = ac.repeat_kv(problem, k), ac.repeat_kv(problem, v)
    dv = p.transpose(0, 1, 3, 2) @ d_o
    dp = d_o @ vr.transpose(0, 1, 3, 2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True))
    dq = problem.scale * ds @ kr
    dk = problem.scale * ds.transpose(0, 1, 3, 2) @ q
    dk, dv = ac.sum_kv_groups(problem, dk), ac.sum_kv_groups(problem, dv)
    if bias_requires_grad:
        axes = tuple(a for a in range(4) if data.bias.shape[a] == 1 and ds.shape[a] != 1)
        grads["dbias"] = ds.sum(axis=axes, keepdims=True) if axes else ds
    for name, x, w, b, d in (("q", data.x_q, data.w_q, data.b_q, dq), ("k", data.x_k, data.w_k, data.b_k, dk),
                             ("v", data.x_v, data.w_v, data.b_v, dv)):
        dm = _merge(d)
        grads["dx_" + name] = dm @ w.T
        grads["dw_" + name] = flat(x).T @ flat(dm)
        if b is not None and not (name == "v" and flaw == "db_v_left_out"):
            grads["db_" + name] = flat(dm).sum(axis=0)
    return grads
