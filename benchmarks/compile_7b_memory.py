"""Memory of compiling a LLaMA-7B-shape decoder: passctl's int4 pipeline against onnxsim, peak RSS and time.

Run ``python benchmarks/compile_7b_memory.py --workdir /big/folder`` (defaults: LLaMA-7B shape, hidden
4096, 32 layers, 32 heads, FFN 11008, vocab 32000, sequence 16: 13.5 GB of fp16 external data).

1. **Write the model without torch** (:func:`write_model`): an ``onnx.helper`` graph of a Llama decoder
   prefill as the dynamo exporter / onnxruntime-genai's builder write it (Gather embedding; RMSNorm as
   Pow/ReduceMean/Add/Sqrt/Div/Mul; MatMul projections with ``[in, out]`` weights; rotary embedding as
   Mul/Slice/Concat/Neg on constant cos/sin tables; causal attention MatMul/Div/Add(mask)/Softmax/MatMul;
   SiLU MLP ``down(silu(gate(x)) * up(x))``; final norm and LM head). Weights are random normal, std
   0.02 (norm weights 1 + N(0, 0.02)), written chunk by chunk into one external-data file, so the writer
   holds at most :data:`CHUNK_ELEMS` values, never a whole tensor.
2. **passctl**: ``passctl compile MODEL --pipeline 'cleanup,fuse,flash-attn,quantize-weights{bits=4}'
   --target cpu -o OUT`` (round-to-nearest int4, no calibration) as a subprocess.
3. **onnxsim**: ``onnxsim MODEL OUT`` (its command line, from ``--onnxsim`` (default
   ``/work/venvs/onnxsim/bin/onnxsim``)) as a subprocess, with a timeout.

Each subprocess runs under ``nice``; its peak RSS is ``ru_maxrss`` of ``os.wait4`` for that one child,
taken by a small launcher process so the caller's own size does not leak into it (KiB on Linux,
reported here in GB = 1e9 bytes) and its time is wall-clock seconds from spawn to exit.
The table says what each tool did (exit status, the last line of its error output, or "timed out").
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PIPELINE = "cleanup,fuse,flash-attn,quantize-weights{bits=4}"
CHUNK_ELEMS = 1 << 22  # values generated and written per step (8 MiB of fp16)
ALIGN = 4096  # external-data offsets are page aligned (as onnx.save_model's align_offset does)


@dataclass(frozen=True)
class LlamaShape:
    """Sizes of a Llama decoder (LLaMA-7B by default). ``seq``: the fixed prefill length."""

    layers: int = 32
    hidden: int = 4096
    heads: int = 32
    ffn: int = 11008
    vocab: int = 32000
    seq: int = 16
    eps: float = 1e-6
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def weight_shapes(self):
        """(name, shape) of every weight initializer, in file order."""
        h, f, v = self.hidden, self.ffn, self.vocab
        out = [("model.embed_tokens.weight", (v, h))]
        for i in range(self.layers):
            p = f"model.layers.{i}"
            out += [(f"{p}.input_layernorm.weight", (h,)),
                    (f"{p}.self_attn.q_proj.weight", (h, h)),
                    (f"{p}.self_attn.k_proj.weight", (h, h)),
                    (f"{p}.self_attn.v_proj.weight", (h, h)),
                    (f"{p}.self_attn.o_proj.weight", (h, h)),
                    (f"{p}.post_attention_layernorm.weight", (h,)),
                    (f"{p}.mlp.gate_proj.weight", (h, f)),
                    (f"{p}.mlp.up_proj.weight", (h, f)),
                    (f"{p}.mlp.down_proj.weight", (f, h))]
        out += [("model.norm.weight", (h,)), ("lm_head.weight", (h, v))]
        return out

    def data_bytes(self) -> int:
        return sum(2 * int(np.prod(s)) for _, s in self.weight_shapes())


def _write_random(f, shape, rng: np.random.Generator, norm: bool) -> None:
    """Append prod(shape) fp16 values N(0, 0.02) (norm weights: 1 + N(0, 0.02)) in chunks."""
    n = int(np.prod(shape))
    done = 0
    while done < n:
        k = min(CHUNK_ELEMS, n - done)
        x = rng.standard_normal(k, dtype=np.float32)
        x *= 0.02
        if norm:
            x += 1.0
        f.write(x.astype("<f2").tobytes())
        done += k


def write_model(path: str, shape: LlamaShape = LlamaShape(), seed: int = 0) -> int:
    """Write the decoder to ``path`` with its weights in ``<path>.data`` (fp16, external).

    Graph inputs: ``input_ids`` int64 ``[1, seq]``; output ``logits`` fp16 ``[1, seq, vocab]``. The
    rotary tables (``cos``/``sin`` fp16 ``[1, 1, seq, head_dim]``, rotate-half convention of HF Llama,
    theta ``rope_theta``) and the causal mask (fp16 ``[1, 1, seq, seq]``, 0 on and below the diagonal,
    -65504 above) are small inline initializers.

    Returns:
        Bytes of external data written.
    """
    import onnx
    from onnx import TensorProto, helper

    folder = os.path.dirname(os.path.abspath(path))
    data_name = os.path.basename(path) + ".data"
    rng = np.random.default_rng(seed)
    inits: List[onnx.TensorProto] = []
    with open(os.path.join(folder, data_name), "wb") as f:
        for name, shp in shape.weight_shapes():
            pad = (-f.tell()) % ALIGN
            if pad:
                f.write(b"\0" * pad)
            offset = f.tell()
            _write_random(f, shp, rng, norm=name.endswith("norm.weight"))
            t = TensorProto(name=name, data_type=TensorProto.FLOAT16, dims=list(shp))
            t.data_location = TensorProto.EXTERNAL
            for k, val in (("location", data_name), ("offset", str(offset)),
                           ("length", str(f.tell() - offset))):
                e = t.external_data.add()
                e.key, e.value = k, val
            inits.append(t)
        total = f.tell()

    s, hd, nh, h = shape.seq, shape.head_dim, shape.heads, shape.hidden
    inv_freq = 1.0 / (shape.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    freqs = np.outer(np.arange(s, dtype=np.float64), inv_freq)
    emb = np.concatenate([freqs, freqs], axis=-1)[None, None]
    mask = np.triu(np.full((s, s), -65504.0), k=1)[None, None]

    def const(name, arr, dtype=None):
        arr = np.asarray(arr, dtype=dtype)
        inits.append(onnx.numpy_helper.from_array(arr, name))
        return name

    f16 = np.float16
    const("rope.cos", np.cos(emb), f16)
    const("rope.sin", np.sin(emb), f16)
    const("attn.causal_mask", mask, f16)
    const("c.two", 2.0, f16)
    const("c.one", 1.0, f16)
    const("c.eps", shape.eps, f16)
    const("c.sqrt_hd", np.sqrt(hd), f16)
    const("shape.bsnh", [1, s, nh, hd], np.int64)
    const("shape.bsh", [1, s, h], np.int64)
    const("i.0", [0], np.int64)
    const("i.half", [hd // 2], np.int64)
    const("i.end", [np.iinfo(np.int64).max], np.int64)
    const("i.last", [-1], np.int64)

    nodes: List[onnx.NodeProto] = []

    def node(op, inputs, name, **attrs):
        out = f"{name}_out"
        nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def rmsnorm(x, weight, p):
        sq = node("Pow", [x, "c.two"], f"{p}/Pow")
        var = node("ReduceMean", [sq, "i.last"], f"{p}/ReduceMean", keepdims=1)
        var = node("Add", [var, "c.eps"], f"{p}/Add")
        root = node("Sqrt", [var], f"{p}/Sqrt")
        inv = node("Div", ["c.one", root], f"{p}/Div")
        y = node("Mul", [x, inv], f"{p}/Mul")
        return node("Mul", [weight, y], f"{p}/Mul_1")

    def heads(x, p):  # [1, S, H] -> [1, nh, S, hd]
        r = node("Reshape", [x, "shape.bsnh"], f"{p}/Reshape")
        return node("Transpose", [r], f"{p}/Transpose", perm=[0, 2, 1, 3])

    def rotary(x, p):
        x1 = node("Slice", [x, "i.0", "i.half", "i.last"], f"{p}/Slice")
        x2 = node("Slice", [x, "i.half", "i.end", "i.last"], f"{p}/Slice_1")
        rot = node("Concat", [node("Neg", [x2], f"{p}/Neg"), x1], f"{p}/Concat", axis=-1)
        a = node("Mul", [x, "rope.cos"], f"{p}/Mul")
        b = node("Mul", [rot, "rope.sin"], f"{p}/Mul_1")
        return node("Add", [a, b], f"{p}/Add")

    x = node("Gather", ["model.embed_tokens.weight", "input_ids"], "/model/embed_tokens/Gather")
    for i in range(shape.layers):
        p, w = f"/model/layers.{i}", f"model.layers.{i}"
        xn = rmsnorm(x, f"{w}.input_layernorm.weight", f"{p}/input_layernorm")
        q = node("MatMul", [xn, f"{w}.self_attn.q_proj.weight"], f"{p}/self_attn/q_proj/MatMul")
        k = node("MatMul", [xn, f"{w}.self_attn.k_proj.weight"], f"{p}/self_attn/k_proj/MatMul")
        v = node("MatMul", [xn, f"{w}.self_attn.v_proj.weight"], f"{p}/self_attn/v_proj/MatMul")
        q = rotary(heads(q, f"{p}/self_attn/q"), f"{p}/self_attn/rotary_q")
        k = rotary(heads(k, f"{p}/self_attn/k"), f"{p}/self_attn/rotary_k")
        v = heads(v, f"{p}/self_attn/v")
        kt = node("Transpose", [k], f"{p}/self_attn/Transpose_kt", perm=[0, 1, 3, 2])
        scores = node("MatMul", [q, kt], f"{p}/self_attn/MatMul")
        scores = node("Div", [scores, "c.sqrt_hd"], f"{p}/self_attn/Div")
        scores = node("Add", [scores, "attn.causal_mask"], f"{p}/self_attn/Add")
        probs = node("Softmax", [scores], f"{p}/self_attn/Softmax", axis=-1)
        ctx = node("MatMul", [probs, v], f"{p}/self_attn/MatMul_1")
        ctx = node("Transpose", [ctx], f"{p}/self_attn/Transpose_out", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, "shape.bsh"], f"{p}/self_attn/Reshape_out")
        o = node("MatMul", [ctx, f"{w}.self_attn.o_proj.weight"], f"{p}/self_attn/o_proj/MatMul")
        x = node("Add", [x, o], f"{p}/Add")
        xn = rmsnorm(x, f"{w}.post_attention_layernorm.weight", f"{p}/post_attention_layernorm")
        g = node("MatMul", [xn, f"{w}.mlp.gate_proj.weight"], f"{p}/mlp/gate_proj/MatMul")
        u = node("MatMul", [xn, f"{w}.mlp.up_proj.weight"], f"{p}/mlp/up_proj/MatMul")
        act = node("Mul", [g, node("Sigmoid", [g], f"{p}/mlp/act_fn/Sigmoid")], f"{p}/mlp/act_fn/Mul")
        d = node("MatMul", [node("Mul", [act, u], f"{p}/mlp/Mul"), f"{w}.mlp.down_proj.weight"],
                 f"{p}/mlp/down_proj/MatMul")
        x = node("Add", [x, d], f"{p}/Add_1")
    xn = rmsnorm(x, "model.norm.weight", "/model/norm")
    nodes.append(helper.make_node("MatMul", [xn, "lm_head.weight"], ["logits"], name="/lm_head/MatMul"))

    graph = helper.make_graph(
        nodes, "llama_decoder_prefill",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, s])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT16, [1, s, shape.vocab])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                              producer_name="passctl.benchmarks.compile_7b_memory")
    model.ir_version = 9
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return total


@dataclass
class RunResult:
    tool: str
    rc: Optional[int]
    seconds: float
    peak_rss_bytes: int
    note: str


# The launcher between the caller and the measured command. ``ru_maxrss`` of a child is not its own
# peak alone: at exec, Linux keeps the high-water RSS of the memory image the child was forked from
# (``setmax_mm_hiwater_rss`` in fs/exec.c), so a command spawned from a pytest worker holding 1.6 GB
# reports at least 1.6 GB (seen on CI: 1.63 GB for a 0.43 GB compile). A fresh, small interpreter
# in between forks the command from its own ~10 MB image and reports the command's rusage.
_LAUNCHER = """
import os, subprocess, sys
p = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(p.pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}")
"""


def _descendants_hwm_bytes(pid: int) -> int:
    """Sum of ``VmHWM`` (peak resident set, /proc/PID/status) over the live descendants of ``pid``
    (not ``pid`` itself); processes already gone count 0."""
    total, stack = 0, [pid]
    while stack:
        p = stack.pop()
        try:
            if p != pid:
                with open(f"/proc/{p}/status") as f:
                    total += next((int(ln.split()[1]) * 1024 for ln in f
                                   if ln.startswith("VmHWM:")), 0)
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    stack.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return total


def run_measured(tool: str, cmd: Sequence[str], timeout: Optional[float], log_path: str,
                 env: Optional[dict] = None) -> RunResult:
    """Run ``cmd`` under ``nice -n 10``; its own peak RSS in bytes (``ru_maxrss``, KiB on Linux).

    The command is spawned by a small launcher interpreter (:data:`_LAUNCHER`) so that its
    ``ru_maxrss`` is not raised to the caller's resident size. stdout and stderr go to
    ``log_path``. On timeout the process group is killed (SIGKILL), ``rc`` is None and the peak
    is the largest ``VmHWM`` sum of the launcher's descendants read from /proc while they ran
    (polled every 50 ms).
    """
    import tempfile

    start = time.perf_counter()
    fd, result_path = tempfile.mkstemp(prefix="passctl-maxrss-")
    os.close(fd)
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, result_path, "nice", "-n", "10",
                                     *cmd], stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
            deadline = None if timeout is None else start + timeout
            polled = 0
            while proc.poll() is None:
                polled = max(polled, _descendants_hwm_bytes(proc.pid))
                if deadline is not None and time.perf_counter() > deadline:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    break
                time.sleep(0.05)
        seconds = time.perf_counter() - start
        with open(result_path) as f:
            text = f.read().split()
    finally:
        os.unlink(result_path)
    rc = int(text[0]) if len(text) == 2 else None
    peak = int(text[1]) * 1024 if len(text) == 2 else polled
    with open(log_path, "rb") as log:
        lines = [ln for ln in log.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    if rc is None:
        note = (f"timed out after {timeout:.0f} s (killed)" if timeout is not None
                else "launcher failed")
    elif rc == 0:
        note = "ok"
    else:
        note = f"exit {rc}: " + (lines[-1][:160] if lines else "(no output)")
    return RunResult(tool, rc, seconds, peak, note)


def passctl_command(model: str, out: str, python: str = sys.executable) -> List[str]:
    return [python, "-m", "passctl.tools.cli", "compile", model, "--pipeline", PIPELINE,
            "--target", "cpu", "-o", out]


def _dir_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(folder) for f in fs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", required=True, help="folder for the model and outputs (needs ~25 GB "
                                                     "at 7B); removed at the end unless --keep")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--ffn", type=int, default=11008)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--tools", default="passctl,onnxsim")
    ap.add_argument("--onnxsim", default="/work/venvs/onnxsim/bin/onnxsim")
    ap.add_argument("--onnxsim-timeout", type=float, default=3600.0, help="seconds")
    ap.add_argument("--reuse-model", action="store_true", help="keep an existing model.onnx")
    ap.add_argument("--keep", action="store_true", help="leave the workdir in place")
    args = ap.parse_args(argv)

    shape = LlamaShape(args.layers, args.hidden, args.heads, args.ffn, args.vocab, args.seq)
    os.makedirs(args.workdir, exist_ok=True)
    model = os.path.join(args.workdir, "model.onnx")
    if not (args.reuse_model and os.path.exists(model)):
        t0 = time.perf_counter()
        n = write_model(model, shape)
        print(f"wrote {model}: {n / 1e9:.2f} GB external data in {time.perf_counter() - t0:.0f} s",
              flush=True)
    data_gb = os.path.getsize(model + ".data") / 1e9
    results = []
    try:
        for tool in args.tools.split(","):
            out = os.path.join(args.workdir, f"out-{tool}")
            shutil.rmtree(out, ignore_errors=True)
            log = os.path.join(args.workdir, f"{tool}.log")
            if tool == "passctl":
                r = run_measured(tool, passctl_command(model, out), None, log)
            elif tool == "onnxsim":
                if not os.path.exists(args.onnxsim):
                    results.append(RunResult(tool, None, 0.0, 0, f"not installed ({args.onnxsim})"))
                    continue
                os.makedirs(out, exist_ok=True)
                r = run_measured(tool, [args.onnxsim, model, os.path.join(out, "model.onnx")],
                                 args.onnxsim_timeout, log)
            else:
                raise SystemExit(f"unknown tool '{tool}' (passctl, onnxsim)")
            if os.path.isdir(out):
                r.note += f"; output {_dir_bytes(out) / 1e9:.2f} GB"
            results.append(r)
            print(f"{tool}: {r.seconds:.0f} s, peak RSS {r.peak_rss_bytes / 1e9:.2f} GB, {r.note}",
                  flush=True)
            shutil.rmtree(out, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)
    print(f"\nLlama decoder {shape.layers} layers, hidden {shape.hidden}, FFN {shape.ffn}, vocab "
          f"{shape.vocab}, seq {shape.seq}: {data_gb:.2f} GB fp16 external data")
    print(f"{'tool':<8} {'wall s':>8} {'peak RSS GB':>12}  result")
    for r in results:
        print(f"{r.tool:<8} {r.seconds:>8.1f} {r.peak_rss_bytes / 1e9:>12.2f}  {r.note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
