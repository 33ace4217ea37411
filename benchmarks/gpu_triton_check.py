"""GPU numerics check of the TVM emitter's Triton kernels (targets/tvm/triton_dispatch.py), run on
the GPU machine: small ONNX graphs through the h200 TVM artifact vs numpy in float64.

    export PYTHONPATH=/tmp/tvmsite:$PWD && python3 benchmarks/gpu_triton_check.py

Cases (each once with CUDA graphs, once without):
- GEMM epilogues: MatMul + bias Add (+ Gelu / Relu) (+ residual Add), float32 (ieee and tf32) and
  float16, M not a multiple of any tile, N = 3 * 128, K = 200 (not a multiple of BLOCK_K);
  and a MatMul whose weight is transposed in the graph (B^T read in place).
- passctl::Attention: additive / boolean mask / causal / GQA (H 8, KV 2) / head size 80 (not a power
  of two), float16 and float32, S != T.

Prints one line per case with max |got - want| / max |want| and PASS / FAIL against its tolerance
(fp32 ieee and tf32x3 1e-5, tf32 5e-3, fp16 5e-3); exits 1 when any case fails. Tile configurations are
not tuned here (numerics only); ``--filter REGEX`` runs a subset.
"""

from __future__ import annotations

import math
import sys
import traceback

import numpy as np


