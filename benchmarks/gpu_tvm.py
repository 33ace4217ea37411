"""BERT-base on one GPU: TVM's default pipeline vs passctl -> TVM, next to torch eager and sdpa;
batch 8, seq 128 fp32 and seq 512 fp16 (and ``512:amp``: passctl ``amp{dtype=fp16}`` on the fp32
export against the fp32 passctl artifact).

Run on the H200 machine (see ../shared/GPU.md: TVM from /tmp/tvmsite):

    export PYTHONPATH=/tmp/tvmsite:$PWD && python3 benchmarks/gpu_tvm.py [--configs 128:fp32,512:fp16]
        [--variants REGEX] [--budget-s 480] [--kernel-profile]

(``benchmarks/gpu_bert.sh`` runs the published configuration.) ``--kernel-profile`` prints each TVM
build's top GPU kernels by time per call (torch's profiler, which sees CUDA-graph launches).

The script exports BERT-base itself (transformers ``BertModel(BertConfig())``, random weights plus
N(0, 0.02) noise so no norm is the identity, eager attention, legacy ONNX exporter, opset 17,
static shapes), so no file travels. Variants (``VARIANTS`` per dtype, ``PASSCTL_VARIANTS``):
- ``tvm default``: TVM 0.27's ONNX frontend + ``tvm.compile`` default pipeline on the raw export;
  ``tvm default (cleaned)``: the same on the export after passctl ``cleanup,lower-tvm`` (TVM's
  frontend cannot import the raw BERT export: broadcast_to rank error); ratios are against it.
- ``passctl -> tvm``: ``cleanup,fuse`` -> the TVM emitter with Triton GEMM / attention kernels
  tuned on this GPU and CUDA graphs (docs/tvm.md); ``+flash-attn``: ``cleanup,fuse,flash-attn``;
  ``(3xTF32)`` / ``tf32``: ``fp32_precision`` tf32x3 / tf32 (tf32 changes precision);
  ``(DLight only)``: ``kernels=tvm``; ``(no cuda graph)``.
Each TVM variant runs in a child process (TVM 0.27 can segfault while building) with a
``CHILD_TIMEOUT_S`` limit, the whole run kept within ``--budget-s`` (the GPU machine takes 600 s
per command); the children's Triton tile choices are printed. Timing: CUDA events around ``--runs``
calls after ``--warmup`` calls (TVM calls end with a device sync before the end event); the median
of ``--repeats`` such windows, in ms per call. Numerics: max relative error (max |a - b| /
max |ref|) of last_hidden_state against torch eager fp32. The table comes last.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import statistics
import sys
import time
import traceback

import numpy as np

from passctl_path import ensure_passctl_importable, scratch_dir  # noqa: E402
from tvm_baseline import cleaned_export, max_rel, tvm_default  # noqa: E402



def export_bert(path: str, batch: int, seq: int, fp16: bool, device) -> object:
    """Export BERT-base to ``path``; returns the torch model (eager attention) for the baselines."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig(), add_pooling_layer=False).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    model = model.to(device)
    if fp16:
        model = model.half()
    ids = torch.randint(0, 30522, (batch, seq), device=device)
    mask = torch.ones(batch, seq, dtype=torch.int64, device=device)
    types = torch.zeros(batch, seq, dtype=torch.int64, device=device)
    model.config._attn_implementation = "eager"

    class _Wrapper(torch.nn.Module):  # positional inputs (transformers 5 reordered forward's args)
        def __init__(self, bert):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    with torch.no_grad():
        torch.onnx.export(_Wrapper(model).eval(), (ids, mask, types), path, input_names=[
            "input_ids", "attention_mask", "token_type_ids"], output_names=["last_hidden_state"],
            opset_version=17, dynamo=False, do_constant_folding=True)
    # The exporter puts the wrapper back in its former mode, recursively: a fresh wrapper is in
    # training mode, so without the .eval() calls BERT came back with dropout on (p=0.1) and every
    # torch output (reference included) was a different random draw (rel err 0.8-0.97 on 17:19's run).
    return model.eval()


