"""Token generation on a decoder artifact (``passctl export-decoder``) with ONNX Runtime.

An artifact folder holds ``decoder.json`` (the manifest: layout, cache length, architecture,
tokenizer folder), the ONNX model and its weights, and ``tokenizer/`` (the model's own tokenizer
files). Two layouts run (docs/generate.md):

* ``passctl-static-kv`` (what ``export-decoder`` builds from a transformers model): one
  preallocated cache buffer per layer, bound as both ``past_key_values.N.*`` input and
  ``present.N.*`` output, written in place by GroupQueryAttention; a decode step has fixed shapes.
* ``past-key-values`` (decoder ONNX as Optimum / onnxruntime-genai export it): the cache grows by
  one position per step (``input_ids``, ``attention_mask``, optional ``position_ids``,
  ``past_key_values.N.key/value`` [batch, kv_heads, past, head_dim] -> ``logits``,
  ``present.N.key/value``).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from passctl.ir.errors import UserError
from passctl.passes.decoder.layout import STATIC_LAYOUT
from passctl.passes.decoder.spec import CUDA_LAYOUT
# load_tokenizer / GenerationResult are re-exported (``from passctl.targets.onnxruntime.generate
# import load_tokenizer``, docs/generate.md)
from passctl.targets.generation import (MANIFEST, GenerationResult, check_request, choose_token,
                                        load_tokenizer, read_manifest)



_MADV_COLLAPSE = 25  # linux/mman.h (Linux 6.1+)
_HUGE_PAGE = 2 << 20


def _anonymous_ranges() -> List[tuple]:
    """``[(start, end)]`` of this process's private writable anonymous mappings
    (``/proc/self/maps``); empty where there is no such file (not Linux)."""
    ranges = []
    try:
        with open("/proc/self/maps", encoding="ascii") as f:
            for line in f:
                parts = line.split()
                if parts[1].startswith("rw") and parts[4] == "0" and \
                        (len(parts) < 6 or parts[5] == "[heap]"):
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    ranges.append((lo, hi))
    except OSError:
        return []
    return ranges


def _subtract(span: tuple, cover: Sequence[tuple]) -> List[tuple]:
    """The parts of ``span`` (start, end) outside every range of ``cover``."""
    pieces = [span]
    for c0, c1 in cover:
        kept = []
        for a, b in pieces:
            if c1 <= a or c0 >= b:
                kept.append((a, b))
                continue
            if a < c0:
                kept.append((a, c0))
            if c1 < b:
                kept.append((c1, b))
        pieces = kept
    return pieces


def _collapse_new_memory(before: Sequence[tuple]) -> int:
    """Ask Linux to back the anonymous memory mapped since ``before`` (a
    :func:`_anonymous_ranges` snapshot taken before the session was built: ONNX Runtime's
    prepacked weights) with 2 MB transparent huge pages, ``madvise(MADV_COLLAPSE)``; returns the
    bytes collapsed (0 where the kernel refuses or is not Linux). Decode streams every weight once a
    token, so with 4 KB pages each 4 KB of weights costs a TLB miss; SmolLM2-135M's 538 MB on a
    2-core EPYC measured about 10% more tokens/s with huge pages
    (benchmarks/results/generate_cpu-2026-12-02c.md). The contents do not change."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return 0
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int
    done = 0
    for span in _anonymous_ranges():
        pieces = _subtract(span, before)  # only memory that was not there before
        for a, b in pieces:
            lo = (a + _HUGE_PAGE - 1) // _HUGE_PAGE * _HUGE_PAGE
            hi = b // _HUGE_PAGE * _HUGE_PAGE
            if hi - lo >= _HUGE_PAGE and madvise(lo, hi - lo, _MADV_COLLAPSE) == 0:
                done += hi - lo
    return done


