"""Two PyTorch kernels declared to attnbench: a hand-written one and SDPA.

Both take zero-copy tensors over attnbench's buffers (bfloat16 and float16 as they are), and
their backward is torch's autograd through the same call. PyTorch comes from the optional
venv (scripts/install-python-peers); without it every case is SKIP, with the reason.
"""

import attnbench


@attnbench.kernel(name="torch-handwritten", framework="torch", causal="both")
def handwritten(q, k, v, *, scale, causal, mask, bias, kv_len):
    """Attention in torch operations: float32 sums (float64 for float64), the maximum subtracted."""
    import torch

    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    s = scale * torch.einsum("bhqd,bhkd->bhqk", q.to(acc), k.to(acc))
    sq, sk = s.shape[2], s.shape[3]
    visible = torch.ones(s.shape, dtype=torch.bool)
    if mask is not None:
        visible = visible & mask
    if kv_len is not None:
        visible = visible & (torch.arange(sk)[None, :] < kv_len[:, None])[:, None, None, :]
    if causal != "none":
        offset = 0 if causal == "top_left" else sk - sq
        visible = visible & (torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + offset)
    if bias is not None:
        s = s + bias.to(acc)
    s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(dim=-1, keepdim=True) if sk > 0 else s.new_zeros(s.shape[:-1] + (1,))
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
    e = torch.exp(s - m)
    total = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(total > 0, total, torch.ones_like(total))
    return torch.einsum("bhqk,bhkd->bhqd", p, v.to(acc)).to(q.dtype)


@attnbench.kernel(name="torch-sdpa", framework="torch", causal="top_left", features=("causal",),
                  empty_rows="zero")
def sdpa(q, k, v, *, scale, causal):
    """torch.nn.functional.scaled_dot_product_attention (is_causal, enable_gqa)."""
    import torch

    gqa = {"enable_gqa": True} if q.shape[1] != k.shape[1] else {}
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=causal, **gqa)
