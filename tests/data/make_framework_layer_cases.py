#!/usr/bin/env python3
"""Writes layer-gradient fixtures (docs/format/v3.md "Layers") as a converter
outside attnbench would: the golden y and every gradient computed by the
framework itself in float64, Keras' MultiHeadAttention under
tf.GradientTape and PyTorch's nn.MultiheadAttention under autograd, with
inputs, weights and dout exact in float32 (the case's dtype).

- Keras: cross-attention with key and value widths of their own (kdim 12,
  vdim 6), an attention_mask [batch, seq_q, seq_k] padding the second
  entry's last keys, biases on, 3 heads of key_dim 4 and value_dim 5;
- PyTorch: batch_first, kdim 10 / vdim 7 (q_proj_weight, k_proj_weight,
  v_proj_weight), a key_padding_mask (True = ignore) and a bottom-right
  causal attn_mask with seq_q < seq_k, bias on, 2 heads of 4,
  need_weights=False.

Needs a venv with h5py, tensorflow and torch:  V/bin/python make_framework_layer_cases.py tests/data
The outputs are committed (written with Keras 3.15.1 on TensorFlow 2.21.0 and torch 2.15.0); the
tests only read them.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import h5py
import numpy as np

out_dir = sys.argv[1]
rng = np.random.default_rng(11)


def f32(shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(np.float64)


def write(path, name, generator, attrs, data):
    with h5py.File(path, "w") as f:
        f.attrs.update(dict(format="attn-fixture", format_version=3, name=name, kind="mha",
                            description="written by tests/data/make_framework_layer_cases.py", generator=generator,
                            dtype="float32", **attrs))
        for k, v in data.items():
            f[k] = v


def keras_case():
    import tensorflow as tf
    import keras
    b, sq, sk, E, Ek, Ev, h, d, dv = 2, 4, 6, 8, 12, 6, 3, 4, 5
    xq, xk, xv = f32((b, sq, E)), f32((b, sk, Ek)), f32((b, sk, Ev))
    attend = np.ones((b, sq, sk), bool)
    attend[1, :, 4:] = False  # the second entry's last two keys are padding
    mha = keras.layers.MultiHeadAttention(num_heads=h, key_dim=d, value_dim=dv, use_bias=True, output_shape=E,
                                          dtype="float64")
    tq, tk, tv = (tf.constant(x) for x in (xq, xk, xv))
    mask = tf.constant(attend)
    mha(tq, tv, key=tk, attention_mask=mask)
    weights = [f32(w.shape, 0.3) for w in mha.get_weights()]
    mha.set_weights(weights)
    dout = f32((b, sq, E))
    with tf.GradientTape(persistent=True) as tape:
        for x in (tq, tk, tv):
            tape.watch(x)
        y = mha(tq, tv, key=tk, attention_mask=mask)
        loss = tf.reduce_sum(y * tf.constant(dout))
    g = tape.gradient(loss, [tq, tk, tv] + list(mha.trainable_weights))
    n = lambda t: np.asarray(t.numpy(), np.float64)
    wq, bq, wk, bk, wv, bv, wo, bo = weights
    data = {"x_q": xq.astype(np.float32), "x_k": xk.astype(np.float32), "x_v": xv.astype(np.float32),
            "w_q": wq.reshape(E, h * d).astype(np.float32), "b_q": bq.reshape(h * d).astype(np.float32),
            "w_k": wk.reshape(Ek, h * d).astype(np.float32), "b_k": bk.reshape(h * d).astype(np.float32),
            "w_v": wv.reshape(Ev, h * dv).astype(np.float32), "b_v": bv.reshape(h * dv).astype(np.float32),
            "w_o": wo.reshape(h * dv, E).astype(np.float32), "b_o": bo.astype(np.float32),
            "mask": attend[:, None].astype(np.uint8), "y": n(y), "dout": dout.astype(np.float32),
            "dx_q": n(g[0]), "dx_k": n(g[1]), "dx_v": n(g[2]),
            "dw_q": n(g[3]).reshape(E, h * d), "db_q": n(g[4]).reshape(h * d),
            "dw_k": n(g[5]).reshape(Ek, h * d), "db_k": n(g[6]).reshape(h * d),
            "dw_v": n(g[7]).reshape(Ev, h * dv), "db_v": n(g[8]).reshape(h * dv),
            "dw_o": n(g[9]).reshape(h * dv, E), "db_o": n(g[10]).reshape(E)}
    attrs = dict(causal="none", batch=b, heads_q=h, heads_kv=h, seq_q=sq, seq_k=sk, head_dim=d, head_dim_v=dv,
                 scale=1 / np.sqrt(d), model_dim=E, kdim=Ek, vdim=Ev)
    write(f"{out_dir}/keras_layer_gradients_kdim_vdim_padding_f32.h5", "frameworks/keras_layer_gradients",
          f"keras {keras.__version__} (tensorflow {tf.__version__}), float64", attrs, data)


def torch_case():
    import torch
    b, sq, sk, E, Ek, Ev, h = 2, 3, 5, 8, 10, 7, 2
    d = E // h
    xq, xk, xv = f32((b, sq, E)), f32((b, sk, Ek)), f32((b, sk, Ev))
    m = torch.nn.MultiheadAttention(E, h, bias=True, kdim=Ek, vdim=Ev, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.from_numpy(f32(tuple(p.shape), 0.3)))
    pad = np.zeros((b, sk), bool)
    pad[0, 4:] = True  # True = ignore: entry 0's last key
    causal = np.triu(np.ones((sq, sk), bool), k=sk - sq + 1)  # True = not allowed: bottom-right causal
    dout = f32((b, sq, E))
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (xq, xk, xv))
    y, _ = m(tq, tk, tv, key_padding_mask=torch.from_numpy(pad), attn_mask=torch.from_numpy(causal), need_weights=False)
    (y * torch.from_numpy(dout)).sum().backward()
    n = lambda t: t.detach().numpy().astype(np.float64)
    bias = n(m.in_proj_bias)
    attend = ~(pad[:, None, None, :] | causal[None, None])  # [b, 1, sq, sk]
    data = {"x_q": xq.astype(np.float32), "x_k": xk.astype(np.float32), "x_v": xv.astype(np.float32),
            "w_q": n(m.q_proj_weight).T.astype(np.float32), "w_k": n(m.k_proj_weight).T.astype(np.float32),
            "w_v": n(m.v_proj_weight).T.astype(np.float32), "w_o": n(m.out_proj.weight).T.astype(np.float32),
            "b_q": bias[:E].astype(np.float32), "b_k": bias[E:2 * E].astype(np.float32),
            "b_v": bias[2 * E:].astype(np.float32), "b_o": n(m.out_proj.bias).astype(np.float32),
            "mask": attend.astype(np.uint8), "y": n(y), "dout": dout.astype(np.float32),
            "dx_q": n(tq.grad), "dx_k": n(tk.grad), "dx_v": n(tv.grad),
            "dw_q": n(m.q_proj_weight.grad).T, "dw_k": n(m.k_proj_weight.grad).T, "dw_v": n(m.v_proj_weight.grad).T,
            "dw_o": n(m.out_proj.weight.grad).T, "db_q": n(m.in_proj_bias.grad)[:E],
            "db_k": n(m.in_proj_bias.grad)[E:2 * E], "db_v": n(m.in_proj_bias.grad)[2 * E:],
            "db_o": n(m.out_proj.bias.grad)}
    attrs = dict(causal="none", batch=b, heads_q=h, heads_kv=h, seq_q=sq, seq_k=sk, head_dim=d, head_dim_v=d,
                 scale=1 / np.sqrt(d), model_dim=E, kdim=Ek, vdim=Ev)
    write(f"{out_dir}/torch_layer_gradients_kdim_vdim_padding_causal_f32.h5", "frameworks/torch_layer_gradients",
          f"torch {torch.__version__} nn.MultiheadAttention, float64", attrs, data)


keras_case()
torch_case()
print("wrote 2 files to", out_dir)
