"""py-ggml: ggml's own CPU attention, ggml_flash_attn_ext, over a Q8_0 or Q4_0 K/V cache, as
llama.cpp runs it (ggml from PyPI's ggml-python, installed on request like PyTorch).

- K and V are ggml tensors of the cache's type (GGML_TYPE_Q8_0, GGML_TYPE_Q4_0) holding the case's
  codes byte for byte: a format version 4 row of ggml blocks is the row a GGUF tensor or a
  llama.cpp cache holds, so ggml decodes exactly what the format stores, with its own code.
- Q is float32 (a float16 or bfloat16 Q is exact in it), one graph per batch entry: q
  [head_dim, seq_q, heads_q], k and v [head_dim, seq_k, heads_kv] (GQA by ggml's broadcast), the
  mask float16 [seq_k, seq_q padded to GGML_KQ_MASK_PAD] (0 or -inf: causal, kv_len and a mask
  that is the same for every head), the result [head_dim_v, heads_q, seq_q] permuted back.
- ggml has no descale: a per-tensor K descale joins the softmax scale and a per-tensor V descale
  multiplies the output (as FlashInfer folds k_scale); per-head descales, a bias (ggml's mask is
  float16) and a quantised Q (llama.cpp's is float) are SKIP with the reason.
- Before anything runs, ggml's own dequantisation (to_float) of every K and V row must equal
  attn_common's decoders bit for bit, or prepare raises naming the element: the encodings are
  judged against the code that defines them.
- On the CPU ggml converts Q to K's vec_dot type before the products: for a Q8_0 or Q4_0 cache
  that is Q8_0, Q rounded to 8 bits per block of 32. That is llama.cpp's arithmetic, and the
  verdict shows what it costs against the bound of the case's dtype.
"""

import ctypes
import os
import weakref

import numpy as np

import attn_common as ac

NAME = "py-ggml"
DESCRIPTION = "ggml, ggml_flash_attn_ext over Q8_0/Q4_0 K and V as llama.cpp runs it (CPU, ggml-python)"
DTYPES = ("float32", "float16", "bfloat16")
ENCODINGS = ("q8_0", "q4_0")

_ggml = None


def _import():
    global _ggml
    if _ggml is None:
        import ggml

        _ggml = ggml
    return _ggml


def available():
    why = ac.importable("ggml", _import)
    if why:
        return why.replace("ggml cannot", "ggml (PyPI's ggml-python) cannot")
    if not hasattr(_import(), "ggml_flash_attn_ext"):
        return "this ggml has no ggml_flash_attn_ext"
    return None


def supports(problem):
    k, v = problem.k_quant, problem.v_quant
    if k is None or v is None or k.encoding not in ENCODINGS or v.encoding not in ENCODINGS:
        return "ggml_flash_attn_ext runs here over a Q8_0 or Q4_0 K and V cache (llama.cpp's); this case stores K and V otherwise"
    if problem.q_quant is not None:
        return "llama.cpp's Q is float; this case quantises Q"
    for name, quant in (("k", k), ("v", v)):
        if quant.descale == "entry_head":
            return f"ggml has no descale; a per-tensor {name} descale is folded in, a per-(entry, kv head) one is not"
    if problem.bias is not None:
        return "ggml's mask is float16: a bias would be rounded"
    if problem.mask is not None and problem.mask[1] != 1:
        return "ggml's mask is the same for every head; this case's mask differs by head"
    if problem.seq_k == 0:
        return "ggml_flash_attn_ext needs at least one key"
    return None


def _codes(io, name):
    return np.ascontiguousarray(getattr(io, name + "_codes").codes)


def _descale(io, name):
    d = getattr(io, name + "_codes").descale
    return 1.0 if d is None else float(np.asarray(d)[0, 0])


