"""What every attnbench Python backend shares: the contract, and helpers.

A Python backend is one file (see py_numpy.py for a complete one) defining the names below, or
BACKEND, one object that has them as attributes (an attnbench.kernel from the Python package):

    NAME, DESCRIPTION                    strings ("py-..." names by convention)
    DTYPES = ("float32", ...)            optional: the dtypes it computes in (all four when absent);
                                         attn reports any other as SKIP before supports() is asked
    available() -> None | str           None, or why it cannot run on this machine
    supports(problem) -> None | str     None, or why it does not handle this problem
    conventions(problem) -> list         optional: [(code, why)], the framework's known
                                         differences from the fixture format on this problem;
                                         codes: empty_rows_mean_v, empty_rows_nan, empty_rows_unmasked
    prepare(problem, io, threads) -> run everything untimed; run() computes io.out (timed); a run
                                         whose results stay on a device may carry two attributes:
                                         run.read_output() writes io.out (and lse) after the runs,
                                         and run.run_timed() -> seconds times one run alone
    HAS_LSE = False                      optional; True when run() also fills io.lse
    prepare_backward(problem, io, threads) -> run
                                         optional, format version 3 (docs/format/v3.md): the
                                         gradients of sum(dout * out); run() (timed) writes
                                         io.dq, io.dk, io.dv and io.dbias when it is not None
    supports_backward(problem) -> None | str   optional: None, or why it has no backward here
    NONDETERMINISTIC_DQ = False          optional; True when its dQ may differ between runs or
                                         thread counts (reported, not failed; dK and dV may not)
    THREAD_DEPENDENT_GRADIENTS = "why"   optional: its gradients differ between thread counts
                                         (never between two runs at one count): DIFFERS, not FAIL
    USES_THREADS = True                  optional; False when `threads` changes nothing it computes
                                         (judged at the first thread count only)

`problem` has batch, heads_q, heads_kv, seq_q, seq_k, head_dim, head_dim_v, scale,
causal ("none", "top_left", "bottom_right"), dtype ("float64", "float32", "float16",
"bfloat16"), layout ("bhsd", "bshd"), mask and bias (None or their (batch, heads, rows)
shape), kv_len (bool) and text (the canonical problem string).

`io` holds zero-copy numpy views, logical [batch, heads, seq, dim] whatever the layout:
q, k, v (read-only), out (write into it: io.out[...] = result), mask (uint8, non-zero =
attend, [batch, heads_q, seq_q, seq_k] with stride 0 on broadcast axes, or None), bias
(same shape, in the dtype, or None), kv_len (int64 [batch] or None) and lse (float64
[batch * heads_q * seq_q] or None). bfloat16 arrives as raw uint16 bits: use
bf16_to_f32() and store(), or view the bits in your framework.

The backward's `io` holds the forward's views, with `out` (and `lse` when HAS_LSE) now
read-only and holding this backend's own forward results, plus dout (read-only, out's
shape), dq, dk, dv (write every element: shapes of q, k and v; dK and dV summed over the
query heads of a group) and dbias (None, or write it: the bias's stored shape
[bb, bh, bq, seq_k], summed over its broadcast axes).

Format version 2 (docs/format/v2.md: windows, softcap, ALiBi, sinks, packed and
paged KV) reaches a backend that declares
    FEATURES = ("window", ...)         optional: the additions it implements (window, softcap,
                                         alibi, sinks, ragged, paged); a case using any other is
                                         SKIP, naming it, before supports() is asked
Then problem also has align (the diagonal: "top_left" or "bottom_right"), window_left and
window_right (-1: unbounded), softcap (0: none), alibi, sinks and ragged (bools), page_size
and num_pages (0 when not paged), and io holds read-only views alibi_slopes and sinks (float32
[heads_q]), cu_seqlens_q and cu_seqlens_k (int64 [batch + 1]: q, out are then
[1, heads_q, seq_q, dim], k, v [1, heads_kv, seq_k, dim], seq_q and seq_k the packed
capacities), page_table (int64 [batch, seq_k / page_size]: k, v are then
[num_pages, heads_kv, page_size, dim]) and seq_lens (int64 [batch]), each None when absent.
The backward's io adds dsinks (float64 [heads_q], write it) when the case has sinks.

Format version 4 (docs/format/v4.md: quantised q, k, v) reaches a backend that declares
    ENCODINGS = ("float8_e4m3fn", ...)  optional: the encodings it reads (float8_e4m3fn,
                                         float8_e5m2, int8, uint8, int4, uint4, q8_0, q4_0);
                                         quantised cases with any other are SKIP, naming it
Then problem.q_quant, k_quant and v_quant are None or (encoding, descale: None, "tensor" or
"entry_head", scale: None or the scale's [batch, heads, seq, groups] shape as stored,
zero_point: bool), and for a quantised tensor io.q (k, v) is None and io.q_codes (k_codes,
v_codes) holds read-only views: codes (uint8 [batch, heads, seq, row_bytes], the stored
bytes), scale (float32 [batch, heads, seq, groups], stride 0 on broadcast axes, or None),
zero_point (int32, likewise, or None), descale (float32 [batch, heads_kv], stride 0 when
one per tensor, or None; the query's is indexed by kv head) and group (elements a scale
covers). A value is (decode(code) - zero_point) * scale * descale; tensor(problem, io,
"k") gives the values exactly, in float64, with decoders of this file's own. Quantised
cases have no backward.

The fixture format's rules hold: hidden keys are mask 0, bias -inf, j >= kv_len[b] and
the causal rule; query head h reads kv head h // (heads_q // heads_kv); a row with no
visible key is exactly 0.
"""

