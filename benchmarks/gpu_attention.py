"""H200: attention substitution through the TVM emitter vs unfused, with torch eager/sdpa in the same run.

Run on the GPU machine (see ../shared/GPU.md), from the repository root::

    bash .gpu/b/install.sh && export PYTHONPATH=/tmp/tvmsite:$PWD && python3 benchmarks/gpu_attention.py

Cases (fp16, CUDA events: warm-up, then the median of ``--iters`` timed calls, each call bracketed by
events on torch's default stream, which is also the stream TVM's runtime launches on; a wall-clock
median with a device synchronization is printed beside it as a cross-check):

1. ``attention`` B8 H16 S4096 D64: q, k, v ~ N(0, 1) in [B, H, S, D].
   - ``torch unfused``: ``softmax(q @ k^T * d^-0.5) @ v`` in torch fp16 ops;
   - ``torch sdpa``: ``F.scaled_dot_product_attention`` (torch's flash kernel);
   - ``tvm unfused``: that decomposed graph as ONNX -> passctl ``lower-tvm`` -> TVM emitter (h200)
     with TVM's DLight kernels only (``kernels=tvm``);
   - ``tvm substituted``: passctl ``flash-attn`` (-> ``passctl::Attention``) -> TVM emitter with
     ``kernels=triton``: the Triton FlashAttention-2 kernel embedded in the library.
2. ``bert-base`` batch 8, sequence 512, ``input_ids`` only (full-length sequences, no mask):
   transformers ``BertModel(BertConfig())`` with random weights plus N(0, 0.02) noise, fp16 on CUDA.
   - ``torch eager`` / ``torch sdpa`` (``attn_implementation``);
   - ``tvm unfused``: legacy ONNX export (opset 17, static shapes, eager attention) ->
     ``cleanup,lower-tvm``, DLight kernels only;
   - ``tvm unfused (Triton GEMMs)``: ``cleanup,fuse,lower-tvm`` with Triton GEMMs;
   - ``tvm substituted``: ``cleanup,flash-attn,lower-tvm`` with Triton kernels;
   - ``tvm fuse+substituted``: ``cleanup,fuse,flash-attn,lower-tvm`` (LayerNorm/GELU too).

Numerics: every variant against an fp32 torch reference on the GPU (max abs error, and max abs error
over max abs reference). Each variant is wrapped in try/except: a failure prints one line and the
table shows it. Results: stdout (table last) and ``$OUT/gpu_attention.json`` when ``$OUT`` is set.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, List, Optional

from passctl_path import ensure_passctl_importable  # noqa: E402

ensure_passctl_importable()

ROWS: List[Dict] = []


def _log(msg: str) -> None:
    print(msg, flush=True)


def _record(case: str, variant: str, fn: Callable[[], Dict]) -> None:
    """Run one variant; store its row (or its error) in ROWS."""
    start = time.perf_counter()
    try:
        row = fn()
        row.update(case=case, variant=variant)
    except Exception as e:  # one variant failing must not stop the others
        first = (str(e).strip().splitlines() or [type(e).__name__])[-1][:300]
        row = {"case": case, "variant": variant, "error": f"{type(e).__name__}: {first}"}
        traceback.print_exc(limit=4)
    row["seconds"] = round(time.perf_counter() - start, 1)
    ROWS.append(row)
    _log(f"[{case}] {variant}: " + json.dumps({k: v for k, v in row.items() if k not in ("case", "variant")}))


def cuda_ms(fn: Callable[[], object], warmup: int, iters: int) -> Dict[str, float]:
    """Median CUDA-event and wall-clock milliseconds of ``fn()``."""
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events, walls = [], []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e3)
        events.append(a.elapsed_time(b))
    return {"ms": statistics.median(events), "wall_ms": statistics.median(walls)}


def _errors(out, ref) -> Dict[str, float]:
    import numpy as np
    out = np.asarray(out, dtype=np.float32)
    ref = np.asarray(ref, dtype=np.float32)
    err = float(np.nanmax(np.abs(out - ref))) if out.shape == ref.shape else math.inf
    return {"max_abs": err, "rel_to_max": err / max(float(np.abs(ref).max()), 1e-12),
            "nan": int(np.isnan(out).sum())}


# -- passctl + TVM ---------------------------------------------------------------------------------
TRITON = {"kernels": "triton", "tensorize": False, "cuda_graph": True}
"""passctl's GPU build: GEMMs (with epilogues) and passctl::Attention on Triton kernels tuned on
this GPU (targets/tvm/triton_dispatch.py), the rest on DLight, launches in CUDA graphs."""
TVM_ONLY = {"kernels": "tvm", "tensorize": False}
"""Every kernel from TVM's DLight schedules (no WMMA: TVM 0.27's Tensorize crashes on fp16)."""


def tvm_artifact(onnx_path: str, pipeline: str, folder: str, emitter=None):
    """``passctl`` pipeline (TVM emitter's aliases) then the TVM emitter for h200 with
    ``emitter`` options; returns the loaded artifact and the fuse-attention statistics."""
    from passctl.ir import load
    from passctl.passes import PassManager, build_pipeline
    from passctl.support.profiles import get_target
    from passctl.targets.tvm import TvmEmitter, load_artifact
    model = load(onnx_path)
    result = PassManager(build_pipeline(pipeline, "h200", "tvm")).run(model)
    fuse = next((r.stats for r in result.records if r.name == "fuse-attention"), {})
    target = get_target("h200")
    os.makedirs(folder, exist_ok=True)
    info = TvmEmitter(self_check=False, **(emitter or TVM_ONLY)).write(model, target, folder)
    art = load_artifact(folder)
    for spec in (art.manifest.get("triton") or {}).get("specializations", []):
        _log(f"  triton kernel: {spec['what']}: {spec['config']}")
    summary = {"attention": fuse.get("attention"), "unfused_softmax": fuse.get("unfused_softmax"),
               "compile_s": info["seconds"].get("compile")}
    return art, summary


def run_tvm(art, feeds, warmup: int, iters: int):
    """The artifact's first output on ``feeds`` and the CUDA-event timing of its calls (inputs on
    the device once: ``TvmArtifact.bind``)."""
    first = next(iter(art.run(feeds).values()))
    return first, cuda_ms(art.bind(feeds), warmup, iters)


def record_tvm_variants(case: str, variants, path: str, feeds, ref, args, tmp: str) -> None:
    """Build, run and record each ``(variant, pipeline, emitter options)`` of ``variants`` on the
    ONNX model at ``path``: timing, errors against ``ref`` and the fuse-attention summary."""
    for variant, pipeline, emitter in variants:
        def go(pipeline=pipeline, variant=variant, emitter=emitter):
            art, summary = tvm_artifact(path, pipeline, os.path.join(tmp, variant.replace(" ", "_")),
                                        emitter)
            out, timing = run_tvm(art, feeds, args.warmup, args.iters)
            return {**timing, **_errors(out, ref), **summary}
        _record(case, variant, go)


# -- case 1: attention B8 H16 S4096 D64 --------------------------------------------------------------
def attention_onnx(path: str, b: int, h: int, s: int, d: int) -> None:
    """The decomposed attention graph (what exports write): q, k, v inputs [B, H, S, D] fp16."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, [b, h, s, d]) for n in "qkv"]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Div", ["qk", "c"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    graph = helper.make_graph(nodes, "attention", ins,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [b, h, s, d])],
                              [numpy_helper.from_array(np.array(math.sqrt(d), np.float16), "c")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


def case_attention(args, tmp: str) -> None:
    import torch
    import torch.nn.functional as F
    b, h, s, d = args.batch, args.heads, args.seq, args.head_size
    case = f"attention B{b} H{h} S{s} D{d} fp16"
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", generator=gen, dtype=torch.float16)
               for _ in range(3))
    scale = d ** -0.5
    with torch.no_grad():
        ref = torch.softmax((q.float() @ k.float().transpose(-1, -2)) * scale, -1) @ v.float()
    ref = ref.cpu().numpy()

    def unfused():
        return torch.softmax((q @ k.transpose(-1, -2)) * scale, -1) @ v

    def torch_variant(fn):
        def go():
            with torch.no_grad():
                out = fn().float().cpu().numpy()
                return {**cuda_ms(fn, args.warmup, args.iters), **_errors(out, ref)}
        return go

    _record(case, "torch unfused", torch_variant(unfused))
    _record(case, "torch sdpa", torch_variant(lambda: F.scaled_dot_product_attention(q, k, v)))
    path = os.path.join(tmp, "attention.onnx")
    attention_onnx(path, b, h, s, d)
    feeds = {"q": q.cpu().numpy(), "k": k.cpu().numpy(), "v": v.cpu().numpy()}
    record_tvm_variants(case, (("tvm unfused", "lower-tvm", TVM_ONLY),
                               ("tvm substituted", "flash-attn,lower-tvm", TRITON)),
                        path, feeds, ref, args, tmp)


