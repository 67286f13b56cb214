"""The sampling rule of backends/sampling.c, re-implemented in numpy float32
from its written description (steps 1-10 in sampling.c's header; exp and log
as written in backends/exact_math.h), for a bit-exact fixture.

numpy's float32 +, -, *, / are correctly rounded and never fused, so following
the documented order gives the same bits as the C code (and a CUDA kernel);
tests/test_sampling.c requires equal tokens and equal log-prob bits.

Command (deterministic, ~10 s):
    python3 tests/ref/sampling_ref.py   # writes tests/fixtures/sampling/sampling_ref.bin

Layout (little-endian): u32 magic 0x51445350 ("PSDQ"), u32 number of cases; per case:
    i32 V, f32 temperature, i32 top_k, f32 top_p, u64 seed, i32 draws,
    f32 logits[V], then per draw: u64 seq_id, u32 position, i32 token,
    f32 logprob, f32 logprob_kept.
"""
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from philox_ref import philox4x32_10  # noqa: E402

F = np.float32
LANES = 1024
LOG2E, LN2_HI, LN2_LO = F(1.44269504088896341), F(0.693145751953125), F(1.428606765330187045e-06)


def exp2i(n):
    return np.array((n + 127) << 23, dtype=np.uint32).view(F)


def expf(x):
    """qd_expf over a float32 array of finite values."""
    x = np.asarray(x, F)
    fn = np.floor(x * LOG2E + F(0.5)).astype(F)
    n = np.clip(fn.astype(np.int64), -200, 200)
    r = (x - fn * LN2_HI) - fn * LN2_LO
    p = F(1) / F(5040)
    for c in (F(1) / F(720), F(1) / F(120), F(1) / F(24), F(1) / F(6), F(0.5)):
        p = p * r + c
    er = F(1) + (r + (r * r) * p)
    with np.errstate(over="ignore"):  # every branch is computed, one is kept
        mid = er * exp2i(np.clip(n, -126, 127))
        low = (er * exp2i(np.clip(n + 126, -126, 127))) * exp2i(-126)
        high = (er * exp2i(127)) * F(2)
    out = np.where(n > 127, high, np.where(n < -126, low, mid)).astype(F)
    out = np.where(x > F(89), F(np.inf), out)
    return np.where(x < F(-104), F(0), out).astype(F)


def logf(x):
    """qd_logf of one positive finite float32 (the only inputs here: sums >= 1)."""
    x = F(x)
    u = int(np.array(x, F).view(np.uint32))
    e = 0
    if u < 0x00800000:
        u = int(np.array(x * F(33554432), F).view(np.uint32))
        e = -25
    e += (u >> 23) - 127
    mu = (u & 0x7FFFFF) | 0x3F800000
    if mu > 0x3FB504F3:
        mu -= 0x00800000
        e += 1
    f = np.array(mu, np.uint32).view(F) - F(1)
    s = f / (F(2) + f)
    z = s * s
    R = F(2) / F(9)
    for c in (F(2) / F(7), F(2) / F(5), F(2) / F(3)):
        R = R * z + c
    R = R * z
    hfsq = (F(0.5) * f) * f
    fe = F(e)
    return F(fe * LN2_HI - ((hfsq - (s * (hfsq + R) + fe * LN2_LO)) - f))


