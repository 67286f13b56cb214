#!/usr/bin/env python3
"""FP8 (E4M3, per-tensor scales) and BF16 GEMV baselines through PyTorch, the
same shapes and timing rules as bench/bench_quant.cu (K = 4096, N = 14336,
M = 1..64; CUDA events, median of REPS after warm-up, L2 flushed before each).
torch._scaled_mm wants M a multiple of 16: smaller M run as M = 16 (noted).

    python3 bench/bench_fp8_torch.py [REPS]
"""
import statistics
import sys

import torch

N, K, MS = 14336, 4096, (1, 2, 4, 8, 16, 32, 64)


def median_us(fn, reps, flush):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        flush.fill_(i & 0xFF)
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        fn()
        t1.record()
        t1.synchronize()
        times.append(t0.elapsed_time(t1) * 1e3)
    return statistics.median(times)


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    dev = "cuda"
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    w = torch.randn(N, K, device=dev)
    wb, w8 = w.to(torch.bfloat16), (w * 64).to(torch.float8_e4m3fn)
    one = torch.tensor(1.0 / 64, device=dev)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; median of {reps}, L2 flushed")
    print("| M | torch BF16 us | BF16 TB/s | torch FP8 us | FP8 weight TB/s | BF16/FP8 |")
    print("|---|---|---|---|---|---|")
    for m in MS:
        a = torch.randn(m, K, device=dev)
        ab = a.to(torch.bfloat16)
        mp = max(16, (m + 15) // 16 * 16)
        a8 = (torch.randn(mp, K, device=dev) * 64).to(torch.float8_e4m3fn)
        tb = median_us(lambda: torch.mm(ab, wb.t()), reps, flush)
        t8 = median_us(lambda: torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one,
                                                out_dtype=torch.bfloat16), reps, flush)
        note = "" if mp == m else f" (M={mp})"
        print(f"| {m} | {tb:.1f} | {2 * N * K / tb / 1e6:.2f} | {t8:.1f}{note} | "
              f"{N * K / t8 / 1e6:.2f} | {tb / t8:.2f}x |")


if __name__ == "__main__":
    main()