import importlib.util
import math
import os
import sys

import numpy as np

_loaded = {}

# Set by attn when it was built with AddressSanitizer (the bridge): some loading tricks
# (RTLD_DEEPBIND) are refused by the sanitizer runtime.
SANITIZED = False


def load_backend(path):
    """Imports a backend file once per process (attn calls this)."""
    path = os.path.abspath(path)
    if path in _loaded:
        return _loaded[path]
    stem = os.path.splitext(os.path.basename(path))[0]
    name = f"attn_backend_{len(_loaded)}_{stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    backend = getattr(module, "BACKEND", module)  # an object with the contract (attnbench.kernel makes one)
    for attr in ("NAME", "DESCRIPTION", "available", "supports", "prepare"):
        if not hasattr(backend, attr):
            raise AttributeError(f"{path} defines no {attr} (see attn_common.py for the contract)")
    _loaded[path] = backend
    return backend


def importable(name, load=None):
    """None when `name` can be imported, else the reason (the import is tried for real, by
    `load()` when given: an adapter that imports its framework in a particular way)."""
    try:
        if load is None:
            importlib.import_module(name)
        else:
            load()
        return None
    except Exception as e:  # a broken wheel raises OSError, not only ImportError
        hint = "" if os.environ.get("ATTN_PYTHON_VENV") else " (set ATTN_PYTHON_VENV; scripts/install-python-peers makes one)"
        return f"{name} cannot be imported: {type(e).__name__}: {e}{hint}"


def bf16_to_f32(bits):
    """uint16 bfloat16 bits -> float32 values."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values):
    """float32 -> uint16 bfloat16 bits, rounded to nearest even (NaN stays NaN)."""
    x = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        rounded = np.where(nan, np.uint16(0x7FC0), rounded)
    return rounded


def load(problem, array):
    """An input view as numpy values (float32 for bfloat16, else the view itself)."""
    if problem.dtype == "bfloat16":
        return bf16_to_f32(array)
    return np.asarray(array)


ENCODINGS_KNOWN = ("float8_e4m3fn", "float8_e5m2", "int8", "uint8", "int4", "uint4", "q8_0", "q4_0")


def _fp8(codes, mantissa_bits, bias, e4m3):
    """fp8 codes -> float64: sign, exponent, mantissa as the OCP formats define them."""
    c = codes.astype(np.int64)
    e = (c & 0x7F) >> mantissa_bits
    m = (c & ((1 << mantissa_bits) - 1)).astype(np.float64) / (1 << mantissa_bits)
    x = np.where(e == 0, np.ldexp(m, 1 - bias), np.ldexp(1.0 + m, e - bias))
    if e4m3:  # no infinity; S.1111.111 is NaN
        x = np.where((c & 0x7F) == 0x7F, np.nan, x)
    else:  # exponent 31: infinity (mantissa 0) or NaN, as IEEE
        x = np.where(e == 31, np.where(m == 0, np.inf, np.nan), x)
    return np.where(c & 0x80, -x, x)


def _ggml_d(blocks):
    """A ggml block's d: the little-endian float16 at its first two bytes."""
    bits = blocks[..., 0].astype(np.uint16) | (blocks[..., 1].astype(np.uint16) << 8)
    return bits.view(np.float16).astype(np.float64)