def tree(w):
    """Step 4: lane sums in ascending token order, then the pairwise levels."""
    lane = np.zeros(LANES, F)
    for start in range(0, len(w), LANES):
        chunk = w[start:start + LANES]
        lane[:len(chunk)] = lane[:len(chunk)] + chunk
    levels = {LANES: lane}
    n = LANES
    while n > 1:
        levels[n // 2] = (levels[n][:n // 2] + levels[n][n // 2:n]).astype(F)
        n //= 2
    return levels


def draw_u(seed, seq, pos):
    key = np.array([[seed & 0xFFFFFFFF, seed >> 32]], np.uint32)
    ctr = np.array([[pos, seq & 0xFFFFFFFF, seq >> 32, 0]], np.uint32)
    o0 = int(philox4x32_10(ctr, key)[0, 0])
    return F(o0 >> 8) * F(2.0 ** -24)


def sample(x, T, top_k, top_p, seed, seq, pos):
    V = len(x)
    greedy = T == 0
    s = (x / F(1 if greedy else T)).astype(F)
    m = F(s.max() + F(0))
    d = (s - m).astype(F)
    e = expf(d)
    lvZ = tree(e)
    logZ = logf(lvZ[1][0])
    if greedy:
        t = int(np.argmax(s))
        return t, F(d[t] - logZ), F(0)
    order = np.lexsort((np.arange(V), -s.astype(np.float64)))  # s descending, id ascending
    K = V if top_k <= 0 or top_k >= V else top_k
    kept = order[:K]
    lv = lvZ
    if K < V:
        w = np.zeros(V, F)
        w[kept] = e[kept]
        lv = tree(w)
    if top_p < 1:
        theta = F(F(top_p) * lv[1][0])
        c, n = F(0), K
        for r in range(K):
            c = F(c + e[order[r]])
            if c >= theta:
                n = r + 1
                break
        kept = order[:n]
        w = np.zeros(V, F)
        w[kept] = e[kept]
        lv = tree(w)
    w = np.zeros(V, F)
    w[kept] = e[kept]
    Zk = lv[1][0]
    r = F(draw_u(seed, seq, pos) * Zk)
    j, n = 0, 2
    while n <= LANES:
        a, b = lv[n][j], lv[n][j + n // 2]
        if not (r < a or b == F(0)):
            r = F(r - a)
            j += n // 2
        n *= 2
    c, t, last = F(0), -1, -1
    for i in range(j, V, LANES):
        c = F(c + w[i])
        if c > r:
            t = i
            break
        if w[i] > 0:
            last = i
    t = t if t >= 0 else last
    return t, F(d[t] - logZ), F(d[t] - logf(Zk))


# (V, logit scale, ties, temperature, top_k, top_p)
CASES = [
    (5, 1.0, False, 1.0, 0, 1.0),
    (8, 2.0, True, 0.7, 3, 1.0),
    (64, 1.5, False, 1.0, 0, 0.9),
    (64, 1.5, True, 0.0, 0, 1.0),
    (300, 3.0, False, 1.3, 20, 0.8),
    (1000, 2.0, True, 0.9, 0, 0.95),
    (1500, 2.5, False, 1.0, 0, 1.0),
    (2500, 2.0, False, 0.6, 100, 1.0),
    (2500, 1.0, True, 1.1, 0, 0.5),
    (3000, 4.0, False, 2.0, 500, 0.99),
]


def main():
    rng = np.random.default_rng(31337)
    out = [struct.pack("<II", 0x51445350, len(CASES))]
    for V, scale, ties, T, k, p in CASES:
        x = (rng.standard_normal(V) * scale).astype(F)
        if ties:
            x = (np.round(x * F(4)) / F(4)).astype(F)
        seed = int(rng.integers(0, 2**63))
        draws = 24
        out.append(struct.pack("<ififQi", V, T, k, p, seed, draws) + x.tobytes())
        for dnum in range(draws):
            seq = int(rng.integers(0, 2**63)) if dnum % 2 else dnum
            pos = int(rng.integers(0, 2**31))
            t, lp, lpk = sample(x, F(T), k, F(p), seed, seq, pos)
            out.append(struct.pack("<QIiff", seq, pos, t, lp, lpk))
    path = os.path.join(os.path.dirname(__file__), "..", "fixtures", "sampling", "sampling_ref.bin")
    with open(path, "wb") as f:
        f.write(b"".join(out))
    print("wrote", os.path.normpath(path), sum(len(b) for b in out), "bytes")


if __name__ == "__main__":
    main()
