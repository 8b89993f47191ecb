"""py-torch: torch.nn.functional.scaled_dot_product_attention, called as its users call it.

- The inputs are zero-copy tensors over attnbench's buffers (torch.from_numpy; bfloat16 as its
  raw bits viewed as torch.bfloat16), the output is written in place.
- causal top_left is is_causal=True; bottom_right is a bool mask (torch's CausalBias for it goes
  through torch._dynamo, which loads triton's LLVM, which aborts a process that holds
  TensorFlow's);
  GQA is enable_gqa=True; scale is passed as is.
- A mask, kv_len, a causal rule together with one of them, or a bias becomes the one attn_mask
  SDPA takes: a bool "attend" tensor (True = take part, torch's convention) or, with a bias, a
  float one (the bias where visible, -inf where hidden). Both are built in prepare (untimed).
- The backward is autograd through the same call (prepare_backward below).
"""

import contextlib
import os
import sys
import warnings

import numpy as np

import attn_common as ac

NAME = "py-torch"
DESCRIPTION = "PyTorch, torch.nn.functional.scaled_dot_product_attention (CPU)"
# Every dtype; masks, bias and kv_len as attn_mask, both causal alignments, GQA (enable_gqa).
# No version 2 addition here: SDPA has no window, softcap, sink, varlen or paged arguments
# (FlexAttention has them but compiles through triton).

# fp8 K, V (and Q) of format version 4, decoded by torch's own float8 dtypes (torch 2.1 or
# later) and dequantised as vLLM's and SGLang's torch paths do: codes.to(dtype) times the
# scale and descale, here computed in float64 and rounded once to the case's dtype.
ENCODINGS = ("float8_e4m3fn", "float8_e5m2")

_torch = None


def _import():
    global _torch
    if _torch is None:
        # attn links Debian's OpenBLAS, whose sgemm_ and friends are in the process's global
        # symbol scope; torch's own BLAS calls would bind to them (measured here: SDPA at seq
        # 4096 fell from about 150 to 50 GFLOP/s). RTLD_DEEPBIND makes torch's libraries use
        # their own symbols first. The sanitizers refuse DEEPBIND, so a sanitized attn does not.
        flags = sys.getdlopenflags()
        if not ac.SANITIZED:
            sys.setdlopenflags(os.RTLD_NOW | os.RTLD_DEEPBIND)
        try:
            import torch
        finally:
            sys.setdlopenflags(flags)
        _torch = torch
    return _torch


def available():
    why = ac.importable("torch", _import)
    if why:
        return why
    torch = _import()
    if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        return f"torch {torch.__version__} has no scaled_dot_product_attention (2.0 or later needed)"
    return None


def supports(problem):
    torch = _import()
    if problem.heads_kv != problem.heads_q and _version(torch) < (2, 5):
        return f"torch {torch.__version__}'s SDPA has no enable_gqa (2.5 or later needed for GQA)"
    quantised = [q.encoding for q in (problem.q_quant, problem.k_quant, problem.v_quant) if q is not None]
    if quantised and not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no float8 dtypes (2.1 or later needed for {quantised[0]})"
    return None


