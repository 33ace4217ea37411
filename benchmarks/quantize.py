"""ONNX Runtime CPU latency and output error: fp32, passctl int8 (QDQ), ORT's quantize_static.

Run ``python benchmarks/quantize.py [--models ppocr_det,resnet50] [--runs 20] [--samples 4]``. For
each model:

- ``fp32``: the original file, ``ORT_ENABLE_ALL``;
- ``passctl``: ``passctl.ir.load`` -> ``build_pipeline(PIPELINE)`` for each of ``--pipelines``
  (default ``quantize{calib=DIR}`` and ``cleanup,fuse,quantize{calib=DIR}``; quantize-int8's
  defaults: budget 2e-2 mean-rel, and for the cpu target uint8 activations with zero point 128 and
  quantized layer outputs) -> ``save``, ``ORT_ENABLE_ALL`` (ONNX Runtime fuses the QDQ node units
  into QLinearConv / QLinearMatMul);
- ``ort-static``: ``onnxruntime.quantization.quantize_static`` (``QuantFormat.QDQ``,
  ``per_channel=True``, int8 weights and activations, ``ActivationSymmetric`` and
  ``WeightSymmetric``, MinMax calibration) on the same calibration feeds, ``ORT_ENABLE_ALL``.

Sessions: ``passctl.support.check.cpu_session`` with 2 intra-op threads, sequential (as
``benchmarks/ort_cpu.py``); warm-up, then interleaved rounds; the median of ``--runs``. Output
error:
max-rel and mean-rel of each variant as it ships (``ORT_ENABLE_ALL``, the fused int8 kernels)
against fp32 with optimizations off, over the calibration feeds
and over ``--holdout`` feeds not calibrated on (worst feed). Ceiling: the share of fp32 operator
time in Conv/MatMul/Gemm (ONNX Runtime's profiler, ``benchmarks/ort_cpu.op_time_shares``); int8 can
only speed up that share, so with that part k times faster the model is at most
``1 / (1 - share + share / k)`` times faster (Amdahl's law), printed for k = 2 and 4.

Feeds: PP-OCRv4 det: synthetic text images (``tests/passes/quantize/ocr_images.py``) at 640x640;
ResNet-50 (``tests/zoo.py``, timm, random weights): seeded ``make_inputs`` in [-1, 1); MiniLM
(all-MiniLM-L6-v2, real weights, ``minilm_legacy``): seeded random token ids at batch 1, sequence
128 (passctl's pipelines get ``dims=batch=1;sequence=128`` through ``--pipelines``). The first line
printed names the CPU's instruction set (``passctl.support.cpu_isa``): the int8 form and speed
depend on it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List


REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "passes" / "quantize"))
sys.path.insert(0, str(REPO / "benchmarks"))

THREADS = 2
MINILM_DIMS = {"batch": 1, "sequence": 128}


def _model(model_id: str, count: int, seed: int):
    """(path, feeds) of a model."""
    from passctl.support.inputs import make_inputs

    if model_id == "ppocr_det":
        from corpus import CORPUS
        from ocr_images import det_input
        return CORPUS["ppocr_det"].path, [det_input(640, 640, seed + k) for k in range(count)]
    if model_id == "resnet50":
        from zoo import ZOO
        path = ZOO["resnet50"].path
        return path, [make_inputs(path, seed=seed + k) for k in range(count)]
    if model_id == "minilm":
        from corpus import CORPUS
        path = CORPUS["minilm_legacy"].path
        return path, [make_inputs(path, seed=seed + k, dim_values=MINILM_DIMS) for k in range(count)]
    raise SystemExit(f"unknown model {model_id}; use ppocr_det, resnet50, minilm")


def _passctl(src: str, calib: Path, out: Path, pipeline: str) -> dict:
    from passctl.ir import load, save
    from passctl.passes import PassManager, build_pipeline

    model = load(src)
    result = PassManager(build_pipeline(pipeline.replace("DIR", str(calib)))).run(model)
    save(model, str(out))
    stats = next(r.stats for r in result.records if r.name == "quantize-int8")
    return {k: stats[k] for k in ("quantized_layers", "float_layers", "error", "budget", "metric")}


def _ort_static(src: str, feeds: List[dict], out: Path) -> None:
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    quantize_static(src, str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True})


def _errors(reference: List[list], candidate: List[list]) -> Dict[str, float]:
    """The worst ``max_rel`` and ``mean_rel`` (:func:`passctl.support.check.compare`) over every output
    of every sample; ``reference`` and ``candidate`` are per-sample output lists."""
    from passctl.support.check import compare

    worst = {"max_rel": 0.0, "mean_rel": 0.0}
    for ref, cand in zip(reference, candidate):
        for diff in compare(dict(enumerate(ref)), dict(enumerate(cand))).outputs.values():
            worst["max_rel"] = max(worst["max_rel"], diff.max_rel)
            worst["mean_rel"] = max(worst["mean_rel"], diff.mean_rel)
    return worst


def bench(model_id: str, args) -> List[str]:
    from ort_cpu import GEMM_LIKE, op_time_shares
    from ocr_images import write_feeds
    from passctl.support.check import cpu_session

    src, feeds = _model(model_id, args.samples, 0)
    _, holdout = _model(model_id, args.holdout, 100)
    lines = [f"## {model_id}", ""]
    with tempfile.TemporaryDirectory(prefix=f"quantize_{model_id}_") as tmp:
        tmp = Path(tmp)
        calib = write_feeds(tmp / "calib", feeds)
        shares = op_time_shares(src, feeds[0], 2, 5, tmp)
        total = sum(shares.values())
        matrix = sum(t for op, t in shares.items() if GEMM_LIKE.search(op)) / total
        ceiling = {k: 1 / (1 - matrix + matrix / k) for k in (2, 4)}
        lines.append(f"fp32 operator time in Conv/MatMul/Gemm: {matrix:.1%}; ceiling (Amdahl) if "
                     f"int8 makes that part k times faster: k=2 -> {ceiling[2]:.2f}x, k=4 -> "
                     f"{ceiling[4]:.2f}x (int8 x86 kernels: 2x (AVX2) to 4x (VNNI) the fp32 MACs)")
        paths = {"fp32": src}
        for k, pipeline in enumerate(args.pipelines.split("|")):
            name = f"passctl `{pipeline}`"
            paths[name] = str(tmp / f"passctl{k}.onnx")
            start = time.perf_counter()
            info = _passctl(src, calib, Path(paths[name]), pipeline)
            lines.append(f"{name}: {time.perf_counter() - start:.1f} s, {info}")
        paths["ort-static"] = str(tmp / "ort.onnx")
        start = time.perf_counter()
        _ort_static(src, feeds, Path(paths["ort-static"]))
        lines.append(f"ort quantize_static: {time.perf_counter() - start:.1f} s")
        sessions = {v: cpu_session(p, True, THREADS, sequential=True) for v, p in paths.items()}
        # errors as shipped: the fp32 reference unoptimized, every candidate with ORT_ENABLE_ALL
        # (the level its session.json names: QDQ node units run as fused int8 kernels), which
        # are the timed sessions themselves
        measured = dict(sessions, fp32=cpu_session(src, False, THREADS))
        outputs = {v: [s.run(None, f) for f in feeds + holdout] for v, s in measured.items()}
        n = len(feeds)
        for _ in range(args.warmup):
            for s in sessions.values():
                s.run(None, feeds[0])
        times: Dict[str, List[float]] = {v: [] for v in sessions}
        order = list(sessions)
        for r in range(args.runs):
            for v in order[r % len(order):] + order[:r % len(order)]:
                t = time.perf_counter()
                sessions[v].run(None, feeds[0])
                times[v].append((time.perf_counter() - t) * 1e3)
        ms = {v: statistics.median(t) for v, t in times.items()}
        lines += ["", "| variant | median ms | fp32 / variant | max-rel calib | mean-rel calib | "
                  "max-rel holdout | mean-rel holdout |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for v in paths:
            cal = _errors(outputs["fp32"][:n], outputs[v][:n])
            hold = _errors(outputs["fp32"][n:], outputs[v][n:])
            lines.append(f"| {v} | {ms[v]:.1f} | {ms['fp32'] / ms[v]:.2f} | {cal['max_rel']:.3g} | "
                         f"{cal['mean_rel']:.3g} | {hold['max_rel']:.3g} | "
                         f"{hold['mean_rel']:.3g} |")
        for v in list(paths)[1:]:
            prof = op_time_shares(paths[v], feeds[0], 2, 5, tmp)
            top = sorted(prof.items(), key=lambda kv: -kv[1])[:5]
            lines.append(f"\n{v} top ops (optimized session): "
                         + ", ".join(f"{op} {t / sum(prof.values()):.0%}" for op, t in top))
    return lines + [""]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="ppocr_det,resnet50")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--samples", type=int, default=4, help="calibration feeds")
    parser.add_argument("--holdout", type=int, default=2, help="feeds not calibrated on")
    parser.add_argument("--pipelines",
                        default="quantize{calib=DIR}|cleanup,fuse,quantize{calib=DIR}",
                        help="passctl pipelines separated by '|'; DIR is the calibration folder")
    args = parser.parse_args(argv)
    from passctl_path import ensure_passctl_importable

    ensure_passctl_importable()
    import onnxruntime

    from passctl.support.cpu_isa import host_isa

    isa = host_isa()
    print(f"CPU: {isa.name} ({', '.join(isa.features) or 'no known features'}); int8 kernels: "
          f"{isa.int8_kernels}; ONNX Runtime {onnxruntime.__version__}\n", flush=True)
    for model_id in args.models.split(","):
        print("\n".join(bench(model_id, args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
