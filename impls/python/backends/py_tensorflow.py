"""py-tensorflow: the TensorFlow function of the design document
(../shared/design/004_*.txt), as it is written:

    matmul_qk = tf.matmul(query, key, transpose_b=True)
    dk = tf.cast(tf.shape(key)[-1], tf.float32)
    scaled_attention_logits = matmul_qk / tf.math.sqrt(dk)
    if mask is not None:
        scaled_attention_logits += (mask * -1e9)      # here 1 means hidden
    attention_weights = tf.nn.softmax(scaled_attention_logits, axis=-1)
    output = tf.matmul(attention_weights, value)

Causal and kv_len join the mask, GQA repeats the kv heads. d_k is cast to float32 and
TensorFlow does not mix dtypes, so the function raises on any other dtype: SKIP with that
reason. It has no bias and no scale argument: SKIP. A row whose keys are all hidden gets
s - 1e9 on every key, which float32 rounds to -1e9 for small scores: uniform weights, the
mean of V, where the format gives 0 (DIFFERS).
"""

import os

import numpy as np

import attn_common as ac

NAME = "py-tensorflow"
DESCRIPTION = "TensorFlow, the design document's tf.matmul + tf.nn.softmax function (mask * -1e9, 1 = hidden)"
# The function casts d_k to float32 and TensorFlow does not mix dtypes: other inputs raise
# InvalidArgumentError. Masks, causal and kv_len go in as the mask, GQA as repeated heads;
# the scale is always 1/sqrt(d_k) and there is no bias (supports() says so).
DTYPES = ("float32",)

_tf = None


def _import():
    global _tf
    if _tf is None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up banner is not a verdict
        import tensorflow as tf

        _tf = tf
    return _tf


def available():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return ac.importable("tensorflow")


def supports(problem):
    if problem.bias is not None:
        return "the function takes no bias"
    if not ac.default_scale(problem):
        return f"the function always scales by 1/sqrt(d_k); this case's scale is {problem.scale:.6g}"
    return None


def conventions(problem):
    if ac.hides_anything(problem):
        return [("empty_rows_mean_v", "every key of such a row scores -1e9 (the function adds mask * -1e9, "
                                      "Keras' masked softmax puts -1e9 in): uniform weights in float32")]
    return []


def scaled_dot_product_attention(tf, query, key, value, mask):
    matmul_qk = tf.matmul(query, key, transpose_b=True)
    dk = tf.cast(tf.shape(key)[-1], tf.float32)
    scaled_attention_logits = matmul_qk / tf.math.sqrt(dk)
    if mask is not None:
        scaled_attention_logits += mask * -1e9
    attention_weights = tf.nn.softmax(scaled_attention_logits, axis=-1)
    output = tf.matmul(attention_weights, value)
    return output, attention_weights


_threads_set = None


def prepare(problem, io, threads):
    global _threads_set
    tf = _import()
    if threads > 0 and _threads_set is None:
        try:  # only possible before TensorFlow's first op; later calls keep the first count
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(1)
            _threads_set = threads
        except RuntimeError:
            _threads_set = 0
    query = tf.constant(np.asarray(io.q))
    key = tf.constant(ac.repeat_kv(problem, np.asarray(io.k)))
    value = tf.constant(ac.repeat_kv(problem, np.asarray(io.v)))
    mask = None
    if ac.hides_anything(problem):
        mask = tf.constant((~ac.attend(problem, io)).astype(np.float32))

    def run():
        output, _ = scaled_dot_product_attention(tf, query, key, value, mask)
        io.out[...] = output.numpy()

    return run


# The backward (format version 3): tf.GradientTape on the same function, dout as the output
# gradient. The kv heads are repeated inside the tape (tf.repeat), so dk and dv come back summed
# over each group's query heads. A row whose keys are all hidden has uniform weights on scores
# that still carry q.k (the -1e9 is added, not filled in): its gradients reach dQ, dK and dV,
# where the format passes nothing (DIFFERS, the declared convention).


def supports_backward(problem):
    return None  # everything supports() accepts


def prepare_backward(problem, io, threads):
    tf = _import()
    query = tf.constant(np.asarray(io.q))
    key = tf.constant(np.asarray(io.k))
    value = tf.constant(np.asarray(io.v))
    dout = tf.constant(np.asarray(io.dout))
    group = problem.heads_q // problem.heads_kv
    mask = None
    if ac.hides_anything(problem):
        mask = tf.constant((~ac.attend(problem, io)).astype(np.float32))

    def run():
        with tf.GradientTape() as tape:
            tape.watch([query, key, value])
            k, v = (key, value) if group == 1 else (tf.repeat(key, group, axis=1), tf.repeat(value, group, axis=1))
            output, _ = scaled_dot_product_attention(tf, query, k, v, mask)
        dq, dk, dv = tape.gradient(output, [query, key, value], output_gradients=dout)
        io.dq[...] = dq.numpy()
        io.dk[...] = dk.numpy()
        io.dv[...] = dv.numpy()

    return run


