"""Three PyTorch kernels declared to attnbench: a hand-written one with every feature, SDPA, and
a paged-decode kernel in the shape vLLM and FlashAttention's kv-cache functions take.

All take zero-copy tensors over attnbench's buffers (bfloat16 and float16 as they are), and their
backward is torch's autograd through the same call. PyTorch comes from the optional venv
(scripts/install-python-peers); without it every case is SKIP, with the reason.
"""

import attnbench


def _entry(qe, ke, ve, limit, *, scale, causal, align, mask, bias, window_size, softcap, alibi_slopes, sinks):
    """One batch entry: qe [hq, lq, d], ke and ve [hkv, lk, .], keys j < limit; returns
    (out [hq, lq, dv], lse [hq, lq]) in float32 (float64 for float64), the maximum subtracted."""
    import torch

    acc = torch.float64 if qe.dtype == torch.float64 else torch.float32
    hq, lq = qe.shape[0], qe.shape[1]
    group = hq // ke.shape[0]
    ke = ke.repeat_interleave(group, dim=0).to(acc)
    ve = ve.repeat_interleave(group, dim=0).to(acc)
    lk = ke.shape[1]
    s = scale * torch.einsum("hqd,hkd->hqk", qe.to(acc), ke)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
    diag = i if align == "top_left" else i + lk - lq
    visible = (j < limit).expand(hq, lq, lk)
    if causal != "none":
        visible = visible & (j <= diag)
    left, right = window_size
    if left >= 0:
        visible = visible & (diag - j <= left)
    if right >= 0:
        visible = visible & (j - diag <= right)
    if mask is not None:
        visible = visible & mask[..., :lk]
    if alibi_slopes is not None:
        s = s - alibi_slopes.to(acc)[:, None, None] * (diag - j).abs().to(acc)
    if bias is not None:
        s = s + bias[..., :lk].to(acc)
    s = s.masked_fill(~visible, float("-inf"))
    sink = s.new_full((hq, 1, 1), float("-inf")) if sinks is None else sinks.to(acc)[:, None, None]
    m = s.amax(dim=-1, keepdim=True) if lk else s.new_full((hq, lq, 1), float("-inf"))
    m = torch.maximum(m, sink).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    total = e.sum(dim=-1, keepdim=True) + torch.exp(sink - m)
    safe = torch.where(total > 0, total, torch.ones_like(total))
    lse = torch.where(total > 0, torch.log(safe) + m, torch.full_like(m, float("-inf")))[..., 0]
    return torch.einsum("hqk,hkd->hqd", e / safe, ve), lse


@attnbench.kernel(name="torch-handwritten", framework="torch", causal="both", lse=True)
def handwritten(q, k, v, *, scale, causal, align, mask, bias, kv_len, window_size, softcap, alibi_slopes, sinks,
                cu_seqlens_q, cu_seqlens_k, block_table, cache_seqlens):
    """Attention in torch operations, every feature of the fixture format, one entry at a time."""
    import torch

    options = dict(scale=scale, causal=causal, align=align, window_size=window_size, softcap=softcap,
                   alibi_slopes=alibi_slopes, sinks=sinks)
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = q.new_zeros(q.shape[:-1] + (v.shape[-1],), dtype=acc)
    lse = q.new_full(q.shape[:-1], float("-inf"), dtype=torch.float64)
    if sinks is not None:  # rows of no entry (past a packed batch's last) hold the sink's lse
        lse = lse.copy_(sinks.to(torch.float64).reshape((-1, 1) if q.ndim == 3 else (1, -1, 1)).expand(lse.shape))
    if cu_seqlens_q is not None:  # packed: q [hq, total_q, d], k and v [hkv, total_k, .]
        for b in range(len(cu_seqlens_q) - 1):
            rows = slice(int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]))
            keys = slice(int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1]))
            o, l = _entry(q[:, rows], k[:, keys], v[:, keys], keys.stop - keys.start, mask=None, bias=None, **options)
            out[:, rows], lse[:, rows] = o, l.detach().to(torch.float64)
        return out.to(q.dtype), lse
    for b in range(q.shape[0]):
        if block_table is not None:  # paged: k and v [pages, hkv, page_size, .]
            n = int(cache_seqlens[b])
            pages = block_table[b, :-(-n // k.shape[2])]
            gather = lambda x: x[pages].transpose(0, 1).reshape(x.shape[1], len(pages) * x.shape[2], x.shape[3])
            ke, ve = gather(k)[:, :n], gather(v)[:, :n]
            limit = n
        else:
            ke, ve = k[b], v[b]
            limit = k.shape[2] if kv_len is None else min(int(kv_len[b]), k.shape[2])
        o, l = _entry(q[b], ke, ve, limit, mask=None if mask is None else mask[b],
                      bias=None if bias is None else bias[b], **options)
        out[b], lse[b] = o, l.detach().to(torch.float64)
    return out.to(q.dtype), lse


@attnbench.kernel(name="torch-sdpa", framework="torch", causal="top_left", features=("causal",),
                  empty_rows="zero")
def sdpa(q, k, v, *, scale, causal):
    """torch.nn.functional.scaled_dot_product_attention (is_causal, enable_gqa)."""
    import torch

    gqa = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=causal, **gqa)


def _dequantized(x, encoding, dim):
    """Codes as float32 in torch: fp8 through torch's float8 types, ggml Q8_0 and Q4_0 blocks (an
    IEEE half d, then 32 int8, or 16 bytes of nibbles: element j low, j + 16 high) as d * q."""
    import torch

    if encoding in ("float8_e4m3fn", "float8_e5m2"):
        return x.to(torch.float32)
    size = 34 if encoding == "q8_0" else 18
    blocks = x.reshape(*x.shape[:-1], -1, size)
    d = blocks[..., :2].contiguous().view(torch.float16).to(torch.float32)
    if encoding == "q8_0":
        q = blocks[..., 2:].contiguous().view(torch.int8).to(torch.float32)
    else:
        nibbles = blocks[..., 2:]
        q = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1).to(torch.float32) - 8
    return (d * q).reshape(*x.shape[:-1], -1)[..., :dim]


