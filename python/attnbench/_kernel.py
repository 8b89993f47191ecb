"""attnbench.kernel: a user's attention function as an attnbench backend.

A Kernel follows the contract of a Python backend file (impls/python/backends/attn_common.py:
NAME, DESCRIPTION, DTYPES, available, supports, prepare, prepare_backward), so the C++ verifier
judges it exactly as it judges `attn verify --plugin file.py`. This module imports no compiled
code: a backend file loaded by attn itself may use it too.

The function is called as

    fn(q, k, v, *, scale, causal, align, mask, bias, kv_len, window_size, softcap, alibi_slopes,
       sinks, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, block_table, cache_seqlens,
       q_descale, k_descale, v_descale, quant, out, threads) -> out | (out, lse) | None

with only the keyword arguments its signature names (or all of them with **kwargs). An argument
it does not take is a feature it does not have: the cases that need it are SKIP, with the reason.
docs/python.md is the full text; in short:

- q [batch, heads_q, seq_q, head_dim], k [batch, heads_kv, seq_k, head_dim],
  v [batch, heads_kv, seq_k, head_dim_v] and the result [batch, heads_q, seq_q, head_dim_v]
  (axes [batch, seq, heads, dim] with layout="bshd"), in the case's dtype, in the framework's
  array type, as zero-copy views of attnbench's buffers (read-only). Query head h reads kv head
  h // (heads_q // heads_kv) (GQA); gqa=False leaves such cases out.
- scale: multiplies q.k; a kernel without `scale` runs only the cases at 1/sqrt(head_dim).
- causal: a bool with causal="top_left" (query i sees keys j <= i, PyTorch's is_causal) or
  causal="bottom_right" (j <= i + seq_k - seq_q, FlashAttention 2.1 and later); causal="both"
  passes the alignment as a string ("none", "top_left", "bottom_right").
- align: "top_left" or "bottom_right", the diagonal that the causal rule, the window and ALiBi
  are measured from. A kernel without it is given only the cases of its declared alignment, or
  those where both alignments coincide (every entry with as many queries as keys).
- mask: bool [batch, heads_q, seq_q, seq_k], True = attend (a broadcast view), or None.
- bias: additive, in the dtype, [batch, heads_q, seq_q, seq_k] (a broadcast view; -inf hides a
  key), or None.
- kv_len: int64 [batch]: keys j >= kv_len[b] are hidden, or None.
- window_size: (left, right): query i sees keys diag - left .. diag + right, -1 unbounded.
- softcap: scores s become softcap * tanh(s / softcap) (s already scaled); 0.0: none.
- alibi_slopes: float32 [heads_q]: adds -slope[h] * |diag - j|, or None.
- sinks: float32 [heads_q]: a logit per head that joins each row's softmax denominator, with no
  value, or None.
- cu_seqlens_q, cu_seqlens_k: int64 [batch + 1] for packed (ragged) batches, where q and out
  are [heads_q, total_q, dim] ([total_q, heads_q, dim] with bshd) and k, v likewise; entry b
  holds rows cu_seqlens[b] .. cu_seqlens[b + 1]; max_seqlen_q, max_seqlen_k their longest
  entries. None otherwise.
- block_table: int64 [batch, pages per entry] for paged K and V, which are then
  [num_pages, heads_kv, page_size, dim] ([num_pages, page_size, heads_kv, dim] with bshd);
  cache_seqlens int64 [batch], the keys each entry holds. None otherwise.
- q_descale, k_descale, v_descale, quant: format version 4, for a kernel declaring
  encodings=(...): a quantised tensor's codes come in its place (fp8 as the framework's float8
  type, int8 as int8, others as raw uint8 bytes), its descale as float32 [batch, heads_kv], and
  quant[t] says how it dequantises (encoding, dim, group, scale, zero_point, descale); see
  dequantize().
- out: the output buffer (writeable, the result's shape): a kernel that takes it writes into it
  and may return None (zero-copy both ways); None with jax, on a torch device and in the
  backward's forward, where the kernel returns its result.
- threads: the thread count asked for (0: the kernel's default).
- With lse=True it returns (out, lse), lse [batch, heads_q, seq_q] (any shape of that many
  values; [heads_q, total_q] when packed), the natural log of each row's softmax denominator
  (scaled scores, sinks included), -inf for a row without a visible key.

A row whose keys are all hidden is exactly 0 in the fixture format; a kernel that gives NaN
there (or treats the row as unmasked) declares it with empty_rows="nan" (or "unmasked",
"mean_v") so that the verdict says so instead of failing.

Backward (format version 3 cases, which hold dout and the float64 dq, dk, dv): with
backward="autograd" (the default for torch and jax) the gradients of sum(dout * out) come from
the framework's autograd through fn (sinks a leaf too); with a function, it is called as
bwd(q, k, v, out, dout, **the same keywords) and returns (dq, dk, dv[, dbias[, dsinks]]) or a
dict of those names: dbias [batch, heads_q, seq_q, seq_k] (which attnbench sums over the bias's
broadcast axes) or already in the bias's stored shape, None where the case has no bias
gradient; dsinks [heads_q] where the case has sinks. backward=None leaves the backward out (SKIP).
"""