def cuda_time(fn, sync, runs: int, warmup: int, repeats: int) -> float:
    """Median over ``repeats`` of (CUDA-event ms of ``runs`` calls) / runs."""
    import torch

    for _ in range(warmup):
        fn()
    sync()
    torch.cuda.synchronize()
    per = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(runs):
            fn()
        sync()
        end.record()
        end.synchronize()
        per.append(start.elapsed_time(end) / runs)
    return statistics.median(per)


AMP_REPORT = {}
"""The last ``mixed-precision`` pass statistics (the amp variant prints which nodes stay float32)."""


def tvm_passctl(onnx_path, feeds, profile, pipeline="cleanup,fuse", **emitter):
    """passctl ``pipeline`` (aliases in their TVM form) + ``lower-tvm`` -> the TVM emitter for
    ``profile`` with ``emitter`` options (:class:`passctl.targets.tvm.TvmEmitter`)."""
    from passctl.ir import load
    from passctl.passes.manager import PassManager
    from passctl.passes.pipeline_text import build_pipeline
    from passctl.targets import get_target
    from passctl.targets.tvm import TvmEmitter, load_artifact

    t0 = time.perf_counter()
    model = load(onnx_path)
    result = PassManager(build_pipeline(pipeline + ",lower-tvm", profile, "tvm")).run(model)
    for record in result.records:
        if record.name == "mixed-precision":
            AMP_REPORT.update(record.stats)
    out = scratch_dir("passctl-tvm-") + "/artifact"
    TvmEmitter(**emitter).emit(model, get_target(profile), out)
    compile_s = time.perf_counter() - t0
    art = load_artifact(out)
    triton = art.manifest.get("triton") or {}
    for spec in triton.get("specializations", []):
        print(f"  triton kernel: {spec['what']}: {spec['config']}", file=sys.stderr)
    call = art.bind(feeds)
    result = art.run(feeds)
    return call, art.device.sync, next(iter(result.values())), compile_s


TRITON = {"kernels": "triton", "tensorize": False, "cuda_graph": True}
"""passctl's GPU build: GEMMs + epilogues and attention on Triton kernels (tile configurations tuned
on this GPU), the rest on DLight without WMMA (TVM 0.27's Tensorize crashes on fp16), launches in
CUDA graphs."""
PASSCTL_VARIANTS = {
    "passctl -> tvm": ("cleanup,fuse", TRITON),
    "passctl -> tvm (DLight only)": ("cleanup,fuse", {"kernels": "tvm", "tensorize": False}),
    "passctl +flash-attn -> tvm": ("cleanup,fuse,flash-attn", TRITON),
    "passctl +flash-attn -> tvm (no cuda graph)": ("cleanup,fuse,flash-attn",
                                                   {**TRITON, "cuda_graph": False}),
    "passctl +flash-attn tf32 -> tvm": ("cleanup,fuse,flash-attn",
                                        {**TRITON, "fp32_precision": "tf32"}),
    "passctl -> tvm (3xTF32)": ("cleanup,fuse", {**TRITON, "fp32_precision": "tf32x3"}),
    "passctl +flash-attn -> tvm (3xTF32)": ("cleanup,fuse,flash-attn",
                                            {**TRITON, "fp32_precision": "tf32x3"}),
    "passctl amp fp16 -> tvm": ("cleanup,fuse,flash-attn,amp{{dtype=fp16,calib={calib}}}", TRITON),
}
TVM_VARIANTS = ("tvm default", "tvm default (cleaned)") + tuple(PASSCTL_VARIANTS)
VARIANTS = {"fp32": ("torch eager", "torch sdpa", "tvm default", "tvm default (cleaned)",
                     "passctl -> tvm", "passctl +flash-attn -> tvm", "passctl -> tvm (3xTF32)",
                     "passctl +flash-attn -> tvm (3xTF32)", "passctl +flash-attn tf32 -> tvm"),
            "fp16": ("torch eager", "torch sdpa", "tvm default", "tvm default (cleaned)",
                     "passctl -> tvm", "passctl +flash-attn -> tvm"),
            "amp": ("torch eager", "passctl -> tvm", "passctl amp fp16 -> tvm")}
