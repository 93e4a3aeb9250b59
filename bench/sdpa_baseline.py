"""sdpa_baseline.py — PyTorch scaled_dot_product_attention on the dense problem of equal work
as one dilated branch (w, r=1): batch * (N / w) independent sequences of length w. Prints one
JSON line, like bench_fwd. Run on the GPU machine: python3 bench/sdpa_baseline.py --n 65536."""
import argparse
import json

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--w", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--backward", action="store_true")
    a = ap.parse_args()
    b = a.n // a.w
    shape = (b, a.heads, a.w, a.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=a.backward)
               for _ in range(3))
    def step():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
        if a.backward:
            o.backward(torch.ones_like(o))
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(a.iters):
        step()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / a.iters
    flops = 4.0 * a.head_dim * a.heads * b * a.w * a.w * (0.5 if a.causal else 1.0)
    if a.backward:
        flops *= 3.5  # forward recompute + backward, the usual FlashAttention accounting
    print(json.dumps({"bench": "sdpa" + ("_fwd_bwd" if a.backward else "_fwd"),
                      "device": torch.cuda.get_device_name(), "n": a.n, "w": a.w,
                      "ms": round(ms, 4), "effective_tflops": round(flops / ms * 1e-9, 2)}))


if __name__ == "__main__":
    main()