def spare_core() -> bool:
    """True when the machine has a core to spare for spin-waiting: the 1-minute load average
    (``os.getloadavg``, which counts this process too) is below the core count minus 0.5. True
    where the load average is unknown (ONNX Runtime's default: spinning workers)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return True
    return load < (os.cpu_count() or 1) - 0.5


class Generator:
    """Generates tokens with a decoder artifact in ONNX Runtime (cpu).

    ``Generator(OUT).generate(ids, max_new_tokens=64)``: greedy by default. For the CUDA artifact
    (``export-decoder --target h200``; layout ``passctl-cuda-triton``) ``Generator(OUT)`` returns
    a :class:`passctl.targets.tvm.cuda_generate.CudaGenerator` (same ``generate`` / ``reset`` /
    ``step`` contract; ``threads`` and ``huge_pages`` do not apply).

    Args:
        folder: the output folder of ``passctl export-decoder``.
        threads: ONNX Runtime intra-op threads (None: ONNX Runtime's default, one per core).
        huge_pages: back the session's weights with 2 MB pages (Linux ``MADV_COLLAPSE``, see
            :func:`_collapse_new_memory`; silently nothing where unsupported). ``huge_page_bytes``
            says how many bytes were collapsed.
        spinning: let ONNX Runtime's intra-op worker threads spin-wait for work
            (``session.intra_op.allow_spinning``, ONNX Runtime's default) or sleep between kernels
            and steps (False). None (default): :func:`spare_core`, i.e. spin only when the
            machine has a core to spare. Measured on the 2-core VM, SmolLM2-135M, same artifacts
            (benchmarks/results/generate_cpu-2026-12-07.md): at load average ~5-7 sleeping
            workers decoded 2.1-2.5x faster (fp32) and 1.5-1.8x (int4); on the quiet machine
            (load ~1, the benchmark itself) spinning ones 1.19x (fp32) and 1.34x (int4). The
            logits are bitwise equal either way; ``self.spinning`` says what was chosen.

    Raises:
        UserError: ``folder`` is no decoder artifact (see :func:`read_manifest`), or its model
            file is missing.
    """

    def __new__(cls, folder: str, *args, **kwargs):
        if cls is Generator and read_manifest(folder).get("layout") == CUDA_LAYOUT:
            # the CUDA artifact (export-decoder --target h200 ...): the Triton decode step
            from passctl.targets.tvm.cuda_generate import CudaGenerator

            return CudaGenerator(folder)
        return super().__new__(cls)

    def __init__(self, folder: str, threads: Optional[int] = None, huge_pages: bool = True,
                 spinning: Optional[bool] = None):
        import onnxruntime as ort

        self.folder = folder
        self.manifest = read_manifest(folder)
        self.layout = self.manifest["layout"]
        path = self.manifest["model"]
        path = path if os.path.isabs(path) else os.path.join(folder, path)
        if not os.path.isfile(path):
            raise UserError(f"{os.path.join(folder, MANIFEST)}: model '{path}' is missing; export "
                            "the decoder again")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = int(threads)
        self.spinning = spare_core() if spinning is None else bool(spinning)
        options.add_session_config_entry("session.intra_op.allow_spinning",
                                         "1" if self.spinning else "0")
        before = _anonymous_ranges() if huge_pages else None
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.huge_page_bytes = _collapse_new_memory(before) if huge_pages else 0
        self._ort = ort
        self.num_layers = int(self.manifest["num_layers"])
        self.max_length = self.manifest.get("max_length")  # None: the dynamic layout
        self.eos_token_ids = tuple(self.manifest.get("eos_token_ids", ()))
        self._input_names = {i.name for i in self.session.get_inputs()}
        self._length = 0
        self._batch = None

    # -- the cache -------------------------------------------------------------------------
    def reset(self, batch: int = 1) -> None:
        """Empty the cache (for a new prompt of ``batch`` rows)."""
        kv, hd = int(self.manifest["num_kv_heads"]), int(self.manifest["head_dim"])
        self._length, self._batch = 0, batch
        if self.layout == STATIC_LAYOUT:
            shape = (batch, kv, int(self.max_length), hd)
            self._cache = [self._ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32))
                           for _ in range(2 * self.num_layers)]
            self._logits = self._ort.OrtValue.ortvalue_from_numpy(
                np.zeros((batch, 1, int(self.manifest["vocab_size"])), np.float32))
            binding = self.session.io_binding()
            for i in range(self.num_layers):
                for j, kind in enumerate(("key", "value")):
                    value = self._cache[2 * i + j]
                    binding.bind_ortvalue_input(f"past_key_values.{i}.{kind}", value)
                    # the same buffer: GroupQueryAttention writes the new rows in place
                    binding.bind_ortvalue_output(f"present.{i}.{kind}", value)
            binding.bind_ortvalue_output("logits", self._logits)
            self._binding = binding
        else:
            self._past = {f"past_key_values.{i}.{kind}": np.zeros((batch, kv, 0, hd), np.float32)
                          for i in range(self.num_layers) for kind in ("key", "value")}

    def step(self, ids: np.ndarray) -> np.ndarray:
        """Run ``ids`` (int64 ``[batch, n]``: the prompt, or the last chosen token) through the
        model, appending them to the cache; returns the last position's logits float32
        ``[batch, vocab]``.

        Raises:
            UserError: the cache has no room for ``n`` more tokens.
        """
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if ids.ndim != 2 or (self._batch is not None and ids.shape[0] != self._batch):
            raise UserError(f"token ids of shape {ids.shape}: give int64 [batch, tokens] with the "
                            "batch of reset()")
        n, total = ids.shape[1], self._length + ids.shape[1]
        if self.max_length is not None and total > int(self.max_length):
            raise UserError(f"{total} tokens do not fit the cache of {self.max_length}; export "
                            f"with a larger --max-length or ask for fewer tokens")
        if self.layout == STATIC_LAYOUT:
            b = self._binding
            b.bind_cpu_input("input_ids", ids)
            b.bind_cpu_input("seqlens_k", np.full((ids.shape[0],), total - 1, np.int32))
            b.bind_cpu_input("total_sequence_length", np.array(total, np.int32))
            self.session.run_with_iobinding(b)
            logits = self._logits.numpy()[:, -1, :].copy()  # the buffer is reused next step
        else:
            feeds: Dict[str, np.ndarray] = {"input_ids": ids, **self._past}
            if "attention_mask" in self._input_names:
                feeds["attention_mask"] = np.ones((ids.shape[0], total), np.int64)
            if "position_ids" in self._input_names:
                feeds["position_ids"] = np.broadcast_to(
                    np.arange(self._length, total, dtype=np.int64), ids.shape).copy()
            names = [o.name for o in self.session.get_outputs()]
            values = dict(zip(names, self.session.run(names, feeds)))
            self._past = {k: values[k.replace("past_key_values.", "present.")] for k in self._past}
            logits = values["logits"][:, -1, :]
        self._length = total
        return logits

    # -- generation ------------------------------------------------------------------------
    def generate(self, ids, max_new_tokens: int = 32, temperature: float = 0.0, top_p: float = 1.0,
                 seed: Optional[int] = None, stop_at_eos: bool = True,
                 return_logits: bool = False,
                 on_token: Optional[Callable[[int], None]] = None) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens after prompt ``ids``.

        Args:
            ids: int prompt ids, ``[tokens]`` or ``[batch, tokens]`` (rows of equal length).
            max_new_tokens: how many tokens to generate (>= 1).
            temperature: 0 is greedy (argmax); > 0 samples from softmax(logits / temperature).
            top_p: nucleus sampling mass in (0, 1] (used when temperature > 0).
            seed: seed of the sampler (numpy ``default_rng``).
            stop_at_eos: stop once every row produced one of the model's end tokens.
            return_logits: keep each step's logits in the result.
            on_token: called with each new id of row 0 as soon as it is chosen (streaming).

        Returns:
            :class:`GenerationResult` (tokens, timings: time to first token, ms/token, tokens/s).

        Raises:
            UserError: empty prompt, bad arguments, or prompt plus ``max_new_tokens`` longer
                than the cache (one line: the lengths and what to change).
        """
        prompt = check_request(ids, max_new_tokens, temperature, top_p, self.manifest)
        rng = np.random.default_rng(seed) if temperature > 0 else None
        start = time.perf_counter()
        self.reset(prompt.shape[0])
        logits = self.step(prompt.astype(np.int64))
        chosen, kept, steps = [], [], []
        done = np.zeros(prompt.shape[0], bool)
        ttft = 0.0
        for k in range(int(max_new_tokens)):
            if k:
                t0 = time.perf_counter()
                logits = self.step(chosen[-1][:, None])
            token = choose_token(logits, temperature, top_p, rng)
            if return_logits:
                kept.append(logits.copy())
            chosen.append(token)
            now = time.perf_counter()
            if k == 0:
                ttft = now - start
            else:
                steps.append(now - t0)
            if on_token is not None:
                on_token(int(token[0]))
            if stop_at_eos and self.eos_token_ids:
                done |= np.isin(token, self.eos_token_ids)
                if done.all():
                    break
        return GenerationResult(
            tokens=np.stack(chosen, axis=1), prompt_tokens=int(prompt.shape[1]),
            time_to_first_token_s=ttft, decode_s=float(sum(steps)),
            logits=np.stack(kept, axis=1) if return_logits else None, step_s=steps)


__all__ = ["Generator", "GenerationResult", "MANIFEST", "load_tokenizer", "read_manifest",
           "spare_core"]