# -- case 2: BERT-base batch 8 seq 512 ---------------------------------------------------------------
def case_bert(args, tmp: str) -> None:
    import torch
    import transformers
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    batch, seq = args.bert_batch, args.bert_seq
    case = f"bert-base b{batch} s{seq} fp16"
    torch.manual_seed(0)
    fp32 = transformers.BertModel(transformers.BertConfig(), add_pooling_layer=False).eval()
    with torch.no_grad():
        for p in fp32.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    ids = torch.randint(0, 30522, (batch, seq), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = fp32.cuda()(input_ids=ids.cuda()).last_hidden_state.float().cpu().numpy()
    for impl in ("eager", "sdpa"):
        def go(impl=impl):
            model = transformers.BertModel(fp32.config, add_pooling_layer=False)
            model.load_state_dict(fp32.state_dict())
            model.config._attn_implementation = impl
            model = model.half().cuda().eval()
            x = ids.cuda()
            with torch.no_grad():
                out = model(input_ids=x).last_hidden_state.float().cpu().numpy()
                timing = cuda_ms(lambda: model(input_ids=x), args.warmup, args.iters)
            return {**timing, **_errors(out, ref)}
        _record(case, f"torch {impl}", go)
    path = os.path.join(tmp, "bert", "model.onnx")
    os.makedirs(os.path.dirname(path), exist_ok=True)

    def export():
        model = transformers.BertModel(fp32.config, add_pooling_layer=False)
        model.load_state_dict(fp32.state_dict())
        # eager attention in the export (what gpu_tvm.py exports): the torch variants above left
        # the shared config on "sdpa", whose fp16 export fed float32 into LayerNormalization in
        # TVM's frontend (H200 run, 18:59 UTC)
        model.config._attn_implementation = "eager"
        model = model.half().cuda().eval()

        class Wrapper(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model

            def forward(self, input_ids):
                return self.model(input_ids=input_ids).last_hidden_state

        with torch.no_grad():
            torch.onnx.export(Wrapper().eval(), (ids.cuda(),), path, dynamo=False, opset_version=17,
                              input_names=["input_ids"], output_names=["last_hidden_state"])
        return {"onnx_mb": round(os.path.getsize(path) / 1e6, 1)}

    _record(case, "onnx export (legacy, fp16)", export)
    feeds = {"input_ids": ids.numpy()}
    record_tvm_variants(case, (("tvm unfused", "cleanup,lower-tvm", TVM_ONLY),
                               ("tvm unfused (Triton GEMMs)", "cleanup,fuse,lower-tvm", TRITON),
                               ("tvm substituted", "cleanup,flash-attn,lower-tvm", TRITON),
                               ("tvm fuse+substituted", "cleanup,fuse,flash-attn,lower-tvm", TRITON)),
                        path, feeds, ref, args, tmp)


def table() -> str:
    lines = ["| case | variant | CUDA-event ms (median) | wall ms | max abs err | err / max ref | note |",
             "|---|---|---|---|---|---|---|"]
    for r in ROWS:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['variant']} | - | - | - | - | FAILED: {r['error']} |")
            continue
        ms = f"{r['ms']:.3f}" if "ms" in r else "-"
        wall = f"{r['wall_ms']:.3f}" if "wall_ms" in r else "-"
        err = f"{r['max_abs']:.3g}" if "max_abs" in r else "-"
        rel = f"{r['rel_to_max']:.3g}" if "rel_to_max" in r else "-"
        note = ", ".join(f"{k}={r[k]}" for k in ("attention", "unfused_softmax", "compile_s", "onnx_mb",
                                                   "nan") if r.get(k) not in (None, 0))
        lines.append(f"| {r['case']} | {r['variant']} | {ms} | {wall} | {err} | {rel} | {note} |")
    by_case: Dict[str, Dict[str, float]] = {}
    for r in ROWS:
        if "ms" in r:
            by_case.setdefault(r["case"], {})[r["variant"]] = r["ms"]
    lines.append("")
    for case, ms in by_case.items():
        parts = []
        for a, b in (("tvm unfused", "tvm substituted"), ("tvm unfused (Triton GEMMs)", "tvm fuse+substituted"),
                     ("torch unfused", "tvm substituted"),
                     ("torch sdpa", "tvm substituted"), ("torch sdpa", "tvm fuse+substituted"),
                     ("torch unfused", "torch sdpa"), ("torch eager", "torch sdpa")):
            if a in ms and b in ms:
                parts.append(f"{a} / {b} = {ms[a] / ms[b]:.2f}x")
        lines.append(f"- {case}: " + "; ".join(parts))
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="attention,bert")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--head-size", type=int, default=64)
    parser.add_argument("--bert-batch", type=int, default=8)
    parser.add_argument("--bert-seq", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    import torch
    _log(f"torch {torch.__version__}, cuda {torch.cuda.is_available()} "
         f"({torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'})")
    try:
        import tvm
        _log(f"tvm {tvm.__version__}, cuda enabled: {tvm.runtime.enabled('cuda')}")
    except Exception as e:
        _log(f"tvm import failed: {e}")
    with tempfile.TemporaryDirectory(prefix="passctl-gpu-attn-") as tmp:
        for case in args.cases.split(","):
            try:
                {"attention": case_attention, "bert": case_bert}[case](args, tmp)
            except Exception as e:
                _log(f"case {case} failed: {type(e).__name__}: {e}")
                traceback.print_exc(limit=4)
    text = table()
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "gpu_attention.json").write_text(json.dumps(ROWS, indent=1))
        Path(out, "gpu_attention.md").write_text(text + "\n")
    print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
