"""The CUDA decoder artifact end to end on a GPU (issue 17): what a user runs, on a model built
there.

    python benchmarks/gpu_artifact.py --tokenizer DIR [--new-tokens 48]

A random-weight Llama (GQA, 4 layers, 512 wide; the vocabulary of the tokenizer in ``DIR``, e.g.
SmolLM2's saved with ``save_pretrained``) is saved as a transformers folder with that tokenizer,
then for fp16, int8 (rows, half2) and int4 (planes, half2):

1. ``passctl export-decoder SRC -o ART --target h200 [--weights intN --weight-layout L]`` (the CLI,
   in a subprocess): exit code and seconds;
2. ``passctl generate ART --prompt TEXT --max-new-tokens N``: exit code, the streamed text's
   length, the timing line;
3. ``passctl.Generator(ART).generate(ids, return_logits=True)``: its greedy tokens against
   transformers' fp32 greedy tokens on the same weights, and the cosine of each step's logits
   against the fp32 model's logits for the same prefix (teacher forcing on the artifact's own
   tokens);
4. user mistakes: a prompt file that does not exist, a prompt longer than the cache: exit 2
   with one line each.

Prints one table row per artifact; exit 1 if any step that must succeed failed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from passctl_path import REPO, ensure_passctl_importable, scratch_dir  # noqa: E402

ensure_passctl_importable()

VARIANTS = [("fp16", None, None), ("int8", "int8", "rows"), ("int8", "int8", "half2"),
            ("int4", "int4", "planes"), ("int4", "int4", "half2")]


def _name(variant) -> str:
    label, _, layout = variant
    return label if layout is None else f"{label}-{layout}"


def _cli(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``passctl ARGV`` in a subprocess (this checkout as the package)."""
    import passctl

    shim = os.path.dirname(os.path.dirname(os.path.abspath(passctl.__file__)))
    code = ("import sys; sys.path.insert(0, %r); from passctl.tools.cli import main; "
            "sys.exit(main())" % shim)
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", required=True, help="a tokenizer folder (save_pretrained)")
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--prompt", default="The capital of France is")
    p.add_argument("--variants", nargs="+", default=[_name(v) for v in VARIANTS],
                   choices=[_name(v) for v in VARIANTS], help="artifacts to export and run")
    args = p.parse_args(argv)

    import transformers

    import passctl

    tmp = scratch_dir("passctl-gpu-artifact-")
    src = os.path.join(tmp, "src")
    tok = transformers.AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=2,
                                   vocab_size=len(tok), max_position_embeddings=1024,
                                   rms_norm_eps=1e-5, tie_word_embeddings=False,
                                   bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # larger weights than the 0.02 init, so the logits are not near-ties
        for name, prm in model.named_parameters():
            if prm.dim() == 2:
                prm.mul_(3.0)
    model.save_pretrained(src)
    tok.save_pretrained(src)
    model = model.cuda()
    ids = tok(args.prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        ref = model.generate(ids.cuda(), max_new_tokens=args.new_tokens,
                             min_new_tokens=args.new_tokens, do_sample=False)[0, ids.shape[1]:]
    ref = ref.tolist()
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters, "
          f"vocab {cfg.vocab_size}; prompt {ids.shape[1]} tokens; {torch.cuda.get_device_name()}",
          flush=True)

    rows, ok = [], True
    for label, weights, layout in [v for v in VARIANTS if _name(v) in args.variants]:
        art = os.path.join(tmp, f"art-{label}-{layout}")
        cmd = ["export-decoder", src, "-o", art, "--target", "h200", "--max-length", "256"]
        if weights:
            cmd += ["--weights", weights, "--weight-layout", layout]
        t0 = time.perf_counter()
        exp = _cli(*cmd)
        export_s = time.perf_counter() - t0
        if exp.returncode != 0:
            print(f"{label} {layout}: export exit {exp.returncode}: {exp.stderr[-800:]}", flush=True)
            ok = False
            continue
        gen = _cli("generate", art, "--prompt", args.prompt, "--max-new-tokens",
                   str(args.new_tokens))
        timing = [ln for ln in gen.stderr.splitlines() + gen.stdout.splitlines()
                  if "ms/token" in ln or "tokens/s" in ln]
        if gen.returncode != 0:
            print(f"{label} {layout}: generate exit {gen.returncode}: {gen.stderr[-800:]}",
                  flush=True)
            ok = False
        try:
            g = passctl.Generator(art)
            res = g.generate(ids.numpy(), max_new_tokens=args.new_tokens, return_logits=True,
                             stop_at_eos=False)
            toks = res.tokens[0].tolist()
            # the fp32 model's logits for the artifact's own prefixes (teacher forcing)
            full = torch.tensor([ids[0].tolist() + toks], device="cuda")
            with torch.no_grad():
                want = model(full).logits[0, ids.shape[1] - 1:-1].float().cpu().numpy()
            got = res.logits[0]
            cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
            same = sum(a == b for a, b in zip(toks, ref))
            first_diff = next((i for i, (a, b) in enumerate(zip(toks, ref)) if a != b), None)
            decode_ms = res.decode_s / max(1, len(toks) - 1) * 1e3
            rows.append((label, layout or "-", export_s, gen.returncode, len(gen.stdout),
                         same, first_diff, float(cos.min()), res.time_to_first_token_s * 1e3,
                         decode_ms, timing[-1].strip() if timing else "(no timing line)"))
            print(rows[-1], flush=True)
            del g
            torch.cuda.empty_cache()
        except Exception as exc:  # noqa: BLE001  (report the variant, go on)
            print(f"{label} {layout}: Generator FAILED {type(exc).__name__}: {str(exc)[:600]}",
                  flush=True)
            ok = False
        if label != "fp16":
            shutil.rmtree(art, ignore_errors=True)

    # user mistakes: one line, exit 2 (on the fp16 artifact, or the source folder)
    art = os.path.join(tmp, "art-fp16-None")
    if not os.path.isdir(art):
        art = src
    mistakes = []
    missing = _cli("generate", art, "--prompt-file", os.path.join(tmp, "no-such-prompt.txt"))
    mistakes.append(("prompt file that does not exist", missing))
    long_file = os.path.join(tmp, "long.txt")
    with open(long_file, "w") as f:
        f.write("word " * 600)
    mistakes.append(("prompt longer than the cache (256)", _cli("generate", art, "--prompt-file",
                                                               long_file)))
    mistakes.append(("folder with no decoder layout", _cli("generate", src, "--prompt", "hi")))

    print()
    print(f"| artifact | layout | export s | generate exit | streamed chars | greedy tokens equal "
          f"fp32 transformers (of {args.new_tokens}) | first differing step | min cosine vs "
          f"fp32 (teacher-forced) | TTFT ms | decode ms/token | CLI timing line |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]} | {r[4]} | {r[5]} | {r[6]} | {r[7]:.6f} "
              f"| {r[8]:.1f} | {r[9]:.3f} | {r[10]} |")
    print()
    print("| user mistake | exit | stderr lines | message |")
    print("| --- | --- | --- | --- |")
    for what, proc in mistakes:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        print(f"| {what} | {proc.returncode} | {len(lines)} | {lines[-1] if lines else ''} |")
        ok = ok and proc.returncode == 2 and len(lines) == 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