# Layer cases: a Keras MultiHeadAttention layer (the document's Dense-projection layer) with the
# fixture's weights, float32. Its attention_mask is [batch, seq_q, seq_k] (True = attend): a
# mask that differs per head, and a bias, do not fit it.


def supports_layer(problem, model_dim, kdim=None, vdim=None):
    # Keras takes the key's and value's widths from its inputs: any kdim and vdim.
    if problem.dtype != "float32":
        return f"the Keras layer of the document runs in float32; this case is {problem.dtype}"
    if problem.heads_kv != problem.heads_q:
        return "Keras MultiHeadAttention has no GQA"
    if problem.bias is not None:
        return "Keras MultiHeadAttention takes no additive bias"
    if problem.mask is not None and problem.mask[1] != 1:
        return "Keras MultiHeadAttention's attention_mask is per batch and query, not per head"
    if not ac.default_scale(problem):
        return f"Keras MultiHeadAttention scales by 1/sqrt(key_dim) only; this case's scale is {problem.scale:.6g}"
    return None


def _layer(tf, problem, data):
    """The Keras layer holding the fixture's weights, its inputs and attention_mask."""
    keras = tf.keras
    h, d, dv, E = problem.heads_q, problem.head_dim, problem.head_dim_v, data.model_dim
    Ek, Ev = data.kdim, data.vdim
    mha = keras.layers.MultiHeadAttention(num_heads=h, key_dim=d, value_dim=dv, use_bias=True, output_shape=E)
    xq, xk, xv = (tf.constant(a.astype(np.float32)) for a in (data.x_q, data.x_k, data.x_v))
    mask = None
    if ac.hides_anything(problem):
        mask = tf.constant(ac.attend(problem, data)[:, 0])  # [batch, seq_q, seq_k]; the same for every head
    mha(xq, xv, key=xk, attention_mask=mask)  # builds the weights
    z = ac.zeros_if_none
    weights = [data.w_q.reshape(E, h, d), z(data.b_q, h * d).reshape(h, d),
               data.w_k.reshape(Ek, h, d), z(data.b_k, h * d).reshape(h, d),
               data.w_v.reshape(Ev, h, dv), z(data.b_v, h * dv).reshape(h, dv),
               data.w_o.reshape(h, dv, E), z(data.b_o, E)]
    mha.set_weights([w.astype(np.float32) for w in weights])
    return mha, (xq, xk, xv), mask


def layer(problem, data, threads):
    tf = _import()
    mha, (xq, xk, xv), mask = _layer(tf, problem, data)
    return mha(xq, xv, key=xk, attention_mask=mask).numpy().astype(np.float64)


def layer_backward(problem, data, dout, bias_requires_grad, threads):
    """tf.GradientTape through the same Keras layer: the inputs watched, the Dense kernels'
    [in, heads, dim] (and the output's [heads, dim, out]) gradients reshaped to the format's
    matrices; a bias the layer does not have is not returned (Keras keeps one at zero)."""
    tf = _import()
    mha, (xq, xk, xv), mask = _layer(tf, problem, data)
    h, d, dv, E = problem.heads_q, problem.head_dim, problem.head_dim_v, data.model_dim
    with tf.GradientTape(persistent=True) as tape:
        for x in (xq, xk, xv):
            tape.watch(x)
        y = mha(xq, xv, key=xk, attention_mask=mask)
        loss = tf.reduce_sum(y * tf.constant(dout.astype(np.float32)))
    variables = list(mha.trainable_weights)  # in set_weights' order: query, key, value, output; kernel then bias
    g = tape.gradient(loss, [xq, xk, xv] + variables)
    f64 = lambda t: np.asarray(t.numpy(), dtype=np.float64)
    grads = {"dx_q": f64(g[0]), "dx_k": f64(g[1]), "dx_v": f64(g[2]),
             "dw_q": f64(g[3]).reshape(E, h * d), "dw_k": f64(g[5]).reshape(data.kdim, h * d),
             "dw_v": f64(g[7]).reshape(data.vdim, h * dv), "dw_o": f64(g[9]).reshape(h * dv, E)}
    for name, present, grad, width in (("db_q", data.b_q, g[4], h * d), ("db_k", data.b_k, g[6], h * d),
                                       ("db_v", data.b_v, g[8], h * dv), ("db_o", data.b_o, g[10], E)):
        if present is not None:
            grads[name] = f64(grad).reshape(width)
    return grads