import inspect
import math
import time
import warnings

import numpy as np

# The Python backend contract's own file (impls/python/backends/attn_common.py, linked here).
from ._contract import ENCODINGS_KNOWN, bf16_to_f32 as _bf16_to_f32, decode as _decode, f32_to_bf16 as _f32_to_bf16, \
    torch_gradients as _torch_gradients

__all__ = ["Kernel", "kernel"]

DTYPES = ("float64", "float32", "float16", "bfloat16")
# Format version 2's additions, by the names the backend contract's FEATURES uses.
V2_FEATURES = ("window", "softcap", "alibi", "sinks", "ragged", "paged")
FEATURES = ("mask", "bias", "kv_len", "causal", "gqa") + V2_FEATURES
# The keyword arguments each feature is passed in (all of them required to declare it).
_FEATURE_KEYWORDS = {"mask": ("mask",), "bias": ("bias",), "kv_len": ("kv_len",), "causal": ("causal",),
                     "gqa": (), "window": ("window_size",), "softcap": ("softcap",),
                     "alibi": ("alibi_slopes",), "sinks": ("sinks",),
                     "ragged": ("cu_seqlens_q", "cu_seqlens_k"), "paged": ("block_table", "cache_seqlens")}
_KEYWORDS = ("scale", "causal", "align", "mask", "bias", "kv_len", "window_size", "softcap", "alibi_slopes",
             "sinks", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "block_table",
             "cache_seqlens", "q_descale", "k_descale", "v_descale", "quant", "out", "threads")
# Format version 4: the dtype a quantised tensor's codes arrive in, by encoding (fp8 as the
# framework's float8 type where it has one, else uint8; packed and block encodings as raw bytes).
_FP8 = {"float8_e4m3fn", "float8_e5m2"}
_EMPTY_ROWS = {"zero": None, "nan": "empty_rows_nan", "mean_v": "empty_rows_mean_v",
               "unmasked": "empty_rows_unmasked"}


# --- frameworks: views in, results out -------------------------------------------------------

_SAID = set()


class MissingPeerWarning(UserWarning):
    """A missing optional package makes a whole class of cases SKIP (said once per process)."""


def _say_once(text):
    if text not in _SAID:
        _SAID.add(text)
        warnings.warn(text, MissingPeerWarning, stacklevel=2)


def _ml_dtypes():
    try:
        import ml_dtypes
        return ml_dtypes
    except ImportError:
        return None


class _NumPy:
    name = "numpy"

    def available(self):
        return None

    def staged(self):
        return False

    def dtype_reason(self, dtype):
        if dtype == "bfloat16" and _ml_dtypes() is None:
            _say_once("ml_dtypes is not installed: every bfloat16 case of a NumPy kernel is SKIP "
                      "(pip install ml_dtypes, or attnbench[bfloat16])")
            return "NumPy has no bfloat16: install ml_dtypes for bfloat16 arrays (ml_dtypes.bfloat16)"
        return None

    def array(self, view, dtype):
        if dtype == "bfloat16":
            return view.view(_ml_dtypes().bfloat16)
        return view

    def codes(self, view, encoding):
        if encoding in _FP8 and _ml_dtypes() is not None:
            return view.view(getattr(_ml_dtypes(), encoding))
        return view.view(np.int8) if encoding == "int8" else view

    def to_numpy(self, x):
        return np.asarray(x)

    def swap(self, x):
        return np.swapaxes(x, 1, 2)

    def note(self):
        return None