def _check_decoding(ggml, problem, io):
    """ggml's own dequantisation (its type traits' to_float) of every row of K and V must be
    attn_common's decode() bit for bit: the format's blocks are ggml's, or this raises, naming
    the first element that differs."""
    for name in ("k", "v"):
        quant = getattr(problem, name + "_quant")
        codes = _codes(io, name)
        dim = problem.head_dim_v if name == "v" else problem.head_dim
        n = codes.size // codes.shape[-1] * dim
        theirs = np.zeros(n, dtype=np.float32)
        to_float = ggml.ggml_get_type_traits({"q8_0": ggml.GGML_TYPE_Q8_0, "q4_0": ggml.GGML_TYPE_Q4_0}[quant.encoding]).contents.to_float
        to_float(ctypes.cast(codes.ctypes.data, ctypes.c_void_p), theirs.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n)
        ours = ac.decode(quant.encoding, codes, dim).reshape(-1)
        differ = np.flatnonzero(theirs.astype(np.float64) != ours)
        if differ.size:
            at = np.unravel_index(differ[0], codes.shape[:-1] + (dim,))
            raise ValueError(f"ggml decodes {name}'s {quant.encoding} codes differently from the format at {list(map(int, at))}: "
                             f"{theirs[differ[0]]!r} against {ours[differ[0]]!r} ({differ.size} elements differ)")


def prepare(problem, io, threads):
    ggml = _import()
    _check_decoding(ggml, problem, io)
    q = np.ascontiguousarray(ac.tensor(problem, io, "q"), dtype=np.float32)  # [b, hq, sq, d]: exact
    k, v = _codes(io, "k"), _codes(io, "v")  # [b, hkv, sk, row_bytes]
    kind = {"q8_0": ggml.GGML_TYPE_Q8_0, "q4_0": ggml.GGML_TYPE_Q4_0}
    pad = ggml.GGML_KQ_MASK_PAD
    rows = -(-problem.seq_q // pad) * pad
    visible = ac.attend(problem, io)  # [b, hq, sq, sk]
    n_threads = threads if threads > 0 else (os.cpu_count() or 1)
    scale = problem.scale * _descale(io, "k")
    v_descale = _descale(io, "v")
    b, hq, sq, d = q.shape
    hkv, sk = problem.heads_kv, problem.seq_k
    dv = problem.head_dim_v
    size = q[0].nbytes + k[0].nbytes + v[0].nbytes + sk * rows * 2 + hq * sq * dv * 4
    params = ggml.ggml_init_params(mem_size=4 * size + (64 << 20), mem_buffer=None, no_alloc=False)
    entries = []
    for e in range(b):
        ctx = ggml.ggml_init(params)
        qt = ggml.ggml_new_tensor_4d(ctx, ggml.GGML_TYPE_F32, d, sq, hq, 1)
        kt = ggml.ggml_new_tensor_4d(ctx, kind[problem.k_quant.encoding], d, sk, hkv, 1)
        vt = ggml.ggml_new_tensor_4d(ctx, kind[problem.v_quant.encoding], dv, sk, hkv, 1)
        mt = ggml.ggml_new_tensor_4d(ctx, ggml.GGML_TYPE_F16, sk, rows, 1, 1)
        mask = np.full((rows, sk), -np.inf, dtype=np.float16)
        mask[:sq] = np.where(visible[e, 0], 0.0, -np.inf)
        for tensor, array in ((qt, q[e]), (kt, k[e]), (vt, v[e]), (mt, mask)):
            assert ggml.ggml_nbytes(tensor) == array.nbytes, (ggml.ggml_nbytes(tensor), array.nbytes)
            ctypes.memmove(ggml.ggml_get_data(tensor), array.ctypes.data, array.nbytes)
        out = ggml.ggml_flash_attn_ext(ctx, qt, kt, vt, mt, scale, 0.0, 0.0)
        ggml.ggml_flash_attn_ext_set_prec(out, ggml.GGML_PREC_F32)
        graph = ggml.ggml_new_graph(ctx)
        ggml.ggml_build_forward_expand(graph, out)
        result = np.ctypeslib.as_array(ctypes.cast(ggml.ggml_get_data(out), ctypes.POINTER(ctypes.c_float)), shape=(sq, hq, dv))
        entries.append((ctx, graph, result))

    def run():
        for e, (ctx, graph, result) in enumerate(entries):
            if ggml.ggml_graph_compute_with_ctx(ctx, graph, n_threads) != 0:
                raise RuntimeError("ggml_graph_compute_with_ctx failed")
            ac.store(problem, io.out[e], result.transpose(1, 0, 2) * np.float32(v_descale))

    for ctx, _, _ in entries:
        weakref.finalize(run, ggml.ggml_free, ctx)
    return run
