"""Latency of timm RepVGG-A0 / MobileOne-S0 before and after passctl's `reparam` (ONNX Runtime CPU, TVM GPU).

Run ``python benchmarks/reparam.py [--models repvgg_a0,mobileone_s0] [--size 224] [--runs 30]``.

Models: timm's training-time (multi-branch) form with random weights and randomized BatchNorm
statistics, exported with BatchNormalization kept (``tests/reparam_export.py``, cached under
``.cache/reparam/``). ``after`` is that export through ``PassManager(build_pipeline("cleanup,reparam"))``.

ONNX Runtime CPU: ``intra_op_num_threads=2``, ``inter_op_num_threads=1``, ``ORT_SEQUENTIAL``,
batch 1, at two graph optimization levels: ``ort-all`` (``ORT_ENABLE_ALL``: ONNX Runtime folds each
Conv + BN itself, so there ``before`` is already BN-free and the gain is the branch merge alone) and
``ort-off`` (``ORT_DISABLE_ALL``: the graphs as written). Both sessions are warmed up, then run in alternating
order for ``--runs`` rounds; the table shows the median in milliseconds and ``before / after``.
Outputs of ``after`` are compared with ``before`` (``passctl.support.check.compare``, ``max_rel``).

TVM GPU: with the TVM emitter (``passctl.targets``), apache-tvm and ``nvcc`` present, ``--tvm-dir DIR``
writes both graphs as CUDA artifacts for ``--tvm-target`` (default ``h200``); where a CUDA device is
present they are timed too (``TvmArtifact.latency_ms``, median of ``--runs`` after warm-up); on a GPU
machine, ``--tvm-run DIR`` times artifacts built elsewhere. Otherwise the TVM row says why it is n/a.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]


def _reparam_file(src: str, out: str) -> Tuple[int, int]:
    """``src`` through ``cleanup,reparam`` into ``out``; returns the Conv count before and after."""
    from passctl.ir import load, save
    from passctl.passes.manager import PassManager
    from passctl.passes.pipeline_text import build_pipeline

    model = load(src)
    before = sum(1 for n in model.graph if n.op_type == "Conv")
    PassManager(build_pipeline("cleanup,reparam")).run(model)
    save(model, out)
    return before, sum(1 for n in model.graph if n.op_type == "Conv")


LEVELS = {"all": "ORT_ENABLE_ALL", "off": "ORT_DISABLE_ALL"}


def conv_macs(path: str) -> int:
    """Multiply-accumulates of every Conv (``output elements * C_in/group * kh * kw``), shapes from
    ``onnx.shape_inference``: the arithmetic a branch merge removes, whatever the runtime."""
    import numpy as np
    import onnx

    proto = onnx.shape_inference.infer_shapes(onnx.load(path))
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(proto.graph.value_info) + list(proto.graph.output)}
    weights = {t.name: list(t.dims) for t in proto.graph.initializer}
    total = 0
    for n in proto.graph.node:
        if n.op_type == "Conv":
            w = weights[n.input[1]]
            total += int(np.prod(shapes[n.output[0]])) * int(np.prod(w[1:]))
    return total


def _session(path: str, threads: int, level: str):
    from passctl.support.check import cpu_session
    return cpu_session(path, optimize=LEVELS[level] == "ORT_ENABLE_ALL", threads=threads,
                       sequential=True)


def ort_latency(paths: Dict[str, str], feeds, runs: int, warmup: int, threads: int,
                level: str = "all") -> Dict[str, List[float]]:
    """Milliseconds per run of each model, ``runs`` alternating rounds after ``warmup`` runs each."""
    sessions = {k: _session(p, threads, level) for k, p in paths.items()}
    for s in sessions.values():
        for _ in range(warmup):
            s.run(None, feeds)
    times: Dict[str, List[float]] = {k: [] for k in sessions}
    keys = list(sessions)
    for r in range(runs):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            start = time.perf_counter()
            sessions[k].run(None, feeds)
            times[k].append((time.perf_counter() - start) * 1e3)
    return times


def _tvm_status() -> Optional[str]:
    """None when TVM GPU artifacts can be built here, else why not."""
    import shutil

    try:
        from passctl.targets import get_emitter

        get_emitter("tvm")
    except Exception:
        return "TVM emitter not available"
    try:
        import tvm  # noqa: F401
    except ImportError:
        return "apache-tvm is not installed"
    if shutil.which("nvcc") is None:
        return "nvcc not found (needed to build CUDA artifacts)"
    return None


def _cuda_present() -> bool:
    try:
        import tvm.runtime as rt

        return bool(rt.device("cuda", 0).exist)
    except Exception:
        return False


def tvm_build(pairs: Dict[str, Dict[str, str]], folder: str, target_name: str) -> List[str]:
    """Write ``<folder>/<model>_<variant>`` CUDA artifacts with the TVM emitter, plus
    ``param_specs.json`` (name, shape, dtype of each weight) so the timing can run on random weights
    where ``model.params`` is not copied along. Returns the models whose two artifacts were built."""
    import json

    import tvm.runtime as rt

    from passctl.ir import load
    from passctl.passes.manager import PassManager
    from passctl.passes.pipeline_text import build_pipeline
    from passctl.targets import get_emitter, get_target

    target = get_target(target_name)
    emitter = get_emitter("tvm")
    built = []
    for name, paths in pairs.items():
        try:
            for variant, path in paths.items():
                model = load(path)
                # The emitter needs only standard ops with static shapes: cleanup gives that here.
                # The baseline also gets each branch's Conv + BN folded (fuse-conv-bn), as any
                # compiler would: the ratio is the gain of merging the branches.
                pipeline = "cleanup,fuse-conv-bn" if variant == "before" else "cleanup"
                PassManager(build_pipeline(pipeline, target=target.name)).run(model)
                start = time.perf_counter()
                out = os.path.join(folder, f"{name}_{variant}")
                emitter.emit(model, target, out)
                params = rt.load_param_dict_from_file(os.path.join(out, "model.params"))
                specs = {k: [list(v.shape), str(v.dtype)] for k, v in params.items()}
                with open(os.path.join(out, "param_specs.json"), "w") as f:
                    json.dump(specs, f)
                print(f"  built {name}_{variant} for {target.name} in "
                      f"{time.perf_counter() - start:.1f} s", flush=True)
            built.append(name)
        except Exception as e:  # a TVM build failure of one model must not hide the others
            last = (str(e).strip().splitlines() or [""])[-1]
            print(f"{name:<14} tvm-cuda: n/a: the TVM build failed: {type(e).__name__} {last}",
                  flush=True)
    return built


def _tvm_artifact(folder: str):
    """(VM main function, weights on the device, device) of a TVM artifact, with ``tvm.runtime``
    only (so it runs where passctl is not installed). Without ``model.params`` the weights are
    random with the shapes of ``param_specs.json`` (latency does not depend on their values)."""
    import json

    import numpy as np
    import tvm.runtime as rt
    from tvm.runtime.vm import VirtualMachine

    with open(os.path.join(folder, "manifest.json")) as f:
        manifest = json.load(f)
    dev = rt.device(manifest["device"], 0)
    if manifest["device"] == "cuda":  # a runtime-only tvm loads its CUDA module loader on request
        try:
            import tvm.libinfo
            from tvm_ffi.libinfo import load_lib_ctypes

            load_lib_ctypes("tvm", "tvm_runtime_cuda", "RTLD_GLOBAL",
                            extra_lib_paths=tvm.libinfo.package_lib_paths())
        except (ImportError, OSError, RuntimeError, AttributeError):
            pass  # a full tvm has it loaded already
        # Kernels still in CUDA source are compiled when the library loads; TVM's callback asks the
        # compiler library for the current target, which a runtime-only tvm lacks: give the arch.
        import tvm_ffi
        from tvm.support import nvcc

        arch = "sm_" + str(dev.compute_version).replace(".", "")
        tvm_ffi.register_global_func(
            "tvm_callback_cuda_compile",
            lambda code, *_: nvcc.compile_cuda(code, target_format="cubin", arch=arch, compiler="nvrtc"),
            override=True)
    vm = VirtualMachine(rt.load_module(os.path.join(folder, manifest["library"])), dev)
    path = os.path.join(folder, manifest["params"])
    if os.path.exists(path):
        params = {k: v.numpy() for k, v in rt.load_param_dict_from_file(path).items()}
    else:
        with open(os.path.join(folder, "param_specs.json")) as f:
            specs = json.load(f)
        rng = np.random.default_rng(0)
        params = {k: (rng.standard_normal(shape) * 0.05).astype(dtype)
                  for k, (shape, dtype) in specs.items()}
    weights = [rt.tensor(params[n], dev) for n in manifest["param_names"]]
    if manifest.get("transform_params"):  # weights into the kernels' layout, once (as TvmArtifact)
        weights = list(vm[manifest["transform_params"]](weights))
    return vm["main"], weights, dev


def tvm_time(folder: str, models: List[str], size: int, runs: int, warmup: int) -> None:
    """Print TVM GPU medians (wall clock per call, device synchronized) and ratios of the
    ``before`` / ``after`` artifacts in ``folder``."""
    import numpy as np
    import tvm.runtime as rt

    x = np.random.default_rng(0).standard_normal((1, 3, size, size)).astype(np.float32)
    for name in models:
        med = {}
        for variant in ("before", "after"):
            main, weights, dev = _tvm_artifact(os.path.join(folder, f"{name}_{variant}"))
            args = [rt.tensor(x, dev)] + weights
            for _ in range(warmup):
                main(*args)
            dev.sync()
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                main(*args)
                dev.sync()
                times.append((time.perf_counter() - start) * 1e3)
            med[variant] = statistics.median(times)
        print(f"{name:<14} {'tvm-cuda':<10} {med['before']:>10.3f} {med['after']:>10.3f} "
              f"{med['before'] / med['after']:>7.2f}x", flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="repvgg_a0,mobileone_s0")
    ap.add_argument("--size", type=int, default=224, help="input height and width (pixels)")
    ap.add_argument("--runs", type=int, default=30, help="timed runs per variant (median shown)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime intra-op threads")
    ap.add_argument("--ort-levels", default="all,off",
                    help="ONNX Runtime graph optimization levels to time: all (ORT_ENABLE_ALL), off "
                         "(ORT_DISABLE_ALL)")
    ap.add_argument("--tvm-dir", help="build TVM CUDA artifacts into this folder (and time them if a "
                                      "CUDA device is present)")
    ap.add_argument("--tvm-target", default="h200")
    ap.add_argument("--tvm-run", help="only time TVM artifacts built earlier in this folder")
    args = ap.parse_args(argv)
    if args.runs < 30:
        ap.error("--runs must be at least 30")
    models = [m for m in args.models.split(",") if m]
    if args.tvm_run:
        print(f"{'model':<14} {'runtime':<10} {'before ms':>10} {'after ms':>10} {'ratio':>8}")
        tvm_time(args.tvm_run, models, args.size, args.runs, args.warmup)
        return 0

    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(REPO / "benchmarks"))  # also run by path from tests/benchmarks
    import numpy as np

    from passctl.support.check import compare, run_onnxruntime
    from reparam_export import timm_export

    from passctl_path import scratch_dir

    work = scratch_dir("reparam-bench-")
    pairs: Dict[str, Dict[str, str]] = {}
    print(f"ONNX Runtime CPU, {args.threads} threads, 1x3x{args.size}x{args.size}, "
          f"median of {args.runs} runs after {args.warmup} warm-up runs")
    print(f"{'model':<14} {'runtime':<10} {'before ms':>10} {'after ms':>10} {'ratio':>8}  "
          f"{'convs':>9}  {'GMACs':>11}  check")
    for name in models:
        src = timm_export(name, args.size)
        out = os.path.join(work, f"{name}_reparam.onnx")
        convs = _reparam_file(src, out)
        pairs[name] = {"before": src, "after": out}
        feeds = {"input": np.random.default_rng(0).standard_normal(
            (1, 3, args.size, args.size)).astype(np.float32)}
        check = compare(run_onnxruntime(src, feeds), run_onnxruntime(out, feeds))
        macs = f"{conv_macs(src) / 1e9:.2f}->{conv_macs(out) / 1e9:.2f}"
        for level in args.ort_levels.split(","):
            times = ort_latency({"before": src, "after": out}, feeds, args.runs, args.warmup,
                                args.threads, level)
            b, a = statistics.median(times["before"]), statistics.median(times["after"])
            print(f"{name:<14} {'ort-' + level:<10} {b:>10.3f} {a:>10.3f} {b / a:>7.2f}x  "
                  f"{convs[0]:>4}->{convs[1]:<4}  {macs:>11}  max_rel {check.max_rel:.1e}", flush=True)

    why = _tvm_status()
    if why is not None:
        print(f"tvm-cuda: n/a: {why}")
    elif not args.tvm_dir:
        print("tvm-cuda: n/a: pass --tvm-dir DIR to build CUDA artifacts (then time them on a GPU "
              "machine with --tvm-run DIR)")
    else:
        built = tvm_build(pairs, args.tvm_dir, args.tvm_target)
        if _cuda_present():
            tvm_time(args.tvm_dir, built, args.size, args.runs, args.warmup)
        else:
            print(f"tvm-cuda: n/a here: no CUDA device; artifacts are in {args.tvm_dir}; time them on "
                  f"the GPU machine: python benchmarks/reparam.py --tvm-run {args.tvm_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
