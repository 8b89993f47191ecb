"""py-numpy: scaled dot-product attention exactly as the NumPy design document writes it
(../shared/design/000_*.txt, section 2.2):

    scores = Q @ K.transpose(0,1,3,2) / np.sqrt(d_k)
    scores = masked_fill(mask == 0, -1e9)          # np.where: NumPy has no masked_fill
    weights = softmax(scores, axis=-1)             # e^(x - max) / sum
    output = weights @ V

in float64, as the document runs it (its inputs come from np.random.randn), with the result
rounded to the case's dtype. Its backward (format version 3) is that function differentiated
by hand, the textbook way: dV = W^T dO, dW = dO V^T, dS = W (dW - rowsum(dW W)) (the
softmax's own backward), zero where np.where put the constant -1e9, then dQ = dS K / sqrt(d_k)
and dK = dS^T Q / sqrt(d_k), summed over the repeated heads of a group (where dO V^T overflows
float64, from V scaled down by a power of two, and dQ and dK scaled back). The textbook has no bias,
no scale other than 1/sqrt(d_k), no GQA and no causal flag: causal and kv_len become part
of the mask and GQA repeats the kv heads, as a user of the function would write them; a
bias or another scale is SKIP. A row whose keys are all hidden gets -1e9 everywhere and so
the mean of V, where the format gives 0: the verdict shows it (DIFFERS); in the backward
such a row's uniform weights pass dO / seq_k to the dV of every key, where the format passes
nothing (DIFFERS too). (Run in float16 instead, -1e9 would be -inf and such a row NaN.)
"""

import numpy as np

import attn_common as ac

NAME = "py-numpy"
DESCRIPTION = "NumPy, the design document's textbook scaled_dot_product_attention (masked_fill -1e9, max-subtracted softmax)"
# Every dtype, computed in float64 as the document runs it; masks, causal, kv_len and GQA as a
# mask and repeated heads; the scale is always 1/sqrt(d) and there is no bias (supports() says so).
# `threads` reaches nothing here (NumPy's own BLAS threads do not change a float64 result rounded
# to the dtype's): the same run at every thread count.
USES_THREADS = False
# Quantised q, k and v of format version 4 (docs/format/v4.md), dequantised exactly in
# float64 by attn_common's own decoders before the textbook function runs.
ENCODINGS = ac.ENCODINGS_KNOWN


def available():
    return None


def supports(problem):
    if problem.bias is not None:
        return "the textbook function takes no bias"
    if not ac.default_scale(problem):
        return f"the textbook function always scales by 1/sqrt(d_k); this case's scale is {problem.scale:.6g}"
    if problem.seq_k == 0:
        return "the textbook softmax raises on an empty key axis (np.max of a zero-size array)"
    return None


def conventions(problem):
    if not ac.hides_anything(problem):
        return []
    return [("empty_rows_mean_v", "masked_fill(mask == 0, -1e9) makes every score of such a row equal")]


def softmax(x, axis=-1):
    e_x = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e_x / e_x.sum(axis=axis, keepdims=True)


def scaled_dot_product_attention(Q, K, V, mask=None):
    d_k = Q.shape[-1]
    scores = Q @ K.transpose(0, 1, 3, 2) / np.sqrt(d_k).astype(Q.dtype)
    if mask is not None:
        scores = np.where(mask == 0, Q.dtype.type(-1e9), scores)
    weights = softmax(scores, axis=-1)
    output = weights @ V
    return output, weights


def prepare(problem, io, threads):
    # Untimed: the inputs as the document's arrays (float64, kv heads repeated) and the mask.
    dtype = np.float64
    Q = ac.tensor(problem, io, "q").astype(dtype)
    K = ac.repeat_kv(problem, ac.tensor(problem, io, "k").astype(dtype))
    V = ac.repeat_kv(problem, ac.tensor(problem, io, "v").astype(dtype))
    mask = ac.attend(problem, io).astype(np.uint8) if ac.hides_anything(problem) else None

    def run():
        output, _ = scaled_dot_product_attention(Q, K, V, mask)
        ac.store(problem, io.out, output)

    return run


def supports_backward(problem):
    return None  # everything supports() accepts


def scaled_dot_product_attention_backward(Q, K, V, mask, dO):
    """The gradients of sum(dO * output) for the function above, by hand."""
    d_k = Q.shape[-1]
    scale = np.sqrt(d_k).astype(Q.dtype)
    scores = Q @ K.transpose(0, 1, 3, 2) / scale
    if mask is not None:
        scores = np.where(mask == 0, Q.dtype.type(-1e9), scores)
    weights = softmax(scores, axis=-1)
    dV = weights.transpose(0, 1, 3, 2) @ dO
    # V near float64's largest makes dO V^T overflow where the gradients do not: then dW is
    # taken from V scaled down by a power of two (exact), and dQ and dK scaled back up.
    shift = 0
    with np.errstate(over="ignore", invalid="ignore"):
        dW = dO @ V.transpose(0, 1, 3, 2)
        if not np.all(np.isfinite(dW)) and np.all(np.isfinite(V)) and V.size:
            shift = int(np.frexp(np.max(np.abs(V)))[1])
            dW = dO @ np.ldexp(V, -shift).transpose(0, 1, 3, 2)
    dS = weights * (dW - (dW * weights).sum(axis=-1, keepdims=True))
    if mask is not None:
        dS = np.where(mask == 0, Q.dtype.type(0), dS)  # the constant -1e9 passes nothing back
    dQ = np.ldexp(dS @ K / scale, shift)
    dK = np.ldexp(dS.transpose(0, 1, 3, 2) @ Q / scale, shift)
    return dQ, dK, dV


def prepare_backward(problem, io, threads):
    dtype = np.float64
    Q = ac.load(problem, io.q).astype(dtype)
    K = ac.repeat_kv(problem, ac.load(problem, io.k).astype(dtype))
    V = ac.repeat_kv(problem, ac.load(problem, io.v).astype(dtype))
    dO = ac.load(problem, io.dout).astype(dtype)
    mask = ac.attend(problem, io).astype(np.uint8) if ac.hides_anything(problem) else None

    def run():
        dQ, dK, dV = scaled_dot_product_attention_backward(Q, K, V, mask, dO)
        ac.store(problem, io.dq, dQ)
        ac.store(problem, io.dk, ac.sum_kv_groups(problem, dK))
        ac.store(problem, io.dv, ac.sum_kv_groups(problem, dV))

    return run