def _input(torch, problem, io, name):
    """q, k or v as SDPA takes it: the view, or (format version 4) fp8 codes viewed as torch's
    float8 dtype, widened exactly, times the scale and descale in float64, rounded once."""
    quant = getattr(problem, name + "_quant", None)
    if quant is None:
        return _tensor(torch, problem, getattr(io, name))
    c = getattr(io, name + "_codes")
    dim = problem.head_dim_v if name == "v" else problem.head_dim
    fp8 = getattr(torch, quant.encoding)
    x = torch.from_numpy(np.ascontiguousarray(c.codes[..., :dim])).view(fp8).to(torch.float64)
    if c.scale is not None:
        x = x * torch.from_numpy(np.repeat(np.asarray(c.scale, dtype=np.float64), c.group, axis=-1)[..., :dim])
    if c.descale is not None:
        d = torch.from_numpy(np.asarray(c.descale, dtype=np.float64))
        if name == "q":
            d = d.repeat_interleave(problem.heads_q // problem.heads_kv, dim=1)
        x = x * d[:, :, None, None]
    return x.to(getattr(torch, _DTYPES[problem.dtype]))


def _version(torch):
    parts = torch.__version__.split("+")[0].split(".")
    return tuple(int(p) for p in parts[:2] if p.isdigit())


def conventions(problem):
    # Torch's math path gives 0 on rows whose keys are all hidden (its _safe_softmax, since 2.5); an older
    # torch, or a kernel that does not, gives NaN there: declared so that the verdict shows it.
    if ac.hides_anything(problem) or problem.bias is not None:
        return [("empty_rows_nan", "SDPA's softmax of a row whose attn_mask hides every key")]
    return []


def _tensor(torch, problem, array):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # read-only views: torch warns, attnbench never writes them
        if problem.dtype == "bfloat16":
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(array)


def _sdpa_arguments(torch, problem, io):
    """SDPA's keyword arguments but attn_mask, and the bool "attend" tensor when the case needs a mask."""
    kwargs = {"scale": problem.scale}
    if problem.heads_kv != problem.heads_q:
        kwargs["enable_gqa"] = True
    only_causal = problem.mask is None and not problem.kv_len and problem.bias is None
    if only_causal and problem.causal == "top_left":
        kwargs["is_causal"] = True
        return kwargs, None
    if ac.hides_anything(problem) or problem.bias is not None:
        return kwargs, torch.from_numpy(ac.attend(problem, io))
    return kwargs, None


def _attn_mask(torch, attend, bias):
    """The bool mask alone, or the bias where visible and -inf where hidden."""
    if bias is None:
        return attend
    return torch.where(attend, bias, torch.tensor(float("-inf"), dtype=bias.dtype))


def prepare(problem, io, threads):
    torch = _import()
    if threads > 0:
        torch.set_num_threads(threads)
    q, k, v = (_input(torch, problem, io, name) for name in ("q", "k", "v"))
    out = _tensor(torch, problem, io.out)
    kwargs, attend = _sdpa_arguments(torch, problem, io)
    if attend is not None:
        kwargs["attn_mask"] = _attn_mask(torch, attend, None if problem.bias is None else _tensor(torch, problem, io.bias))
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def run():
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out.copy_(sdpa(q, k, v, **kwargs))

    return run


# The backward (format version 3): autograd through the same SDPA call. q, k, v (and a bias that
# requires a gradient, from its stored broadcast shape, expanded in the graph so that autograd sums
# over the broadcast axes as frameworks do) become leaves; torch.autograd.grad with dout gives dq,
# dk, dv (dk and dv already summed over each group's query heads by enable_gqa) and dbias. run()
# recomputes the forward, as autograd must.


def supports_backward(problem):
    return None  # everything supports() accepts


# Measured here (torch 2.15, CPU): the backward's dQ and dK differ in their last bits between 1
# and 8 threads (the math path's GEMMs and the flash kernel's sums over blocks are split by the
# thread count); two runs at one thread count agree bit for bit. Declared, so shown as DIFFERS.
NONDETERMINISTIC_DQ = True
THREAD_DEPENDENT_GRADIENTS = "torch's CPU backward splits its sums by the thread count (GEMM blocking)"


def prepare_backward(problem, io, threads):
    torch = _import()
    if threads > 0:
        torch.set_num_threads(threads)
    leaf = lambda a: _tensor(torch, problem, a).clone().requires_grad_(True)
    q, k, v = leaf(io.q), leaf(io.k), leaf(io.v)
    dout = _tensor(torch, problem, io.dout).clone()
    inputs = [q, k, v]
    kwargs, attend = _sdpa_arguments(torch, problem, io)
    bias = None
    if problem.bias is not None:
        bb, bh, bq = problem.bias
        stored = io.bias[:bb, :bh, :bq, :]  # the stored shape: the broadcast view's first slice
        bias = _tensor(torch, problem, np.ascontiguousarray(stored)).clone()
        if io.dbias is not None:
            bias.requires_grad_(True)
            inputs.append(bias)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    shape = (problem.batch, problem.heads_q, problem.seq_q, problem.seq_k)

    def forward(*leaves):
        args = dict(kwargs)
        if attend is not None:  # in the graph: autograd sums dbias over the expanded axes
            args["attn_mask"] = _attn_mask(torch, attend, None if bias is None else bias.expand(shape))
        return sdpa(q, k, v, **args)

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            grads = ac.torch_gradients(torch, forward, inputs, dout, NAME)
        for view, g in zip((io.dq, io.dk, io.dv, io.dbias), grads):
            ac.store(problem, view, g.detach().to(torch.float32 if problem.dtype == "bfloat16" else g.dtype).numpy())

    return run


# Layer cases: torch.nn.MultiheadAttention with the fixture's weights (torch stores [out, in],
# the format [in, out]: transposed here), in the case's dtype, eval mode.

_DTYPES = {"float64": "float64", "float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}


def supports_layer(problem, model_dim, kdim=None, vdim=None):
    # nn.MultiheadAttention takes kdim and vdim (then separate q/k/v_proj_weight).
    return ac.layer_shape_reason(problem, model_dim, "nn.MultiheadAttention") or supports(problem)


def mixed_precision(torch, problem, data):
    """A 16-bit layer whose weights or biases are not all exact in its dtype holds float32 master
    weights: it runs as mixed-precision training does, the module in float32 under
    torch.autocast (which casts the weights to the dtype for each product; their .grad is
    float32)."""
    if problem.dtype not in ("bfloat16", "float16"):
        return False
    dt = getattr(torch, _DTYPES[problem.dtype])
    for w in (data.w_q, data.w_k, data.w_v, data.w_o, data.b_q, data.b_k, data.b_v, data.b_o):
        if w is not None and not np.array_equal(torch.from_numpy(w).to(dt).to(torch.float64).numpy(), w):
            return True
    return False


def _autocast(torch, problem, mixed):
    if not mixed:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=getattr(torch, _DTYPES[problem.dtype]))


def _module(problem, data, threads):
    """(torch, nn.MultiheadAttention holding the fixture's weights, the keyword arguments of its
    call, a function making a tensor of the case's dtype, whether it runs mixed precision)."""
    torch = _import()
    if threads > 0:
        torch.set_num_threads(threads)
    dt = getattr(torch, _DTYPES[problem.dtype])
    mixed = mixed_precision(torch, problem, data)
    E = data.model_dim
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dt)
    m = torch.nn.MultiheadAttention(E, problem.heads_q, bias=True, batch_first=True, kdim=data.kdim, vdim=data.vdim,
                                    dtype=torch.float32 if mixed else dt)
    w32 = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(torch.float32)
    with torch.no_grad():
        p = w32 if mixed else t  # parameters: float32 master weights, or the case's dtype
        if m._qkv_same_embed_dim:
            m.in_proj_weight.copy_(torch.cat([p(data.w_q.T), p(data.w_k.T), p(data.w_v.T)]))
        else:
            for weight, w in ((m.q_proj_weight, data.w_q), (m.k_proj_weight, data.w_k), (m.v_proj_weight, data.w_v)):
                weight.copy_(p(w.T))
        m.in_proj_bias.copy_(torch.cat([p(ac.zeros_if_none(data.b_q, E)), p(ac.zeros_if_none(data.b_k, E)),
                                        p(ac.zeros_if_none(data.b_v, E))]))
        m.out_proj.weight.copy_(p(data.w_o.T))
        m.out_proj.bias.copy_(p(ac.zeros_if_none(data.b_o, E)))
    m.eval()
    kwargs = {"need_weights": False}
    if ac.hides_anything(problem) or data.bias is not None:
        attend = ac.attend(problem, data)
        b, h, sq, sk = attend.shape
        if data.bias is None:
            kwargs["attn_mask"] = torch.from_numpy(~attend).reshape(b * h, sq, sk)  # True = not allowed, in MHA
        else:
            bias = np.broadcast_to(data.bias, attend.shape)
            additive = np.where(attend, bias, -np.inf)  # a -inf of the bias hides its key too
            kwargs["attn_mask"] = t(additive).reshape(b * h, sq, sk)
    return torch, m, kwargs, t, mixed


