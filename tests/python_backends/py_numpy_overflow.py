"""py-numpy's backward where dO V^T overflows float64 and the gradients do not
(V near float64's largest; the fuzzer's seed 58061 found NaN gradients there).

The gradients are linear in V's scale: with V times 2^s they must be exactly
2^s times those of V (dQ, dK) and the same (dV), finite, and dO V^T must
really overflow, or the check proves nothing.
    python3 py_numpy_overflow.py <impls/python/backends>
"""

import sys

import numpy as np

sys.path.insert(0, sys.argv[1])
import py_numpy  # noqa: E402

rng = np.random.default_rng(7)
# 64 keys of 64 values: the sums of dO V^T overflow, the weights (about 1/64)
# bring dS and the gradients back under float64's largest.
Q = rng.standard_normal((1, 2, 3, 8))
K = rng.standard_normal((1, 2, 64, 8))
V = rng.standard_normal((1, 2, 64, 64))
dO = 4 * rng.standard_normal((1, 2, 3, 64))
s = 1021 - int(np.frexp(np.max(np.abs(V)))[1])  # V * 2^s: its largest just below 2^1021
big = np.ldexp(V, s)
assert np.all(np.isfinite(big))
with np.errstate(over="ignore"):
    assert not np.all(np.isfinite(dO @ big.transpose(0, 1, 3, 2))), "dO V^T must overflow for this check to mean anything"

mask = np.ones((1, 2, 3, 64), dtype=np.uint8)
mask[0, 1, 0, 40:] = 0  # hidden keys pass nothing back
for m in (None, mask):
    dQ, dK, dV = py_numpy.scaled_dot_product_attention_backward(Q, K, big, m, dO)
    dQ0, dK0, dV0 = py_numpy.scaled_dot_product_attention_backward(Q, K, V, m, dO)
    for name, got in (("dQ", dQ), ("dK", dK), ("dV", dV)):
        assert np.all(np.isfinite(got)), f"{name} not finite: {got}"
    assert np.array_equal(dQ, np.ldexp(dQ0, s)), "dQ is not 2^s times V's"
    assert np.array_equal(dK, np.ldexp(dK0, s)), "dK is not 2^s times V's"
    assert np.array_equal(dV, dV0), "dV moved with V's scale"
print("py-numpy backward: finite and exact where dO V^T overflows")