class _Torch:
    name = "torch"

    def __init__(self, device):
        self.device = device
        self._torch = None

    def torch(self):
        if self._torch is None:
            import torch
            self._torch = torch
        return self._torch

    def available(self):
        try:
            torch = self.torch()
        except Exception as e:  # a broken wheel raises OSError, not only ImportError
            return f"torch cannot be imported: {type(e).__name__}: {e}"
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            return f"the kernel runs on {self.device} and torch sees no CUDA device"
        return None

    def dtype_reason(self, dtype):
        return None

    def staged(self):
        """Whether results stay on a device until read_output (any device but the CPU)."""
        return self.device != "cpu"

    def synchronize(self):
        torch = self.torch()
        kind = self.device.split(":")[0]
        backend = getattr(torch, kind, None)
        if backend is not None and hasattr(backend, "synchronize"):
            backend.synchronize()

    def upload(self, t):
        """A host tensor on the kernel's device: one copy per case, made in prepare (untimed)."""
        return t if self.device == "cpu" else t.to(self.device)

    def array(self, view, dtype):
        torch = self.torch()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only views: torch warns; nothing writes them
            if dtype == "bfloat16":
                t = torch.from_numpy(view.view(np.int16)).view(torch.bfloat16)
            else:
                t = torch.from_numpy(view)
        return self.upload(t)

    def codes(self, view, encoding):
        torch = self.torch()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = torch.from_numpy(view.view(np.int8) if encoding == "int8" else view)
        if encoding in _FP8 and hasattr(torch, encoding):
            t = t.view(getattr(torch, encoding))
        return self.upload(t)

    def to_numpy(self, x):
        torch = self.torch()
        if not isinstance(x, torch.Tensor):
            return np.asarray(x)
        x = x.detach()
        if x.device.type != "cpu":
            x = x.cpu()
        if x.dtype == torch.bfloat16:
            return _BF16Bits(x.view(torch.int16).numpy().view(np.uint16))
        return x.numpy()

    def swap(self, x):
        return x.transpose(1, 2)

    def note(self):
        if self.device == "cpu":
            return None
        return (f"inputs copied to {self.device} once per case, results back once after the runs "
                "(neither timed)")


class _Jax:
    name = "jax"

    def __init__(self):
        self._jax = None

    def jax(self):
        if self._jax is None:
            import jax
            import jax.numpy  # noqa: F401
            self._jax = jax
        return self._jax

    def available(self):
        try:
            self.jax()
        except Exception as e:
            return f"jax cannot be imported: {type(e).__name__}: {e}"
        return None

    def dtype_reason(self, dtype):
        if dtype == "float64" and not self.jax().config.read("jax_enable_x64"):
            return "JAX computes float64 only with jax_enable_x64 (jax.config.update('jax_enable_x64', True))"
        return None

    def array(self, view, dtype):
        # JAX arrays are immutable and own their memory: each input is copied once, in
        # prepare (untimed); bfloat16 goes through ml_dtypes, never through float32.
        jnp = self.jax().numpy
        if dtype == "bfloat16":
            return jnp.asarray(view.view(_ml_dtypes().bfloat16))
        return jnp.asarray(view)

    def codes(self, view, encoding):
        return self.jax().numpy.asarray(_NumPy().codes(view, encoding))

    def staged(self):
        return False

    def to_numpy(self, x):
        return np.asarray(x)  # a JAX array on the CPU: its buffer, without a copy (bfloat16: ml_dtypes)

    def swap(self, x):
        return self.jax().numpy.swapaxes(x, 1, 2)

    def note(self):
        return "JAX inputs are copies (JAX arrays are immutable), made in prepare"


class _BF16Bits:
    """bfloat16 results as their raw bits (a framework's bfloat16 without ml_dtypes)."""

    def __init__(self, bits):
        self.bits = bits
        self.shape = bits.shape

    def swapped(self):
        return _BF16Bits(np.swapaxes(self.bits, 1, 2))


def _is_bf16(a):
    ml = _ml_dtypes()
    return ml is not None and a.dtype == ml.bfloat16


def _store(dtype, view, result, what):
    """Writes a result (numpy, from the framework) into an attnbench buffer of the case's dtype,
    rounding to nearest where the kernel returned another float type."""
    if tuple(result.shape) != tuple(view.shape):
        raise ValueError(f"{what} has shape {tuple(result.shape)}; the case needs {tuple(view.shape)}")
    if isinstance(result, _BF16Bits):
        if dtype == "bfloat16":
            view[...] = result.bits
        else:
            view[...] = _bf16_to_f32(result.bits)
        return
    result = np.asarray(result)
    if dtype == "bfloat16":
        if _is_bf16(result):
            view[...] = result.view(np.uint16)
        else:
            view[...] = _f32_to_bf16(np.asarray(result, dtype=np.float32))
    else:
        if _is_bf16(result):
            result = _bf16_to_f32(result.view(np.uint16))
        view[...] = result


