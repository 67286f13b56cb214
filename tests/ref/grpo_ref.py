#!/usr/bin/env python3
"""Reference GRPO/DAPO numbers from numpy, written the way verl and DAPO
describe them (vectorized, without any code from orchestrator/):

  advantages   (r - mean) / (np.std(ddof=1) + eps)   (verl: torch.std, unbiased)
  pg_losses    max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))
  tis weight   min(exp(old - rollout), C); masked: exp(old - rollout) * (that <= C)
  kl (k3)      exp(ref - logp) - (ref - logp) - 1
  gap          mean/max |lt - lr|, mean(r - 1 - log r), np.corrcoef of the probabilities

The gradient coefficient per token is d(loss)/d(logp) by central differences
in float64 at each token (h = 1e-6), not by the analytic formula.

Deterministic (fixed seed): re-running it reproduces the committed fixture.

    python3 tests/ref/grpo_ref.py [OUT]   (default tests/fixtures/grpo_ref.json)
"""
import json
import os
import sys

import numpy as np

B, G, T = 8, 4, 6
CLIP_LOW, CLIP_HIGH, CAP, EPS, KL_COEF = 0.2, 0.28, 1.5, 1e-6, 0.1


def advantages(r):
    g = r.reshape(-1, G)
    mean = g.mean(axis=1, keepdims=True)
    std = g.std(axis=1, ddof=1, keepdims=True)
    return ((g - mean) / (std + EPS)).reshape(-1)


def loss(logp, old, roll, ref, adv, mask, agg, tis, kl_coef):
    ratio = np.exp(logp - old)
    a = adv[:, None]
    pg = np.maximum(-a * ratio, -a * np.clip(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH))
    rho = np.exp(old - roll)
    if tis == "tis":
        pg = pg * np.minimum(rho, CAP)
    elif tis == "masked":
        pg = pg * rho * (rho <= CAP)
    x = ref - logp
    tok = pg + kl_coef * (np.exp(x) - x - 1)
    m = mask.astype(np.float64)
    if agg == "token_mean":
        return (tok * m).sum() / m.sum()
    if agg == "seq_mean_token_sum":
        return (tok * m).sum(axis=1).mean()
    return ((tok * m).sum(axis=1) / m.sum(axis=1)).mean()


def clip_fraction(logp, old, adv, mask):
    ratio = np.exp(logp - old)
    a = adv[:, None]
    clipped = -a * np.clip(ratio, 1 - CLIP_LOW, 1 + CLIP_HIGH) > -a * ratio
    return float(clipped[mask.astype(bool)].mean())


def grad(args, agg, tis, kl_coef, h=1e-6):
    logp = args[0]
    g = np.zeros_like(logp)
    for i in np.ndindex(logp.shape):
        if not args[5][i]:
            continue
        up, dn = logp.copy(), logp.copy()
        up[i] += h
        dn[i] -= h
        g[i] = (loss(up, *args[1:], agg, tis, kl_coef) - loss(dn, *args[1:], agg, tis, kl_coef)) / (2 * h)
    return g


def gap(lt, lr, mask):
    k = mask.astype(bool)
    d = (lt - lr)[k]
    r = np.exp(d)
    return {"mean_abs": float(np.abs(d).mean()), "max_abs": float(np.abs(d).max()),
            "k3_kl": float((r - 1 - np.log(r)).mean()),
            "pearson": float(np.corrcoef(np.exp(lt[k]), np.exp(lr[k]))[0, 1])}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../fixtures/grpo_ref.json")
    rng = np.random.default_rng(20260705)
    f32 = lambda a: np.asarray(a, dtype=np.float32)
    reward = f32(rng.integers(0, 2, B) + rng.normal(0, 0.1, B).round(2))
    old = f32(-rng.uniform(0.05, 4, (B, T)))
    logp = f32(old + rng.uniform(-0.4, 0.4, (B, T)))
    roll = f32(old + rng.normal(0, 0.5, (B, T)))
    ref = f32(old + rng.normal(0, 0.3, (B, T)))
    lens = rng.integers(1, T + 1, B)
    mask = (np.arange(T)[None, :] < lens[:, None]).astype(np.uint8)
    adv64 = advantages(reward.astype(np.float64))
    adv = f32(adv64)
    d = lambda a: a.astype(np.float64)
    args = (d(logp), d(old), d(roll), d(ref), d(adv), mask)
    cases = []
    for agg in ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean"):
        for tis in ("none", "tis", "masked"):
            for kl in (0.0, KL_COEF):
                cases.append({"agg": agg, "tis": tis, "kl_coef": kl,
                              "loss": float(loss(*args, agg, tis, kl)),
                              "coef": grad(args, agg, tis, kl).reshape(-1).tolist()})
    doc = {"B": B, "G": G, "T": T, "clip_low": CLIP_LOW, "clip_high": CLIP_HIGH, "tis_cap": CAP, "adv_eps": EPS,
           "reward": reward.tolist(), "adv": adv64.tolist(),
           "logp": logp.reshape(-1).tolist(), "logp_old": old.reshape(-1).tolist(),
           "logp_rollout": roll.reshape(-1).tolist(), "logp_ref": ref.reshape(-1).tolist(),
           "mask": mask.reshape(-1).tolist(), "clip_frac": clip_fraction(d(logp), d(old), d(adv), mask),
           "gap": gap(d(logp), d(roll), mask), "cases": cases}
    with open(out, "w") as fh:
        json.dump(doc, fh, indent=None, separators=(",", ":"))
        fh.write("\n")
    print(out, len(cases), "cases, numpy", np.__version__)


if __name__ == "__main__":
    main()
