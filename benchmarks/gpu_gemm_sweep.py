"""Sweep tile configurations of passctl's Triton GEMM kernel (``targets/tvm/triton_kernels.py``)
on BERT-base's four GEMM shapes (batch 8 x seq 128 = 1024 rows), next to torch.matmul (cuBLAS).

Run on a GPU machine with triton and torch (no TVM needed):

    python3 benchmarks/gpu_gemm_sweep.py [--precision ieee] [--dtype float32]

Prints, per shape, every configuration's time (``triton.testing.do_bench`` median, ms) and
TFLOP/s (2*M*N*K / time), the best first, and cuBLAS's time for the same product (with TF32 off
for float32). The candidates the emitter tunes over are marked ``*``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from passctl_path import ensure_passctl_importable  # noqa: E402

SHAPES = [  # (M, K, N): BERT-base b8 s128, each timed with its bias epilogue only
    (1024, 768, 2304),   # packed Q/K/V projection
    (1024, 768, 768),    # attention output (+ residual in the model)
    (1024, 768, 3072),   # FFN up (+ GELU in the model)
    (1024, 3072, 768),   # FFN down (+ residual in the model)
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="ieee", help="tl.dot input_precision for float32")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    ensure_passctl_importable()
    import torch
    import triton
    import triton.testing

    from passctl.targets.tvm.triton_kernels import gemm_kernel
    from passctl.targets.tvm.triton_specs import _gemm_candidates

    torch.backends.cuda.matmul.allow_tf32 = False
    dt = getattr(torch, args.dtype)
    precision = args.precision if args.dtype == "float32" else "none"
    ours = {tuple(c[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages"))
            for c in _gemm_candidates(args.dtype, precision)}
    grid = sorted(set(itertools.product((32, 64, 128, 256), (32, 64, 128), (8, 16, 32), (4, 8),
                                        (3,))) | ours)
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{args.dtype} precision {precision}", flush=True)
    total_best = total_ours = total_cublas = 0.0
    for m, k, n in SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=dt)
        b = torch.randn(k, n, device="cuda", dtype=dt)
        bias = torch.randn(n, device="cuda", dtype=dt)
        out = torch.empty(m, n, device="cuda", dtype=dt)
        ref = a.double() @ b.double() + bias.double()
        flops = 2.0 * m * n * k
        results = []
        for bm, bn, bk, w, s in grid:
            if (bm * bn) // (w * 32) > 128 or bm * bn < 32 * 64:
                continue
            args_ = dict(M=m, N=n, K=k, stride_am=k, stride_ak=1, stride_bk=n, stride_bn=1,
                         stride_ab=0, stride_bb=0, HAS_BIAS=True, ACT=0, HAS_RES=False,
                         PRECISION=precision, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8)
            grid_ = (triton.cdiv(m, bm) * triton.cdiv(n, bn), 1)
            try:
                run = lambda: gemm_kernel[grid_](a, b, bias, out, out, **args_,  # noqa: E731
                                                 num_warps=w, num_stages=s)
                run()
                torch.cuda.synchronize()
                err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
                ms = triton.testing.do_bench(run, warmup=10, rep=40)
            except Exception:  # noqa: BLE001 (does not fit the shared memory / compile)
                continue
            results.append((ms, (bm, bn, bk, w, s), err))
        results.sort()
        cub = triton.testing.do_bench(lambda: torch.addmm(bias, a, b), warmup=10, rep=40)
        best_ours = min((x for x in results if x[1] in ours), default=(float("nan"),))[0]
        total_best += results[0][0]
        total_ours += best_ours
        total_cublas += cub
        print(f"\nM={m} K={k} N={n}: cuBLAS addmm {cub * 1e3:.1f} us ({flops / cub / 1e9:.1f} TFLOP/s); "
              f"best of the emitter's candidates {best_ours * 1e3:.1f} us; {len(results)} configs ran",
              flush=True)
        for ms, cfg, err in results[:args.top]:
            mark = "*" if cfg in ours else " "
            print(f"  {mark} {cfg}: {ms * 1e3:7.1f} us {flops / ms / 1e9:6.1f} TFLOP/s  rel err {err:.1e}",
                  flush=True)
    print(f"\nsum over the 4 shapes (x12 layers = BERT's GEMM time): best {total_best * 1e3:.1f} us, "
          f"emitter candidates {total_ours * 1e3:.1f} us, cuBLAS {total_cublas * 1e3:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
