"""Token generation on the CUDA decoder artifact (``passctl export-decoder SRC -o OUT --target
h200``; layout ``passctl-cuda-triton``, docs/generate.md "On a GPU: the CUDA artifact").

:class:`CudaGenerator` loads ``model.safetensors`` onto the CUDA device, builds a
:class:`~passctl.targets.tvm.triton_decoder.TritonDecoder` (the Triton kernels of
``triton_decode.py`` launched through torch; int8 / int4 weights are quantized at load, round to
nearest, from the float weights the artifact holds) and captures its decode step as one CUDA graph.
``passctl.Generator(OUT)`` returns one for this layout.

Choosing a token: greedy decoding runs on the device (the step's ``argmax_kernel`` writes the next
token where the next replay reads it); the host reads the token (4 bytes, a sync per step) only
when it needs it: streaming (``on_token``), stopping at an end token, or keeping logits; it then
launches the next step before it calls ``on_token``, so the step runs while the host streams.
``temperature > 0`` with ``top_p`` 1 samples on the device too: the captured step ends in
``gumbel_sample_kernel`` (Gumbel-max with Triton's counter-based Philox generator keyed by the
seed and the step; a second graph, captured beside the greedy one). With ``top_p < 1``
the host samples from the step's logits (copied back, a sync per token; the ONNX Runtime
generator's sampler and seed, so the same tokens for the same logits) and writes the token to the
device.

Tests run this module on the CPU under Triton's interpreter: with ``TRITON_INTERPRET=1`` in the
environment (set before Triton is imported) the tensors live on the CPU and no graph is captured.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace
from typing import Callable, Optional

import numpy as np

from passctl.ir.errors import UserError
from passctl.targets.generation import (GenerationResult, check_request, choose_token,
                                        read_manifest)

#: the name of the inverse rotary frequencies in ``model.safetensors`` (float32 [head_dim / 2])
INV_FREQ = "passctl.rotary.inv_freq"


def _interpreted() -> bool:
    """Triton's CPU interpreter is on (tests): tensors on the CPU, no CUDA graph
    (:func:`passctl.targets.tvm.triton_decode.interpreted`)."""
    try:
        from passctl.targets.tvm.triton_decode import interpreted
    except ImportError:  # no Triton: no interpreter either (the no-CUDA message follows)
        return False
    return interpreted()


def cuda_device(folder: str, manifest: dict):
    """The torch device to run on: ``cuda``, or the CPU under Triton's interpreter.

    Raises:
        UserError: torch sees no CUDA device (one line naming the artifact and what it needs).
    """
    import torch

    if _interpreted():
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError(f"'{folder}' runs on a CUDA GPU ({manifest.get('target')} target); torch "
                        "sees no CUDA device: run it on a GPU machine, or export for --target cpu")
    return torch.device("cuda")


class CudaGenerator:
    """Generates tokens with a CUDA decoder artifact (batch 1): prefill through Triton GEMMs and
    FlashAttention, then one CUDA graph replay per token.

    Attributes:
        decoder: the :class:`~passctl.targets.tvm.triton_decoder.TritonDecoder`.
        weight_bytes: bytes of weights one decode step reads (after quantization).
        memory_bandwidth: the target profile's peak memory bandwidth (bytes/s).

    Raises:
        UserError: ``folder`` is no CUDA decoder artifact, its weights are missing, or torch
            sees no CUDA device.
    """

    def __init__(self, folder: str):
        import torch
        from safetensors.torch import load_file

        from passctl.passes.decoder.spec import CUDA_LAYOUT
        from passctl.support.profiles import get_target
        from passctl.targets.tvm import triton_decode as K
        from passctl.targets.tvm.triton_decoder import TritonDecoder

        self.folder = folder
        self.manifest = m = read_manifest(folder)
        if m.get("layout") != CUDA_LAYOUT:
            raise UserError(f"'{folder}' is a {m.get('layout')} artifact, not a CUDA one; use "
                            "passctl.Generator")
        self.device = cuda_device(folder, m)
        path = os.path.join(folder, m["weights_file"])
        if not os.path.isfile(path):
            raise UserError(f"'{folder}': weights '{m['weights_file']}' are missing; export the "
                            "decoder again")
        state = load_file(path, device=str(self.device))
        inv_freq = state.pop(INV_FREQ)
        config = SimpleNamespace(**m["config"])
        self.max_length = int(m["max_length"])
        self.eos_token_ids = tuple(m.get("eos_token_ids", ()))
        pdl = (self.device.type == "cuda" and K.HAS_PDL
               and torch.cuda.get_device_capability(self.device) >= (9, 0))
        self.decoder = TritonDecoder(state, config, self.max_length, wbits=int(m["wbits"]),
                                     group=int(m["group"]), inv_freq=inv_freq,
                                     split=int(m["split"]), layout=m["weight_layout"], pdl=pdl)
        del state
        self.weight_bytes = int(self.decoder.weight_bytes)
        self.memory_bandwidth = get_target(m["target"]).memory_bandwidth
        i32 = dict(device=self.device, dtype=torch.int32)
        self._seed = torch.zeros(1, **i32)  # device sampling: read by the captured graph
        self._inv_temp = torch.ones(1, device=self.device, dtype=torch.float32)
        self._sample_graph = None
        if self.device.type == "cuda":  # the greedy step, and the step ending in the sampler
            self.decoder.capture()
            self._sample_graph = self.decoder.capture(self._sampled_step)
        self._length = 0

    def _sample_on_device(self) -> None:
        """Replace the step's greedy token by a draw from softmax(logits / T) (Gumbel-max,
        ``gumbel_sample_kernel``; seed and 1 / T from device memory)."""
        from passctl.targets.tvm import triton_decode as K

        dec = self.decoder
        K.gumbel_sample_kernel[(1,)](dec.logits, self._seed, self._inv_temp, dec.tok,
                                     dec.out_tokens, dec.step_no, V=dec.V, BLOCK=1024,
                                     num_warps=4)

    def _sampled_step(self) -> None:
        self.decoder.decode_step()
        self._sample_on_device()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)

    def _decode(self, sampled: bool = False) -> None:
        """One decode step: a graph replay on CUDA (with ``sampled``, the graph whose step ends
        in the device sampler), the kernels one by one under the interpreter."""
        dec = self.decoder
        if self.device.type != "cuda":
            (self._sampled_step if sampled else dec.decode_step)()
        elif sampled:
            self._sample_graph.replay()
        else:
            dec.graph.replay()

    # -- the ONNX Runtime generator's reset / step contract --------------------------------
    def reset(self, batch: int = 1) -> None:
        """Start a new prompt (the cache is overwritten from position 0 by the next prefill).

        Raises:
            UserError: ``batch`` is not 1 (the CUDA decode step is batch 1).
        """
        if batch != 1:
            raise UserError(f"batch {batch}: the CUDA decoder runs batch 1")
        self._length = 0

    def step(self, ids) -> np.ndarray:
        """Run ``ids`` (int ``[1, n]``: the prompt after :meth:`reset`, then one token at a time)
        into the cache; returns the last position's logits, float32 ``[1, vocab]``.

        Raises:
            UserError: several tokens after the prompt (one decode step takes one token), or the
                cache has no room.
        """
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 2 or ids.shape[0] != 1:
            raise UserError(f"token ids of shape {ids.shape}: give int [1, tokens]")
        total = self._length + ids.shape[1]
        if total > self.max_length - (1 if self._length == 0 else 0):
            raise UserError(f"{total} tokens do not fit the cache of {self.max_length}; export "
                            "with a larger --max-length or ask for fewer tokens")
        if self._length == 0:
            self.decoder.prefill(ids[0].tolist())
        elif ids.shape[1] != 1:
            raise UserError(f"{ids.shape[1]} tokens after the prompt: the CUDA decoder takes one "
                            "token per step")
        else:
            self.decoder.tok.fill_(int(ids[0, 0]))
            self._decode()
        self._length = total
        return self.decoder.logits.float().cpu().numpy()[None].copy()

    # -- generation ------------------------------------------------------------------------
    def generate(self, ids, max_new_tokens: int = 32, temperature: float = 0.0, top_p: float = 1.0,
                 seed: Optional[int] = None, stop_at_eos: bool = True,
                 return_logits: bool = False,
                 on_token: Optional[Callable[[int], None]] = None) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens after prompt ``ids`` (batch 1); the arguments
        and result are those of :meth:`passctl.targets.onnxruntime.generate.Generator.generate`,
        plus ``weight_bytes`` / ``memory_bandwidth`` in the result (its ``bandwidth_fraction``).

        Raises:
            UserError: as the ONNX Runtime generator; a batch of several rows; a prompt that
                fills the whole cache.
        """
        prompt = check_request(ids, max_new_tokens, temperature, top_p, self.manifest)
        if prompt.shape[0] != 1:
            raise UserError(f"{prompt.shape[0]} prompt rows: the CUDA decoder runs batch 1")
        if prompt.shape[1] >= self.max_length:
            raise UserError(f"prompt of {prompt.shape[1]} tokens fills the cache of "
                            f"{self.max_length}; export with a larger --max-length")
        dec, n = self.decoder, int(max_new_tokens)
        sample = temperature > 0 and top_p < 1  # nucleus sampling: on the host
        on_device = temperature > 0 and not sample  # plain temperature: Gumbel-max on the device
        rng = np.random.default_rng(seed) if sample else None
        if on_device:
            if seed is None:
                seed = int(np.random.default_rng().integers(0, 2**31 - 1))
            self._seed.fill_(int(seed) & 0x7FFFFFFF)
            self._inv_temp.fill_(1.0 / float(temperature))
        eos = self.eos_token_ids if stop_at_eos else ()
        # greedy tokens stay on the device unless someone needs each one as it comes
        per_step = sample or bool(eos) or on_token is not None or return_logits
        chosen, kept, seen = [], [], []  # seen: when each token was known on the host
        start = time.perf_counter()
        self.reset(1)
        dec.prefill(prompt[0].tolist())
        if on_device:
            self._sample_on_device()
        self._length = prompt.shape[1]
        for k in range(n):
            if k:
                if sample:  # else launched right after the previous token was read
                    self._decode()
                self._length += 1
            if return_logits:
                kept.append(dec.logits.clone())
            if sample:
                token = int(choose_token(dec.logits.float().cpu().numpy()[None], temperature, top_p,
                                    rng)[0])
                dec.tok.fill_(token)
            elif per_step or k == 0:
                token = int(dec.tok.item())  # waits for the step
            else:
                token = None
            seen.append(time.perf_counter())
            if token is not None:
                chosen.append(token)
            last = k + 1 == n or (token is not None and token in eos)
            if not sample and not last:
                # the next step reads its token on the device: it runs while the host streams
                self._decode(sampled=on_device)
            if on_token is not None:
                on_token(token)
            if last:
                break
        ttft = seen[0] - start
        if per_step:
            steps = [b - a for a, b in zip(seen, seen[1:])]
        else:  # read the greedy tokens once, after the last step
            self._sync()
            steps = [time.perf_counter() - seen[0]]
            chosen = [int(t) for t in dec.out_tokens[:n].tolist()]
        logits = (np.stack([t.float().cpu().numpy() for t in kept])[None]
                  if return_logits else None)
        return GenerationResult(
            tokens=np.array([chosen], np.int64), prompt_tokens=int(prompt.shape[1]),
            time_to_first_token_s=ttft, decode_s=float(sum(steps)), logits=logits,
            step_s=steps if per_step else [], weight_bytes=self.weight_bytes,
            memory_bandwidth=self.memory_bandwidth)


__all__ = ["CudaGenerator", "INV_FREQ", "cuda_device"]