def layer(problem, data, threads):
    torch, m, kwargs, t, mixed = _module(problem, data, threads)
    with torch.inference_mode(), warnings.catch_warnings(), _autocast(torch, problem, mixed):
        warnings.simplefilter("ignore")
        y, _ = m(t(data.x_q), t(data.x_k), t(data.x_v), **kwargs)
    return y.to(torch.float64).numpy()


def layer_backward(problem, data, dout, bias_requires_grad, threads):
    """Autograd through the same nn.MultiheadAttention: x_q, x_k and x_v as three leaves (so each
    gets its own gradient), the weights' .grad transposed back to the format's [in, out], the
    in-projection's split in three; a bias the layer does not have is not returned. A trainable
    attention bias is the float attn_mask as a leaf, its gradient summed over the bias's
    broadcast axes."""
    torch, m, kwargs, t, mixed = _module(problem, data, threads)
    E = data.model_dim
    x = [t(data.x_q).requires_grad_(), t(data.x_k).requires_grad_(), t(data.x_v).requires_grad_()]
    mask = kwargs.get("attn_mask")
    if bias_requires_grad:
        mask = kwargs["attn_mask"] = mask.detach().clone().requires_grad_()
    with torch.enable_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with _autocast(torch, problem, mixed):
            y, _ = m(*x, **kwargs)
        y.backward(t(dout).to(y.dtype))
    f64 = lambda g: g.detach().to(torch.float64).numpy()
    b = m.in_proj_bias.grad
    if m._qkv_same_embed_dim:
        w = m.in_proj_weight.grad
        dw = (w[:E], w[E:2 * E], w[2 * E:])
    else:
        dw = (m.q_proj_weight.grad, m.k_proj_weight.grad, m.v_proj_weight.grad)
    grads = {"dx_q": f64(x[0].grad), "dx_k": f64(x[1].grad), "dx_v": f64(x[2].grad),
             "dw_q": f64(dw[0]).T, "dw_k": f64(dw[1]).T, "dw_v": f64(dw[2]).T,
             "dw_o": f64(m.out_proj.weight.grad).T}
    for name, present, g in (("db_q", data.b_q, b[:E]), ("db_k", data.b_k, b[E:2 * E]), ("db_v", data.b_v, b[2 * E:]),
                             ("db_o", data.b_o, m.out_proj.bias.grad)):
        if present is not None:
            grads[name] = f64(g)
    if bias_requires_grad:
        full = f64(mask.grad).reshape(problem.batch, problem.heads_q, problem.seq_q, problem.seq_k)
        axes = tuple(a for a in range(4) if data.bias.shape[a] == 1 and full.shape[a] != 1)
        grads["dbias"] = full.sum(axis=axes, keepdims=True) if axes else full
    return grads
