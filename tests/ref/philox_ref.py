"""Independent Philox4x32-10 in numpy uint32/uint64 arithmetic, for tests/test_sampling.c.

Written from the SC'11 paper (Salmon et al., "Parallel random numbers: as easy
as 1, 2, 3", Philox-4x32: multipliers 0xD2511F53, 0xCD9E8D57, Weyl key bumps
0x9E3779B9, 0xBB67AE85, 10 rounds), vectorised over all inputs at once, and
checked here against the three Random123 known answers before anything is written.

Command (deterministic, < 1 s):
    python3 tests/ref/philox_ref.py     # writes tests/fixtures/sampling/philox_ref.txt

Output lines:
    P k0 k1 c0 c1 c2 c3 o0 o1 o2 o3      (hex) Philox4x32-10(counter c, key k) = o
    U seed seq_id position u_bits        (hex) the token draw of backends/philox.h:
        key = (seed lo, seed hi), counter = (position, seq lo, seq hi, 0),
        u = (o0 >> 8) * 2^-24 as float32, written as its bit pattern.
"""
import os
import numpy as np

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
MASK = np.uint64(0xFFFFFFFF)


def philox4x32_10(ctr, key):
    """ctr: uint32 [N, 4], key: uint32 [N, 2] -> uint32 [N, 4]."""
    x = [ctr[:, i].astype(np.uint64) for i in range(4)]
    k0, k1 = key[:, 0].copy(), key[:, 1].copy()
    with np.errstate(over="ignore"):
        for r in range(10):
            if r:
                k0 = k0 + W0
                k1 = k1 + W1
            p0 = M0 * x[0]          # < 2^64: no wrap
            p1 = M1 * x[2]
            x = [(p1 >> np.uint64(32)) ^ x[1] ^ k0.astype(np.uint64),
                 p1 & MASK,
                 (p0 >> np.uint64(32)) ^ x[3] ^ k1.astype(np.uint64),
                 p0 & MASK]
    return np.stack([v.astype(np.uint32) for v in x], axis=1)


# Random123 tests/kat_vectors, the three "philox4x32 10" lines (counter, key, expected).
KAT = [
    ([0, 0, 0, 0], [0, 0], [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]),
    ([0xffffffff] * 4, [0xffffffff] * 2, [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]),
    ([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0],
     [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]),
]


def main():
    for c, k, want in KAT:
        got = philox4x32_10(np.array([c], np.uint32), np.array([k], np.uint32))[0]
        assert [int(v) for v in got] == want, (c, k, got)
    rng = np.random.default_rng(20261202)
    n = 256
    key = rng.integers(0, 2**32, size=(n, 2), dtype=np.uint64).astype(np.uint32)
    ctr = rng.integers(0, 2**32, size=(n, 4), dtype=np.uint64).astype(np.uint32)
    ctr[:16] &= np.uint32(0xff)              # a few small counters, as positions are
    out = philox4x32_10(ctr, key)
    lines = []
    for k, c, o in zip(key, ctr, out):
        lines.append("P " + " ".join("%08x" % int(v) for v in (*k, *c, *o)))
    seeds = rng.integers(0, 2**64, size=64, dtype=np.uint64)
    seqs = rng.integers(0, 2**64, size=64, dtype=np.uint64)
    seqs[:8] = np.arange(8, dtype=np.uint64)
    pos = rng.integers(0, 40000, size=64, dtype=np.uint64).astype(np.uint32)
    key = np.stack([(seeds & MASK), seeds >> np.uint64(32)], axis=1).astype(np.uint32)
    ctr = np.stack([pos.astype(np.uint64), seqs & MASK, seqs >> np.uint64(32),
                    np.zeros(64, np.uint64)], axis=1).astype(np.uint32)
    o0 = philox4x32_10(ctr, key)[:, 0]
    u = ((o0 >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)).astype(np.float32)
    for s, q, p, ub in zip(seeds, seqs, pos, u.view(np.uint32)):
        lines.append("U %016x %016x %08x %08x" % (int(s), int(q), int(p), int(ub)))
    path = os.path.join(os.path.dirname(__file__), "..", "fixtures", "sampling", "philox_ref.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", os.path.normpath(path), len(lines), "lines")


if __name__ == "__main__":
    main()