"""Variants per ``--configs`` dtype. ``amp`` (issue 8): the fp32 export, passctl ``cleanup,fuse,
flash-attn,amp{dtype=fp16}`` (calibrated on this run's feeds) -> TVM next to the fp32 passctl
artifact. ``tf32`` rows change precision (10-bit mantissa GEMM inputs) and say so."""
CHILD_TIMEOUT_S = 240
"""Longest one TVM variant (build + timing) may take; less when the run's --budget-s runs low."""


def run_tvm_variant(name: str, path: str, feeds, arch: str, profile: str):
    """Build and load one TVM variant; returns ``(call, sync, output, compile seconds)``."""
    if name.startswith("tvm default"):
        import tvm

        if name == "tvm default (cleaned)":  # next to the export: the children share it
            path = cleaned_export(path, "h200", path[:-5] + ".cleaned.onnx")
        dev = tvm.cuda(0)
        target = tvm.target.Target({"kind": "cuda", "arch": arch})
        call, out, compile_s = tvm_default(path, feeds, target, dev)
        return call, dev.sync, out, compile_s
    pipeline, emitter = PASSCTL_VARIANTS[name]
    calib = os.path.join(os.path.dirname(path), "calib")
    return tvm_passctl(path, feeds, profile, pipeline.format(calib=calib), **emitter)