class _Quant:
    """How one quantised tensor dequantises (format version 4): encoding, dim (elements a row
    holds), group (elements one scale covers), scale and zero_point ([.., groups] beside the codes'
    axes, in the kernel's axes, or None) and descale ([batch, heads_kv], or None; the query's is
    indexed by kv head). A value is (decode(code) - zero_point) * scale * descale."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __repr__(self):
        return f"attnbench quantised {self.encoding} (group {self.group}, " \
               f"scale {'yes' if self.scale is not None else 'no'}, " \
               f"zero point {'yes' if self.zero_point is not None else 'no'}, " \
               f"descale {'yes' if self.descale is not None else 'no'})"


def dequantize(codes, quant):
    """The codes a kernel receives for a quantised tensor, as float64 NumPy values in the same axes:
    decode(code), minus the zero point, times the scale (the descale, per (entry, kv head), is
    the kernel's to apply). Exact: attn_common.py's decoders, written apart from the C++ ones."""
    as_numpy = lambda x: x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)
    raw = as_numpy(codes)
    if raw.dtype.itemsize == 1 and raw.dtype != np.uint8:
        raw = raw.view(np.uint8)
    x = _decode(quant.encoding, raw, quant.dim)
    repeat = lambda a: np.repeat(np.asarray(as_numpy(a), dtype=np.float64), quant.group, axis=-1)[..., :quant.dim]
    if quant.zero_point is not None:
        x = x - repeat(quant.zero_point)
    if quant.scale is not None:
        x = x * repeat(quant.scale)
    return x


def _uses(problem, feature):
    """Whether a problem uses a format version 2 addition (the problem object of the bridge)."""
    if feature == "window":
        return problem.window_left >= 0 or problem.window_right >= 0
    if feature == "softcap":
        return problem.softcap != 0
    if feature == "paged":
        return problem.page_size > 0
    return bool(getattr(problem, feature))


def _longest(cu_seqlens):
    return int(np.max(np.diff(cu_seqlens))) if len(cu_seqlens) > 1 else 0


def _framework(name, device):
    if name == "numpy":
        if device != "cpu":
            raise ValueError("framework='numpy' runs on the cpu only")
        return _NumPy()
    if name == "torch":
        return _Torch(device)
    if name == "jax":
        if device != "cpu":
            raise ValueError("framework='jax' runs on the cpu here (device='cpu')")
        return _Jax()
    raise ValueError(f"framework '{name}' is none of numpy, torch, jax")


# --- the kernel -------------------------------------------------------------------------------

class Kernel:
    """A user's attention function with what it declares (see the module's text). Calling the
    Kernel calls the function. Its attributes are the Python backend contract."""

    def __init__(self, fn, *, name=None, description=None, framework="numpy", dtypes=DTYPES,
                 layout="bhsd", features=None, gqa=True, causal="top_left", lse=False,
                 backward="default", empty_rows="zero", device="cpu", thread_dependent_gradients=None,
                 encodings=()):
        self.fn = fn
        self.NAME = name or getattr(fn, "__name__", "kernel")
        self.DESCRIPTION = description or (inspect.getdoc(fn) or "").split("\n")[0] or f"Python kernel {self.NAME}"
        for d in dtypes:
            if d not in DTYPES:
                raise ValueError(f"dtype '{d}' is none of {', '.join(DTYPES)}")
        self.DTYPES = tuple(dtypes)
        if layout not in ("bhsd", "bshd"):
            raise ValueError(f"layout '{layout}' is neither bhsd nor bshd")
        self.layout = layout
        if causal not in ("top_left", "bottom_right", "both"):
            raise ValueError(f"causal '{causal}' is none of top_left, bottom_right, both")
        self.causal = causal
        if empty_rows not in _EMPTY_ROWS:
            raise ValueError(f"empty_rows '{empty_rows}' is none of {', '.join(_EMPTY_ROWS)}")
        self.empty_rows = empty_rows
        self.framework = _framework(framework, device)
        self.keywords = self._keywords(fn)
        if isinstance(features, str):
            features = (features,)
        declared = set(features) if features is not None else self._features_from_signature()
        unknown = declared - set(FEATURES)
        if unknown:
            raise ValueError(f"features {sorted(unknown)} are not among {', '.join(FEATURES)}")
        for f in sorted(declared):
            missing = [kw for kw in _FEATURE_KEYWORDS[f] if kw not in self.keywords]
            if missing:
                raise ValueError(f"{self.NAME} declares the feature '{f}' but its signature takes no "
                                 f"{', '.join('`' + m + '`' for m in missing)} argument: attnbench passes "
                                 f"'{f}' in {', '.join(_FEATURE_KEYWORDS[f])}")
        if gqa:
            declared.add("gqa")
        else:
            declared.discard("gqa")
        self.features = frozenset(declared)
        # The backend contract's FEATURES: the format version 2 additions it implements.
        self.FEATURES = tuple(f for f in V2_FEATURES if f in declared)
        if isinstance(encodings, str):
            encodings = (encodings,)
        for e in encodings:
            if e not in ENCODINGS_KNOWN:
                raise ValueError(f"encoding '{e}' is none of {', '.join(ENCODINGS_KNOWN)}")
        if encodings and not {"quant", "q_descale", "k_descale", "v_descale"} & self.keywords:
            raise ValueError(f"{self.NAME} declares encodings but its signature takes neither `quant` nor a "
                             "descale (`q_descale`, `k_descale`, `v_descale`): it could not be told how its "
                             "codes dequantise")
        # The backend contract's ENCODINGS (format version 4): the quantised inputs it reads.
        self.ENCODINGS = tuple(encodings)
        self.HAS_LSE = bool(lse)
        # A function without `threads` is never told the count: the same run at every one.
        self.USES_THREADS = "threads" in self.keywords
        if backward == "default":
            backward = "autograd" if framework in ("torch", "jax") else None
        if backward == "autograd" and framework == "numpy":
            raise ValueError("NumPy has no autograd: pass backward=a function returning (dq, dk, dv)")
        if backward is not None and backward != "autograd" and not callable(backward):
            raise ValueError("backward is 'autograd', a function or None")
        self.backward = backward
        if backward is not None:
            self.prepare_backward = self._prepare_backward
            # A kernel that takes `threads` and sets its framework's thread count by it may see its
            # gradients change in the last bits between counts (torch's CPU backward does): said
            # here, such differences are DIFFERS instead of FAIL.
            if thread_dependent_gradients:
                self.THREAD_DEPENDENT_GRADIENTS = str(thread_dependent_gradients)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __repr__(self):
        return f"attnbench.Kernel({self.NAME}, {self.framework.name}, dtypes={list(self.DTYPES)})"

    @staticmethod
    def _keywords(fn):
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            return set(_KEYWORDS)
        if any(p.kind == p.VAR_KEYWORD for p in params):
            return set(_KEYWORDS)
        return {p.name for p in params if p.name in _KEYWORDS and p.kind != p.POSITIONAL_ONLY}

    def _features_from_signature(self):
        return {f for f, kws in _FEATURE_KEYWORDS.items() if kws and all(kw in self.keywords for kw in kws)}

    # The backend contract.
    def available(self):
        return self.framework.available()

    def supports(self, problem):
        why = self.framework.dtype_reason(problem.dtype)
        if why:
            return why
        needs = []
        if problem.mask is not None:
            needs.append("mask")
        if problem.bias is not None:
            needs.append("bias")
        if problem.kv_len:
            needs.append("kv_len")
        if problem.causal != "none":
            needs.append("causal")
        if problem.heads_kv != problem.heads_q:
            needs.append("gqa")
        needs += [f for f in V2_FEATURES if _uses(problem, f)]
        for f in needs:
            if f not in self.features:
                if f == "gqa":
                    return f"{self.NAME} declares no GQA (heads_kv {problem.heads_kv} != heads_q {problem.heads_q})"
                kws = " and ".join(f"`{kw}`" for kw in _FEATURE_KEYWORDS[f])
                return f"{self.NAME} takes no {f} (its signature has no {kws} argument, or features leaves it out)"
        why = self._alignment_reason(problem) or self._quant_reason(problem)
        if why:
            return why
        if "scale" not in self.keywords:
            default = 1.0 / math.sqrt(problem.head_dim) if problem.head_dim > 0 else 1.0
            if abs(problem.scale - default) > 1e-12 * default:
                return f"{self.NAME} takes no scale and this case's is {problem.scale:.6g}, not 1/sqrt(head_dim)"
        return None

    def _quant_reason(self, problem):
        """Why the kernel cannot be told how this case's quantised tensors dequantise, or None."""
        for t in "qkv":
            quant = getattr(problem, t + "_quant", None)
            if quant is None:
                continue
            if (quant.scale is not None or quant.zero_point) and "quant" not in self.keywords:
                return f"{self.NAME} takes no `quant`, which carries {t}'s scales and zero points"
            if quant.descale is not None and "quant" not in self.keywords and f"{t}_descale" not in self.keywords:
                return f"{self.NAME} takes neither `{t}_descale` nor `quant`, and {t} has a descale"
        return None

    def _alignment_reason(self, problem):
        """Why the kernel cannot be told this case's diagonal (causal rule, window, ALiBi), or None."""
        if problem.causal == "none" and not _uses(problem, "window") and not _uses(problem, "alibi"):
            return None
        if "align" in self.keywords or problem.align == self.causal:
            return None
        if self.causal == "both" and problem.causal != "none":
            return None  # the causal string says it
        # Both alignments put the diagonal at key i when every entry has as many keys as queries;
        # packed and paged entries have lengths of their own.
        if problem.seq_q == problem.seq_k and not problem.ragged and not problem.page_size:
            return None
        what = f"causal masks" if problem.causal != "none" else "windows and ALiBi"
        declared = "by the causal string only" if self.causal == "both" else self.causal
        return (f"{self.NAME} aligns {what} {declared} and takes no `align`; this case's diagonal is "
                f"{problem.align} with entries of other lengths (seq_q {problem.seq_q}, seq_k {problem.seq_k}"
                f"{', packed' if problem.ragged else ''}{', paged' if problem.page_size else ''})")

    def conventions(self, problem):
        code = _EMPTY_ROWS[self.empty_rows]
        if code is None:
            return []
        hides = (problem.mask is not None or problem.kv_len or problem.causal != "none" or problem.bias is not None
                 or _uses(problem, "window") or problem.ragged or problem.page_size > 0)
        return [(code, f"{self.NAME} declares empty_rows='{self.empty_rows}'")] if hides else []

    # Packed (ragged) cases hold q, out (and k, v) as [1, heads, total, dim]: the kernel sees them
    # without that batch axis of one, as FlashAttention's varlen functions take them.
    def _kernel_axes(self, x, ragged=False):
        x = x if self.layout == "bhsd" else self.framework.swap(x)
        return x[0] if ragged else x

    def _kernel_axes_numpy(self, a, ragged=False):
        """A result in the kernel's axes as attnbench's logical [batch, heads, seq, dim]."""
        if ragged:
            a = _BF16Bits(a.bits[None]) if isinstance(a, _BF16Bits) else np.asarray(a)[None]
        if self.layout == "bhsd":
            return a
        return a.swapped() if isinstance(a, _BF16Bits) else np.swapaxes(a, 1, 2)

    def _arguments(self, problem, io):
        """q, k, v in the kernel's axes and its keyword arguments (untimed: made in prepare)."""
        fw = self.framework
        quant = {}
        arrays = []
        for t in "qkv":
            spec = getattr(problem, t + "_quant", None)
            if spec is None:
                arrays.append(self._kernel_axes(fw.array(getattr(io, t), problem.dtype), problem.ragged))
                quant[t] = None
                continue
            # Format version 4: the codes in the tensor's place, and what dequantises them.
            c = getattr(io, t + "_codes")
            arrays.append(self._kernel_axes(fw.codes(np.asarray(c.codes), spec.encoding), problem.ragged))
            per_row = lambda x, kind: None if x is None else self._kernel_axes(fw.array(np.asarray(x), kind),
                                                                              problem.ragged)
            quant[t] = _Quant(encoding=spec.encoding, dim=problem.head_dim_v if t == "v" else problem.head_dim,
                              group=int(c.group), scale=per_row(c.scale, "float32"),
                              zero_point=per_row(c.zero_point, "int32"),
                              descale=None if c.descale is None else fw.array(np.asarray(c.descale), "float32"))
        q, k, v = arrays
        kw = {}
        wants = self.keywords
        for t in "qkv":
            if f"{t}_descale" in wants:
                kw[f"{t}_descale"] = None if quant[t] is None else quant[t].descale
        if "quant" in wants:
            kw["quant"] = quant

        def small(name, dtype):
            view = getattr(io, name, None)
            return None if view is None else fw.array(np.asarray(view), dtype)

        if "scale" in wants:
            kw["scale"] = problem.scale
        if "causal" in wants:
            kw["causal"] = problem.causal if self.causal == "both" else problem.causal != "none"
        if "align" in wants:
            kw["align"] = problem.align
        if "mask" in wants:
            kw["mask"] = None if io.mask is None else fw.array(np.asarray(io.mask) != 0, "bool")
        if "bias" in wants:
            kw["bias"] = None if io.bias is None else fw.array(io.bias, problem.dtype)
        if "kv_len" in wants:
            kw["kv_len"] = None if io.kv_len is None else fw.array(np.array(io.kv_len), "int64")
        if "window_size" in wants:
            kw["window_size"] = (int(problem.window_left), int(problem.window_right))
        if "softcap" in wants:
            kw["softcap"] = float(problem.softcap)
        if "alibi_slopes" in wants:
            kw["alibi_slopes"] = small("alibi_slopes", "float32")
        if "sinks" in wants:
            kw["sinks"] = small("sinks", "float32")
        for name in ("cu_seqlens_q", "cu_seqlens_k"):
            if name in wants:
                kw[name] = small(name, "int64")
        for name, cu in (("max_seqlen_q", "cu_seqlens_q"), ("max_seqlen_k", "cu_seqlens_k")):
            if name in wants:
                kw[name] = _longest(np.asarray(getattr(io, cu))) if problem.ragged else None
        if "block_table" in wants:
            kw["block_table"] = small("page_table", "int64")
        if "cache_seqlens" in wants:
            kw["cache_seqlens"] = small("seq_lens", "int64")
        return q, k, v, kw

    def _threads(self, kw, threads):
        if "threads" in self.keywords:
            kw["threads"] = threads

    def _split(self, result):
        """(out, lse) from what fn returned."""
        if self.HAS_LSE:
            if not isinstance(result, (tuple, list)) or len(result) != 2:
                raise TypeError(f"{self.NAME} declares lse=True and must return (out, lse), "
                                f"not {type(result).__name__}")
            return result[0], result[1]
        if isinstance(result, (tuple, list)):
            raise TypeError(f"{self.NAME} returned a {type(result).__name__} of {len(result)}; "
                            "it returns out alone (or (out, lse) with lse=True)")
        return result, None

    def prepare(self, problem, io, threads):
        fw = self.framework
        q, k, v, kw = self._arguments(problem, io)
        self._threads(kw, threads)
        # `out` is attnbench's buffer on the CPU (numpy, torch); None where results must come back
        # (jax, a torch device).
        writes_out = "out" in self.keywords and fw.name != "jax" and getattr(fw, "device", "cpu") == "cpu"
        out_target = None
        if "out" in self.keywords:
            kw["out"] = None
        if writes_out:
            out_view = np.asarray(io.out)
            out_target = self._kernel_axes(fw.array(out_view, problem.dtype), problem.ragged)  # attnbench's out
            kw["out"] = out_target
        dtype, fn, name, ragged = problem.dtype, self.fn, self.NAME, problem.ragged
        lse_view = io.lse
        lse_size = None if lse_view is None else lse_view.size
        lse_shape = "[heads_q, total_q]" if ragged else "[batch, heads_q, seq_q]"

        def store(result):
            out, lse = self._split(result)
            if out is None:
                if not writes_out:
                    raise TypeError(f"{name} returned None and takes no `out` to write into")
            elif out is not out_target:
                _store(dtype, io.out, self._kernel_axes_numpy(fw.to_numpy(out), ragged), f"{name}'s output")
            if lse is not None and lse_view is not None:
                lse_np = np.asarray(fw.to_numpy(lse), dtype=np.float64)
                if lse_np.size != lse_size:
                    raise ValueError(f"{name}'s lse has {lse_np.size} values; the case needs "
                                     f"{lse_shape} = {lse_size}")
                lse_view[...] = lse_np.reshape(-1)

        if not fw.staged():
            def run():
                store(fn(q, k, v, **kw))
            return run

        # On a device: inputs went up once (in _arguments, untimed); run() leaves the results there,
        # read_output() brings the last ones back once, and run_timed() times the kernel alone.
        latest = []

        def run():
            latest[:] = [fn(q, k, v, **kw)]

        def read_output():
            if not latest:
                raise RuntimeError(f"{name}: read_output() before any run()")
            store(latest[0])

        def run_timed():
            fw.synchronize()
            start = time.perf_counter()
            run()
            fw.synchronize()
            return time.perf_counter() - start

        run.read_output = read_output
        run.run_timed = run_timed
        return run

    # Backward (format version 3).
    def _prepare_backward(self, problem, io, threads):
        fw = self.framework
        dtype, ragged = problem.dtype, problem.ragged
        bias_stored = None
        if problem.bias is not None:
            bb, bh, bq = problem.bias
            bias_stored = np.ascontiguousarray(io.bias[:bb, :bh, :bq, :])  # the stored broadcast shape
        shape = (problem.batch, problem.heads_q, problem.seq_q, problem.seq_k)
        dout = self._kernel_axes(fw.array(np.asarray(io.dout), dtype), ragged)
        q, k, v, kw = self._arguments(problem, io)
        if "out" in self.keywords:
            kw["out"] = None  # the backward's forward returns its result
        self._threads(kw, threads)
        # The gradients the case asks for beyond dq, dk, dv, in the order a function returns them.
        extras = []
        if io.dbias is not None:
            if "bias" not in self.keywords:
                raise TypeError(f"{self.NAME} takes no bias, so it has no dbias")
            extras.append("dbias")
        if getattr(io, "dsinks", None) is not None:
            extras.append("dsinks")
        names = ("dq", "dk", "dv") + tuple(extras)

        if callable(self.backward):
            out = self._kernel_axes(fw.array(np.asarray(io.out), dtype), ragged)
            bwd, name = self.backward, self.NAME

            def run():
                grads = bwd(q, k, v, out, dout, **kw)
                if isinstance(grads, (tuple, list)) and 3 <= len(grads) <= 5:
                    grads = dict(zip(("dq", "dk", "dv", "dbias", "dsinks"), grads))
                if not isinstance(grads, dict):
                    raise TypeError(f"{name}'s backward returns (dq, dk, dv[, dbias[, dsinks]]) or a dict of "
                                    f"them, not {_described(grads)}")
                missing = [n for n in names if grads.get(n) is None]
                if missing:
                    raise TypeError(f"{name}'s backward returned no {', '.join(missing)}, which this case needs")
                self._store_gradients(problem, io, {n: grads[n] for n in names})

            return run

        if fw.name == "torch":
            return self._torch_autograd(problem, io, q, k, v, dout, kw, bias_stored, extras, shape)
        return self._jax_autograd(problem, io, q, k, v, dout, kw, bias_stored, extras, shape)

    def _store_gradients(self, problem, io, grads):
        """dq, dk, dv (in the kernel's axes), dbias (its stored shape, or the full one, which is
        summed over the broadcast axes) and dsinks into attnbench's buffers."""
        for what, g in grads.items():
            g = self.framework.to_numpy(g)
            if what == "dbias":
                _store(problem.dtype, io.dbias, _fold_bias(g, io.dbias.shape), f"{self.NAME}'s dbias")
            elif what == "dsinks":
                g = np.asarray(g, dtype=np.float64)
                if g.size != io.dsinks.size:
                    raise ValueError(f"{self.NAME}'s dsinks has {g.size} values; the case has "
                                     f"{io.dsinks.size} heads")
                io.dsinks[...] = g.reshape(-1)
            else:
                _store(problem.dtype, getattr(io, what), self._kernel_axes_numpy(g, problem.ragged),
                       f"{self.NAME}'s {what}")

    def _torch_autograd(self, problem, io, q, k, v, dout, kw, bias_stored, extras, shape):
        torch = self.framework.torch()
        name, fn = self.NAME, self.fn
        inputs = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
        bias_leaf = None
        if bias_stored is not None and "bias" in self.keywords:
            bias_leaf = self.framework.array(bias_stored, problem.dtype).detach().clone()
            if "dbias" in extras:
                bias_leaf.requires_grad_(True)
                inputs.append(bias_leaf)
        if "dsinks" in extras:
            inputs.append(kw["sinks"].detach().clone().requires_grad_(True))

        def forward(*xs):
            args = dict(kw)
            if bias_leaf is not None:
                args["bias"] = (xs[3] if "dbias" in extras else bias_leaf).expand(shape)
            if "dsinks" in extras:
                args["sinks"] = xs[-1]
            out, _ = self._split(fn(*xs[:3], **args))
            # A kernel may return a wider type than the case's; the forward rounds it to the case's.
            return out.to(dout.dtype) if isinstance(out, torch.Tensor) and out.dtype != dout.dtype else out

        def run():
            grads = _torch_gradients(torch, forward, inputs, dout, name,
                                     " (pass backward=a function, or backward=None)")
            self._store_gradients(problem, io, dict(zip(("dq", "dk", "dv") + tuple(extras), grads)))

        return run

    def _jax_autograd(self, problem, io, q, k, v, dout, kw, bias_stored, extras, shape):
        jax = self.framework.jax()
        fn = self.fn
        bias_leaf = None
        if bias_stored is not None and "bias" in self.keywords:
            bias_leaf = self.framework.array(bias_stored, problem.dtype)
        primals = [q, k, v] + ([bias_leaf] if "dbias" in extras else []) + \
                  ([kw["sinks"]] if "dsinks" in extras else [])

        def forward(*xs):
            args = dict(kw)
            if bias_leaf is not None:
                b = xs[3] if "dbias" in extras else bias_leaf
                args["bias"] = jax.numpy.broadcast_to(b, shape)
            if "dsinks" in extras:
                args["sinks"] = xs[-1]
            out, _ = self._split(fn(xs[0], xs[1], xs[2], **args))
            # A kernel may return a wider type than the case's; the forward rounds it to the case's.
            return out.astype(dout.dtype) if out.dtype != dout.dtype else out

        def run():
            _, vjp = jax.vjp(forward, *primals)
            self._store_gradients(problem, io, dict(zip(("dq", "dk", "dv") + tuple(extras), vjp(dout))))

        return run


def _described(x):
    if isinstance(x, (tuple, list)):
        return f"a {type(x).__name__} of {len(x)}"
    return type(x).__name__


def _fold_bias(g, stored):
    """A dbias of the full [batch, heads_q, seq_q, seq_k] summed over the axes where the stored bias
    broadcasts (extent 1), as attnbench asks for it; one of the stored shape as it is."""
    if isinstance(g, _BF16Bits) or tuple(g.shape) == tuple(stored) or len(g.shape) != len(stored):
        return g
    axes = tuple(a for a in range(len(stored)) if stored[a] == 1 and g.shape[a] != 1)
    return np.asarray(g, dtype=np.float64).sum(axis=axes, keepdims=True) if axes else g


def kernel(fn=None, **options):
    """Declares an attention function to attnbench: @attnbench.kernel or
    @attnbench.kernel(dtypes=..., layout=..., features=..., framework=..., ...). See Kernel."""
    if fn is None:
        return lambda f: Kernel(f, **options)
    return Kernel(fn, **options)
