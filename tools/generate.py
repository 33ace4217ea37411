"""``passctl generate OUT --prompt TEXT``: stream generated text from a decoder artifact."""

from __future__ import annotations

import argparse
import sys

from passctl.ir.errors import UserError


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a token count: give an integer >= 1")
    return value


def _seed(text: str) -> int:
    """``--seed``: an integer >= 0 (numpy's ``default_rng`` refuses negative seeds)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a seed: give an integer >= 0, e.g. 0")
    return value


def _float_in(low: float, high: float, what: str, low_open: bool = False):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        ok = (value > low if low_open else value >= low) and value <= high
        if not ok:
            raise argparse.ArgumentTypeError(f"'{text}' is not a {what}: give a number in "
                                             f"{'(' if low_open else '['}{low:g}, {high:g}]")
        return value
    return parse


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text with a decoder artifact "
                       "(passctl export-decoder), streaming tokens")
    p.add_argument("artifact", help="output folder of `passctl export-decoder`")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", metavar="FILE", help="UTF-8 text file with the prompt")
    p.add_argument("--max-new-tokens", type=_positive_int, default=64,
                   help="tokens to generate (default 64)")
    p.add_argument("--temperature", type=_float_in(0.0, 100.0, "temperature"), default=0.0,
                   help="0 (default): greedy; > 0: sample from softmax(logits / T)")
    p.add_argument("--top-p", type=_float_in(0.0, 1.0, "top-p mass", low_open=True), default=1.0,
                   help="nucleus sampling mass (with --temperature > 0; default 1)")
    p.add_argument("--seed", type=_seed, default=0, help="sampler seed (default 0)")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt in the model's chat template as one user message")
    p.add_argument("--ignore-eos", action="store_true",
                   help="do not stop at the model's end token")
    p.add_argument("--threads", type=_positive_int, default=None,
                   help="ONNX Runtime threads (default: one per core)")
    p.add_argument("-q", "--quiet", action="store_true", help="text only, no timing line")


def _prompt_text(args) -> str:
    if args.prompt is not None:
        text = args.prompt
    else:
        try:
            with open(args.prompt_file, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise UserError(f"prompt file '{args.prompt_file}' not found") from None
        except IsADirectoryError:
            raise UserError(f"prompt file '{args.prompt_file}' is a folder; give a text file") \
                from None
        except UnicodeDecodeError:
            raise UserError(f"prompt file '{args.prompt_file}' is not UTF-8 text") from None
        except OSError as e:
            raise UserError(f"prompt file '{args.prompt_file}': {e.strerror}") from None
    if not text.strip():
        raise UserError("the prompt is empty; give some text with --prompt or --prompt-file")
    return text


def _chat(folder: str, manifest: dict, text: str) -> str:
    """``text`` as one user message through the chat template saved with the tokenizer."""
    import os

    sub = manifest.get("tokenizer")
    if not sub:
        raise UserError(f"'{folder}' has no tokenizer, so no chat template; drop --chat")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(os.path.join(folder, sub),
                                                     local_files_only=True)
    if not getattr(tok, "chat_template", None):
        raise UserError(f"'{folder}': the tokenizer has no chat template; drop --chat")
    return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                   add_generation_prompt=True)


def _streamed(manifest: dict, result) -> str:
    """``, weights read at X GB/s``: weight bytes x decode tokens/s (every decode step reads every
    weight once), when the weight size is known (the result's, else the manifest's); with the
    device's peak bandwidth known (the CUDA artifact's target), also the fraction of it."""
    size = getattr(result, "weight_bytes", None) or manifest.get("weight_bytes")
    rate = result.tokens_per_s
    if not size or rate != rate:
        return ""
    text = f", weights read at {size * rate / 1e9:.1f} GB/s"
    peak = getattr(result, "memory_bandwidth", None)
    if peak:
        text += (f" ({100 * size * rate / peak:.0f}% of the {manifest.get('target')}'s "
                 f"{peak / 1e9:.0f} GB/s)")
    return text


def stop_note(tokens, max_new_tokens: int, manifest: dict) -> str:
    """``; stopped at the end-of-sequence token ...`` when generation ended before
    ``max_new_tokens`` on one of the manifest's ``eos_token_ids``, else ``""``."""
    eos = set(manifest.get("eos_token_ids") or ())
    if tokens and len(tokens) < max_new_tokens and tokens[-1] in eos:
        return (f"; stopped at the end-of-sequence token after {len(tokens)} of "
                f"{max_new_tokens} (--ignore-eos goes on)")
    return ""


def _where(manifest: dict) -> str:
    """Where the decode steps ran: ``cpu``, or ``cuda, h200 target``."""
    from passctl.passes.decoder.spec import CUDA_LAYOUT

    if manifest.get("layout") == CUDA_LAYOUT:
        return f"cuda, {manifest.get('target')} target"
    return "cpu"


def main(args, console) -> int:
    from passctl.targets.onnxruntime.generate import Generator, load_tokenizer, read_manifest

    manifest = read_manifest(args.artifact)
    if _where(manifest) != "cpu":  # before anything else: one line where there is no GPU
        from passctl.targets.tvm.cuda_generate import cuda_device

        cuda_device(args.artifact, manifest)
    text = _prompt_text(args)
    tokenizer = load_tokenizer(args.artifact)
    if args.chat:
        text = _chat(args.artifact, manifest, text)
    ids = tokenizer.encode(text, add_special_tokens=not args.chat).ids
    if not ids:
        raise UserError("the prompt encodes to no tokens; give some text")
    limit = manifest.get("max_length")
    if limit is not None and len(ids) + args.max_new_tokens - 1 > int(limit):
        raise UserError(f"the prompt has {len(ids)} token{'s' if len(ids) != 1 else ''}; with "
                        f"--max-new-tokens "
                        f"{args.max_new_tokens} it needs a cache of "
                        f"{len(ids) + args.max_new_tokens - 1}, the artifact's holds {limit}; "
                        "shorten the prompt, lower --max-new-tokens or export with a larger "
                        "--max-length")
    gen = Generator(args.artifact, threads=args.threads)
    out = sys.stdout
    generated: list = []
    shown = 0

    def on_token(token: int) -> None:
        nonlocal shown
        generated.append(token)
        # decode the whole continuation and print what is new: a token may end in the middle
        # of a UTF-8 character that the next one completes
        piece = tokenizer.decode(generated, skip_special_tokens=True)
        if piece.endswith("\ufffd"):
            return
        out.write(piece[shown:])
        out.flush()
        shown = len(piece)

    result = gen.generate(ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                          top_p=args.top_p, seed=args.seed, stop_at_eos=not args.ignore_eos,
                          on_token=on_token)
    out.write("\n")
    out.flush()
    if not args.quiet:
        n = result.tokens.shape[1]
        print(f"passctl: {result.prompt_tokens} prompt tokens, {n} new; time to first token "
              f"{1000 * result.time_to_first_token_s:.1f} ms, {result.ms_per_token:.2f} ms/token, "
              f"{result.tokens_per_s:.1f} tokens/s (decode, {_where(manifest)})"
              f"{_streamed(manifest, result)}"
              f"{stop_note(result.tokens[0].tolist(), args.max_new_tokens, manifest)}",
              file=sys.stderr)
    return 0