def kernel_profile(call, sync, calls: int = 10, top: int = 25) -> None:
    """Print (to stderr, ``  kernel profile`` lines) the ``top`` GPU kernels by time per call of
    ``call``, from torch's profiler (CUPTI, which also sees TVM's and CUDA-graph launches): name,
    launches per call, microseconds per call and share of the kernel time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    call()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        sync()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        us = getattr(e, "cuda_time_total", 0.0) if us is None else us
        if us > 0 and e.count:
            n, t = rows.get(e.key, (0, 0.0))
            rows[e.key] = (n + e.count, t + us)
    total = sum(t for _, t in rows.values()) or float("nan")
    print(f"  kernel profile: {len(rows)} kernels, {total / calls:.0f} us of kernel time per call",
          file=sys.stderr)
    for name, (n, t) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  kernel profile: {t / calls:8.1f} us {100 * t / total:5.1f}% x{n / calls:5.1f} "
              f"{name[:90]}", file=sys.stderr)


def child(args) -> int:
    """One TVM variant in this (child) process; prints one ``RESULT {json}`` line last. TVM 0.27 can
    crash the process (a segfault inside DLight's fp16 tensorization), so the parent isolates it."""
    import json

    import torch  # noqa: F401  (CUDA events)

    ensure_passctl_importable()
    work = os.path.dirname(args.child_onnx)
    feeds = dict(np.load(os.path.join(work, "feeds.npz")))
    ref = np.load(os.path.join(work, "ref32.npy"))
    call, sync, out, compile_s = run_tvm_variant(args.child, args.child_onnx, feeds, args.arch,
                                                 args.profile)
    ms = cuda_time(call, sync, args.runs, args.warmup, args.repeats)
    if args.kernel_profile:
        kernel_profile(call, sync)
    result = {"ms": ms, "err": max_rel(out, ref), "compile_s": compile_s}
    if AMP_REPORT:
        kept = [n for n in AMP_REPORT.get("nodes", []) if n.get("precision") == "fp32"]
        result["amp"] = {"low_nodes": AMP_REPORT.get("low_nodes"), "fp32_nodes": len(kept),
                         "fp32": [f"{n['op']} {n['name']}: {n.get('why', '')}" for n in kept]}
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def isolated(name: str, path: str, args, arch: str, timeout: float = 0):
    """Run TVM variant ``name`` in a child process; returns ``(ms, err, compile_s, note)``."""
    import json
    import subprocess

    cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--child-onnx", path,
           "--arch", arch, "--profile", args.profile, "--runs", str(args.runs), "--warmup",
           str(args.warmup), "--repeats", str(args.repeats)] + (
               ["--kernel-profile"] if args.kernel_profile else [])
    timeout = timeout or CHILD_TIMEOUT_S
    if timeout < 20:
        return float("nan"), float("nan"), float("nan"), "skipped: --budget-s spent"
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return float("nan"), float("nan"), float("nan"), f"timed out after {timeout:.0f} s"
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode == 0 and lines:
        d = json.loads(lines[-1][len("RESULT "):])
        if "amp" in d:
            amp = d["amp"]
            print(f"--- {name}: amp kept {amp['fp32_nodes']} nodes float32, {amp['low_nodes']} "
                  "fp16 ---\n" + "\n".join(amp["fp32"][:60]), flush=True)
        for line in (r.stderr or "").splitlines():  # kernel choices and profiles
            if line.startswith(("  triton kernel", "  kernel profile")):
                print(f"[{name}] {line}", flush=True)
        return d["ms"], d["err"], d["compile_s"], ""
    tail = [ln for ln in (r.stderr or "").strip().splitlines() if ln.strip()]
    # Every compiler error line in full (nvcc prints "file(line): error: ..." lines, then warnings
    # that fill the tail), then the last lines.
    errors = list(dict.fromkeys(ln for ln in tail if re.search(r"\berrors?\b", ln)))
    if errors:
        print(f"--- {name}: {len(errors)} error lines ---\n" + "\n".join(errors[:80]), flush=True)
    print(f"--- {name} stderr (last lines) ---\n" + "\n".join(tail[-12:]), flush=True)
    why = "crashed (signal %d)" % -r.returncode if r.returncode < 0 else f"exit {r.returncode}"
    last = next((ln for ln in reversed(tail) if "Error" in ln or "error" in ln), tail[-1] if tail else "")
    return float("nan"), float("nan"), float("nan"), f"{why}: {last.strip()[:90]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", default="h200", help="passctl target profile (sm from it)")
    parser.add_argument("--configs", default="128:fp32,512:fp16,512:amp",
                        help="seq:dtype list; dtype fp32, fp16 (a .half() export) or amp (fp32 "
                             "export, passctl amp{dtype=fp16} vs the fp32 passctl artifact)")
    parser.add_argument("--variants", default="",
                        help="regex: run only the variants whose name matches")
    parser.add_argument("--kernel-profile", action="store_true",
                        help="print each TVM variant's top GPU kernels (torch profiler)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-onnx", help=argparse.SUPPRESS)
    parser.add_argument("--arch", help=argparse.SUPPRESS)
    parser.add_argument("--budget-s", type=float, default=480,
                        help="wall-clock budget of the whole run; TVM variants get what is left")
    args = parser.parse_args()
    t_start = time.perf_counter()
    if args.child:
        return child(args)

    import torch

    ensure_passctl_importable()
    from passctl.targets import get_target

    profile = get_target(args.profile)
    card = torch.cuda.get_device_name(0)
    cap = torch.cuda.get_device_capability(0)
    arch = f"sm_{cap[0]}{cap[1]}"
    try:
        import tvm
        tvm_info = f"tvm {tvm.__version__}, cuda enabled: {tvm.runtime.enabled('cuda')}"
    except Exception as e:  # noqa: BLE001
        tvm_info = f"tvm missing: {e}"
    print(f"date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; card {card} "
          f"({arch}); passctl profile {profile.name} ({profile.sm}); torch {torch.__version__}; "
          f"{tvm_info}", flush=True)
    rows = []
    device = torch.device("cuda")
    for config in args.configs.split(","):
        seq_text, dtype = config.split(":")
        if dtype not in VARIANTS:
            parser.error(f"--configs {config}: dtype must be one of {', '.join(VARIANTS)}")
        seq, fp16, batch = int(seq_text), dtype == "fp16", 8
        label = f"b{batch} s{seq} {dtype}"
        work = scratch_dir("bert-")
        path = os.path.join(work, "bert.onnx")
        try:
            model = export_bert(path, batch, seq, fp16, device)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            rows.append((label, "export", float("nan"), float("nan"), float("nan"), f"{e}"[:80]))
            continue
        rng = np.random.default_rng(0)
        feeds = {"input_ids": rng.integers(0, 30522, (batch, seq)).astype(np.int64),
                 "attention_mask": np.ones((batch, seq), np.int64),
                 "token_type_ids": np.zeros((batch, seq), np.int64)}
        tfeeds = {k: torch.from_numpy(v).to(device) for k, v in feeds.items()}
        with torch.no_grad():
            model.config._attn_implementation = "eager"
            ref32 = model.float()(**tfeeds).last_hidden_state.float().cpu().numpy()
            if fp16:
                model = model.half()
        np.savez(os.path.join(work, "feeds.npz"), **feeds)
        os.makedirs(os.path.join(work, "calib"))
        np.savez(os.path.join(work, "calib", "feeds.npz"), **feeds)  # amp's calibration feed
        np.save(os.path.join(work, "ref32.npy"), ref32)
        for name in VARIANTS[dtype]:
            if args.variants and not re.search(args.variants, name):
                continue
            if name in TVM_VARIANTS:
                left = args.budget_s - (time.perf_counter() - t_start)
                ms, err, compile_s, note = isolated(name, path, args, arch,
                                                    timeout=min(CHILD_TIMEOUT_S, left - 10))
                rows.append((label, name, ms, err, compile_s, note))
                print(f"{label} {name}: {ms:.3f} ms, rel err {err:.2e}, compile {compile_s:.1f} s "
                      f"{note}", flush=True)
                continue
            try:
                impl = "sdpa" if "sdpa" in name else "eager"
                if hasattr(model, "set_attn_implementation"):
                    model.set_attn_implementation(impl)
                else:
                    model.config._attn_implementation = impl

                def call(m=model):
                    with torch.no_grad():
                        return m(**tfeeds).last_hidden_state
                out = call().float().cpu().numpy()
                ms = cuda_time(call, torch.cuda.synchronize, args.runs, args.warmup, args.repeats)
                rows.append((label, name, ms, max_rel(out, ref32), 0.0, ""))
                print(f"{label} {name}: {ms:.3f} ms, rel err {max_rel(out, ref32):.2e}", flush=True)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                msg = (str(e).strip().splitlines() or [type(e).__name__])[-1]
                rows.append((label, name, float("nan"), float("nan"), float("nan"), msg[:100]))
                print(f"{label} {name}: FAILED {type(e).__name__}: {msg}", flush=True)
    print()
    print("| config | variant | ms / call | vs tvm default | rel err vs torch fp32 | compile s | note |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    base = {}  # the raw export's TVM default, else the cleaned export's when the raw one failed
    for label, name, ms, err, comp, note in rows:
        if name.startswith("tvm default") and ms == ms and label not in base:
            base[label] = ms
    for label, name, ms, err, comp, note in rows:  # amp rows: against the fp32 passctl artifact
        if name == "passctl -> tvm" and ms == ms and label not in base:
            base[label] = ms
    for label, name, ms, err, comp, note in rows:
        b = base.get(label, float("nan"))
        ratio = b / ms if ms == ms and b == b else float("nan")
        print(f"| {label} | {name} | {ms:.3f} | {ratio:.2f}x | {err:.1e} | {comp:.1f} | {note} |")
    print(f"\n{card} ({arch}), {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