def decode(encoding, rows, dim):
    """Stored rows (uint8 [..., row_bytes]) -> float64 [..., dim]: the fp8 values, the
    integers, or a ggml block's d * q; no zero point, scale or descale."""
    rows = np.asarray(rows, dtype=np.uint8)
    lead = rows.shape[:-1]
    if encoding == "float8_e4m3fn":
        return _fp8(rows[..., :dim], 3, 7, True)
    if encoding == "float8_e5m2":
        return _fp8(rows[..., :dim], 2, 15, False)
    if encoding == "int8":
        return rows[..., :dim].view(np.int8).astype(np.float64)
    if encoding == "uint8":
        return rows[..., :dim].astype(np.float64)
    if encoding in ("int4", "uint4"):  # element 2n in the low nibble of byte n, 2n + 1 in the high
        nibbles = np.stack([rows & 0x0F, rows >> 4], axis=-1).reshape(lead + (2 * rows.shape[-1],))[..., :dim]
        x = nibbles.astype(np.int64)
        return (((x ^ 8) - 8) if encoding == "int4" else x).astype(np.float64)
    if encoding in ("q8_0", "q4_0"):
        size = 34 if encoding == "q8_0" else 18
        blocks = rows[..., : dim // 32 * size].reshape(lead + (dim // 32, size))
        if encoding == "q8_0":
            q = blocks[..., 2:].view(np.int8).astype(np.float64)
        else:  # byte n: element n in the low nibble, n + 16 in the high one
            q = np.concatenate([blocks[..., 2:] & 0x0F, blocks[..., 2:] >> 4], axis=-1).astype(np.float64) - 8
        return (_ggml_d(blocks)[..., None] * q).reshape(lead + (dim,))
    raise ValueError(f"unknown encoding {encoding!r} (known: {', '.join(ENCODINGS_KNOWN)})")


def tensor(problem, io, name):
    """q, k or v ("q", "k", "v") as values: load() of the view, or, when quantised (format
    version 4), the codes dequantised exactly in float64, descales included."""
    quant = getattr(problem, name + "_quant", None)
    if quant is None:
        return load(problem, getattr(io, name))
    c = getattr(io, name + "_codes")
    dim = problem.head_dim_v if name == "v" else problem.head_dim
    x = decode(quant.encoding, c.codes, dim)
    if c.zero_point is not None:
        x = x - np.repeat(np.asarray(c.zero_point, dtype=np.float64), c.group, axis=-1)[..., :dim]
    if c.scale is not None:
        x = x * np.repeat(np.asarray(c.scale, dtype=np.float64), c.group, axis=-1)[..., :dim]
    if c.descale is not None:
        d = np.asarray(c.descale, dtype=np.float64)  # [batch, heads_kv]
        if name == "q":
            d = np.repeat(d, problem.heads_q // problem.heads_kv, axis=1)
        x = x * d[:, :, None, None]
    return x


def store(problem, out, values):
    """Writes values (any float array of out's logical shape) into the output view."""
    if problem.dtype == "bfloat16":
        out[...] = f32_to_bf16(np.asarray(values, dtype=np.float32))
    else:
        out[...] = values


def attend(problem, io):
    """bool [batch, heads_q, seq_q, seq_k]: True where the mask, kv_len and the causal
    rule let query i see key j (the bias is not included)."""
    shape = (problem.batch, problem.heads_q, problem.seq_q, problem.seq_k)
    visible = np.ones(shape, dtype=bool)
    if io.mask is not None:
        visible &= io.mask != 0
    if io.kv_len is not None:
        j = np.arange(problem.seq_k)
        visible &= (j[None, :] < io.kv_len[:, None])[:, None, None, :]
    if problem.causal != "none":
        i = np.arange(problem.seq_q)[:, None]
        j = np.arange(problem.seq_k)[None, :]
        offset = 0 if problem.causal == "top_left" else problem.seq_k - problem.seq_q
        visible &= (j <= i + offset)[None, None, :, :]
    return visible


def hides_anything(problem):
    return problem.mask is not None or problem.kv_len or problem.causal != "none"


def default_scale(problem):
    return abs(problem.scale - 1.0 / math.sqrt(problem.head_dim)) <= 1e-12 * problem.scale


def repeat_kv(problem, x, axis=1):
    """GQA as a user writes it without native support: each kv head repeated."""
    group = problem.heads_q // problem.heads_kv
    return x if group == 1 else np.repeat(x, group, axis=axis)


def sum_kv_groups(problem, x, axis=1):
    """The inverse of repeat_kv for gradients: each kv head's sum over its query heads."""
    group = problem.heads_q // problem.heads_kv
    if group == 1:
        return x
    shape = x.shape[:axis] + (problem.heads_kv, group) + x.shape[axis + 1:]
    return x.reshape(shape).sum(axis=axis + 1)


def layer_shape_reason(problem, model_dim, framework):
    """None when a framework layer that splits model_dim into equal heads (no GQA) can hold the case."""
    if problem.heads_kv != problem.heads_q:
        return f"{framework} has no GQA (heads_kv {problem.heads_kv} != heads_q {problem.heads_q})"
    if problem.heads_q * problem.head_dim != model_dim or problem.head_dim_v != problem.head_dim:
        return (f"{framework} splits model_dim into heads: heads_q * head_dim = {problem.heads_q * problem.head_dim} "
                f"and head_dim_v {problem.head_dim_v} must match model_dim {model_dim} and head_dim")
    if not default_scale(problem):
        return f"{framework} scales by 1/sqrt(head_dim) only; this case's scale is {problem.scale:.6g}"
    return None


def zeros_if_none(x, width):
    return np.zeros(width) if x is None else x


def torch_gradients(torch, forward, leaves, dout, name, hint=""):
    """The one torch autograd path (py-torch's backward and attnbench.Kernel's): the gradient of
    sum(dout * forward(*leaves)) with respect to each leaf, a zero tensor for a leaf the output
    does not use. `forward` runs under enable_grad; a bias leaf it expands to the full shape has
    its gradient summed over the broadcast axes by autograd, as frameworks do."""
    with torch.enable_grad():
        out = forward(*leaves)
        if not isinstance(out, torch.Tensor) or not out.requires_grad:
            raise TypeError(f"{name}'s output does not depend on q, k, v through autograd{hint}")
        grads = torch.autograd.grad(out, leaves, grad_outputs=dout, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves)]
