// FlashAttention-2's backward pass on the CPU (docs/format/v3.md), shared by
// the blocked and streaming backends, on the same micro-kernels as their
// forward (Kernels::qk_f32 and pv_f32, dispatched at run time):
//
//   D = rowsum(dO o O) once per row, from the forward's own output;
//   per key block of 64 (K, V packed once, dK and dV accumulated in place),
//   per query tile that sees it: S = Q K^T recomputed, P = exp2(S - lse)
//   from the forward's lse (no S x S matrix), dP = dO V^T, dS = P (dP - D)
//   times the softcap's derivative, dV += P^T dO, dK += dS^T Q, dQ += dS K.
//
// Deterministic without atomics: every key block belongs to one task, which
// writes its dK and dV; each task adds its dQ terms to partial sums of its own
// (one per chunk of key blocks), summed in chunk order at the end. The chunks
// are fixed by the problem, never by the thread count, so the gradients are
// bitwise identical at any number of threads. GQA sums over a group inside
// the tile (its rows hold every query head of one kv head). A trainable bias
// makes each task own a chunk of keys across every (batch, kv head), so its
// dbias sums stay in one task too.
//
// Extra memory: O(seq): Q, dO, D and lse in float32, the dQ partials, and per
// thread a key block's K, V, dK, dV and one tile's scores. bfloat16 cases
// multiply in bfloat16 pairs where the kernel set takes any row count
// (AVX-512, portable), on R(P) and R(dS), and a tile holding a subnormal P or
// dS in float32; float16 (and bfloat16 under AMX) is widened to float32.
#pragma once

#include <cstdint>
#include <memory>

#include "attnbench/backend.hpp"

namespace attn::cpu {

// A dense problem (not packed, not paged) whose io.forward.lse is set;
// max_tile_rows is the query tile's height (query heads of a group times
// positions), as for the backend's forward. forward_in_place: the forward
// computed Q K^T with Kernels::qk_direct (decode tiles of streaming and
// blocked), so the float32 backward recomputes S with it too, in the same
// order.
std::unique_ptr<BackwardPlan> make_flash_backward_plan(const Problem& p, const BackwardIO& io,
                                                       const RunOptions& options, std::int64_t max_tile_rows,
                                                       bool forward_in_place = false);

}  // namespace attn::cpu