@attnbench.kernel(name="torch-paged-decode", framework="torch", layout="bshd", causal="bottom_right",
                  dtypes=("float32", "float16", "bfloat16", "float64"),
                  encodings=("float8_e4m3fn", "float8_e5m2", "q8_0", "q4_0"))
def paged_decode(q, k_cache, v_cache, *, scale, causal, window_size, softcap, alibi_slopes, sinks, block_table,
                 cache_seqlens, quant):
    """Paged attention over a block table, batched: q [batch, seq_q, heads_q, d], caches
    [num_pages, page_size, heads_kv, d], plain or quantised (fp8 with descales per (entry, kv
    head), as vLLM's and FlashAttention-3's; ggml blocks, as llama.cpp's); causal and windows from
    the bottom-right diagonal."""
    import torch

    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    b, sq, hq, _ = q.shape
    if quant["q"] is not None:
        q = _dequantized(q, quant["q"].encoding, quant["q"].dim)
    k = k_cache[block_table].flatten(1, 2)  # [batch, pages * page_size, heads_kv, d or bytes]
    v = v_cache[block_table].flatten(1, 2)
    k, v = ((x if quant[t] is None else _dequantized(x, quant[t].encoding, quant[t].dim)).to(acc)
            for t, x in (("k", k), ("v", v)))
    group = hq // k.shape[2]
    q = q.to(acc)
    for t in "qkv":  # the descales: one per (entry, kv head); the query's indexed by kv head
        if quant[t] is not None and quant[t].descale is not None:
            d = quant[t].descale.to(acc)
            if t == "q":
                q = q * d.repeat_interleave(group, dim=1)[:, None, :, None]
            elif t == "k":
                k = k * d[:, None, :, None]
            else:
                v = v * d[:, None, :, None]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    s = scale * torch.einsum("bqhd,bkhd->bhqk", q, k)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    n = cache_seqlens[:, None, None, None]
    i = torch.arange(sq)[None, None, :, None]
    j = torch.arange(k.shape[1])[None, None, None, :]
    diag = i + n - sq
    visible = j < n
    if causal:
        visible = visible & (j <= diag)
    left, right = window_size
    if left >= 0:
        visible = visible & (diag - j <= left)
    if right >= 0:
        visible = visible & (j - diag <= right)
    if alibi_slopes is not None:
        s = s - alibi_slopes.to(acc)[None, :, None, None] * (diag - j).abs().to(acc)
    # Keys past an entry's length may hold huge codes: their products are never used.
    s = s.masked_fill(~visible, float("-inf"))
    v = v.masked_fill(~(torch.arange(k.shape[1])[None, :, None, None] < cache_seqlens[:, None, None, None]), 0)
    if sinks is not None:  # one more logit per head, without a value
        s = torch.cat([s, sinks.to(acc)[None, :, None, None].expand(b, hq, sq, 1)], dim=-1)
        v = torch.cat([v, v.new_zeros(b, 1, hq, v.shape[-1])], dim=1)
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    total = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(total > 0, total, torch.ones_like(total))
    return torch.einsum("bhqk,bkhd->bqhd", p, v)  # float32 (float64): attnbench rounds it once