def gemm_graph(dtype, act, residual, transposed, m=300, k=200, n=384, seed=0):
    """ONNX y = act(x @ W + b) (+ r); returns (model, feeds, numpy float64 reference)."""
    from onnx import TensorProto, helper, numpy_helper

    tp = TensorProto.FLOAT if dtype == "float32" else TensorProto.FLOAT16
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, m // 2, k)).astype(dtype)
    w = (rng.standard_normal((n, k) if transposed else (k, n)) / math.sqrt(k)).astype(dtype)
    b = rng.standard_normal(n).astype(dtype)
    r = rng.standard_normal((2, m // 2, n)).astype(dtype)
    nodes, inits = [], [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    wname = "w"
    if transposed:
        nodes.append(helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]))
        wname = "wt"
    nodes += [helper.make_node("MatMul", ["x", wname], ["mm"]),
              helper.make_node("Add", ["mm", "b"], ["h"])]
    last = "h"
    if act == "gelu":
        nodes.append(helper.make_node("Gelu", [last], ["g"]))
        last = "g"
    elif act == "relu":
        nodes.append(helper.make_node("Relu", [last], ["g"]))
        last = "g"
    inputs = [helper.make_tensor_value_info("x", tp, list(x.shape))]
    feeds = {"x": x}
    if residual:
        nodes.append(helper.make_node("Add", [last, "r"], ["y"]))
        inputs.append(helper.make_tensor_value_info("r", tp, list(r.shape)))
        feeds["r"] = r
    else:
        nodes.append(helper.make_node("Identity", [last], ["y"]))
    graph = helper.make_graph(nodes, "gemm", inputs,
                              [helper.make_tensor_value_info("y", tp, [2, m // 2, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    want = x64 @ (w64.T if transposed else w64) + b.astype(np.float64)
    if act == "gelu":
        want = 0.5 * want * (1 + np.vectorize(math.erf)(want / math.sqrt(2)))
    elif act == "relu":
        want = np.maximum(want, 0)
    if residual:
        want = want + r.astype(np.float64)
    return model, feeds, want


def attention_graph(dtype, mask, causal, h=8, hkv=8, s=200, t=200, d=64, seed=0):
    """One passctl::Attention node; returns (model, feeds, numpy float64 reference)."""
    from onnx import TensorProto, helper

    tp = TensorProto.FLOAT if dtype == "float32" else TensorProto.FLOAT16
    rng = np.random.default_rng(seed)
    feeds = {"q": rng.standard_normal((2, h, s, d)).astype(dtype),
             "k": rng.standard_normal((2, hkv, t, d)).astype(dtype),
             "v": rng.standard_normal((2, hkv, t, d)).astype(dtype)}
    inputs = [helper.make_tensor_value_info(n, tp, list(feeds[n].shape)) for n in "qkv"]
    names = ["q", "k", "v"]
    bias = np.zeros((2, 1, s, t))
    if mask == "additive":
        feeds["m"] = np.where(rng.random((2, 1, 1, t)) < 0.3, -1e4, 0).astype(dtype)
        inputs.append(helper.make_tensor_value_info("m", tp, [2, 1, 1, t]))
        bias = bias + feeds["m"].astype(np.float64)
        names.append("m")
        # a key-padding mask [B, 1, 1, T] broadcasts over queries: the kernel reads stride 0
    elif mask == "boolean":
        feeds["m"] = rng.random((1, 1, s, t)) < 0.7
        feeds["m"][..., 0] = True
        inputs.append(helper.make_tensor_value_info("m", TensorProto.BOOL, [1, 1, s, t]))
        bias = bias + np.where(feeds["m"], 0, -np.inf)
        names.append("m")
    if causal:
        bias = bias + np.triu(np.full((s, t), -np.inf), 1)
    scale = 1 / math.sqrt(d)
    node = helper.make_node("Attention", names, ["y"], domain="passctl", name="attn", scale=scale,
                            mask_kind=mask, is_causal=int(causal), num_heads=h, kv_num_heads=hkv,
                            softmax_precision=1, nan_to_zero=0)
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("y", tp, [2, h, s, d])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("passctl", 1)])
    q, k, v = (feeds[n].astype(np.float64) for n in "qkv")
    k, v = np.repeat(k, h // hkv, axis=1), np.repeat(v, h // hkv, axis=1)
    scores = scale * q @ k.transpose(0, 1, 3, 2) + bias
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return model, feeds, (p / p.sum(-1, keepdims=True)) @ v


def parallel_gemm_graph(dtype, seed=0, m=256, k=192, n=320):
    """Three MatMul + bias Add branches on one input (an attention block's Q, K, V projections),
    which the emitter packs into one GEMM + split; returns (model, feeds, reference)."""
    from onnx import TensorProto, helper, numpy_helper

    tp = TensorProto.FLOAT if dtype == "float32" else TensorProto.FLOAT16
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, m // 2, k)).astype(dtype)
    nodes, inits, outs, want = [], [], [], []
    for i in range(3):
        w = (rng.standard_normal((k, n)) / math.sqrt(k)).astype(dtype)
        b = rng.standard_normal(n).astype(dtype)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"y{i}"])]
        outs.append(helper.make_tensor_value_info(f"y{i}", tp, [2, m // 2, n]))
        want.append(x.astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64))
    nodes.append(helper.make_node("Concat", ["y0", "y1", "y2"], ["y"], axis=-1))
    graph = helper.make_graph(nodes, "qkv", [helper.make_tensor_value_info("x", tp, list(x.shape))],
                              [helper.make_tensor_value_info("y", tp, [2, m // 2, 3 * n])], inits)
    return (helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), {"x": x},
            np.concatenate(want, axis=-1))


def bshd_attention_graph(dtype, seed=0, b=2, s=160, h=4, d=64):
    """passctl::Attention on Transpose(0, 2, 1, 3) of [B, S, H, D] inputs (what exports write
    after the head split): the kernel reads the [B, S, H, D] tensors in place."""
    from onnx import TensorProto, helper

    tp = TensorProto.FLOAT if dtype == "float32" else TensorProto.FLOAT16
    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal((b, s, h, d)).astype(dtype) for n in "qkv"}
    nodes = [helper.make_node("Transpose", [n], [n + "t"], perm=[0, 2, 1, 3]) for n in "qkv"]
    nodes.append(helper.make_node("Attention", ["qt", "kt", "vt"], ["y"], domain="passctl",
                                  name="attn", scale=0.125, mask_kind="none", is_causal=1,
                                  num_heads=h, kv_num_heads=h, softmax_precision=1, nan_to_zero=0))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, tp, [b, s, h, d])
                                           for n in "qkv"],
                              [helper.make_tensor_value_info("y", tp, [b, h, s, d])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("passctl", 1)])
    q, k, v = (feeds[n].astype(np.float64).transpose(0, 2, 1, 3) for n in "qkv")
    scores = 0.125 * q @ k.transpose(0, 1, 3, 2) + np.triu(np.full((s, s), -np.inf), 1)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return model, feeds, (p / p.sum(-1, keepdims=True)) @ v


def run_case(name, model_proto, feeds, want, tol, **emitter):
    from passctl.ir import from_onnx
    from passctl.targets import get_target
    from passctl.targets.tvm import TvmEmitter, load_artifact
    from passctl_path import scratch_dir  # benchmarks/ is sys.path[0] for a script

    folder = scratch_dir("triton-check-") + "/a"
    TvmEmitter(self_check=False, kernels="triton", tensorize=False, tune=False, **emitter).emit(
        from_onnx(model_proto), get_target("h200"), folder)
    art = load_artifact(folder)
    triton = art.manifest.get("triton", {})
    got = np.asarray(art.run(feeds)["y"], np.float64)
    got2 = np.asarray(art.run(feeds)["y"], np.float64)  # a second run (the CUDA graph replays)
    err = max(float(np.max(np.abs(got - want))), float(np.max(np.abs(got2 - want))))
    rel = err / float(np.max(np.abs(want)))
    ok = rel <= tol and not np.isnan(got).any()
    kinds = ", ".join(s["what"] for s in triton.get("specializations", []))
    print(f"{'PASS' if ok else 'FAIL'} {name}: rel err {rel:.2e} (tol {tol:g}); {kinds}", flush=True)
    return ok


def main() -> int:
    import argparse
    import re

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filter", default="", help="run only the cases whose name matches this regex")
    args = parser.parse_args()
    from passctl_path import ensure_passctl_importable  # benchmarks/ is sys.path[0] for a script

    ensure_passctl_importable()
    cases = []
    for graph in (True, False):
        tag = "cuda graph" if graph else "no cuda graph"
        for dtype, precision, tol in (("float32", "ieee", 1e-5), ("float32", "tf32", 5e-3),
                                      ("float32", "tf32x3", 1e-5), ("float16", "ieee", 5e-3)):
            for act, residual, transposed in (("", False, False), ("gelu", False, False),
                                              ("relu", True, False), ("", True, True)):
                name = (f"gemm {dtype} {precision if dtype == 'float32' else ''} {act or 'bias'}"
                        f"{' +res' if residual else ''}{' W^T' if transposed else ''} [{tag}]")
                cases.append((name, lambda d=dtype, a=act, r=residual, t=transposed:
                               gemm_graph(d, a, r, t), tol,
                               {"fp32_precision": precision, "cuda_graph": graph}))
        for dtype, tol in (() if not graph else (("float16", 5e-3), ("float32", 1e-4))):
            for mask, causal, hkv, d, t in (("none", False, 8, 64, 200), ("additive", False, 8, 64, 200),
                                            ("boolean", False, 8, 64, 200), ("none", True, 2, 64, 200),
                                            ("none", False, 2, 80, 333)):
                name = f"attention {dtype} mask={mask} causal={causal} H8/KV{hkv} D{d} T{t} [{tag}]"
                cases.append((name, lambda d_=dtype, m=mask, c=causal, kv=hkv, dd=d, tt=t:
                              attention_graph(d_, m, c, hkv=kv, d=dd, t=tt), tol,
                              {"cuda_graph": graph}))
    for dtype, tol in (("float32", 1e-5), ("float16", 5e-3)):
        cases.append((f"parallel gemms (Q/K/V packing) {dtype}", lambda d=dtype: parallel_gemm_graph(d),
                      tol, {}))
        cases.append((f"attention {dtype} causal, BSHD inputs read in place",
                      lambda d=dtype: bshd_attention_graph(d), tol, {}))
    cases = [c for c in cases if re.search(args.filter, c[0])]
    failed = 0
    for name, make, tol, emitter in cases:
        try:
            model, feeds, want = make()
            failed += not run_case(name, model, feeds, want, tol, **emitter)
        except Exception as e:  # noqa: BLE001
            failed += 1
            traceback.print_exc(limit=3)
            print(f"FAIL {name}: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[-1][:200]}",
                  flush=True)
    print(f"{len(cases) - failed}/{len(cases)} passed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
