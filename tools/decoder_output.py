"""The output folder of ``passctl export-decoder`` (both artifacts: tools/export_decoder.py and
tools/export_cuda_decoder.py): refuse an OUT that is not an earlier decoder artifact, write into a
hidden folder beside it, and move that into place only when everything is written (never a
half-written OUT)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Iterator, Optional

from passctl.ir.errors import UserError


def prepare_out(out: str) -> None:
    """Refuse an OUT that exists and is not an earlier decoder artifact (nothing is destroyed)."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"output '{out}' is a file; give a folder")
    if os.path.isdir(out) and os.listdir(out) and not os.path.isfile(os.path.join(out, "decoder.json")):
        raise UserError(f"output folder '{out}' is not empty and holds no decoder artifact; give "
                        "a new folder (it would be replaced)")


def temp_folder(parent: str) -> str:
    """A new hidden folder in ``parent`` with the permissions of the umask (mkdtemp's are 0700)."""
    tmp = tempfile.mkdtemp(prefix=".passctl-decoder-", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    return tmp


def commit(tmp: str, out: str) -> None:
    """Replace ``out`` (an earlier artifact, if any) by the finished folder ``tmp``."""
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.replace(tmp, out)


@contextlib.contextmanager
def staged(out: str) -> Iterator[str]:
    """``with staged(out) as tmp:`` write the artifact into ``tmp`` (a hidden folder beside
    ``out``); it replaces ``out`` when the block ends, and is removed if the block raises."""
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = temp_folder(parent)
    try:
        yield tmp
        commit(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_manifest(folder: str, manifest: dict) -> None:
    """``folder/decoder.json``."""
    with open(os.path.join(folder, "decoder.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)


def save_tokenizer(tokenizer, folder: str) -> Optional[str]:
    """A transformers tokenizer saved to ``folder/tokenizer``; the manifest's ``tokenizer`` entry
    (None when there is none, or it wrote no tokenizer.json)."""
    if tokenizer is None:
        return None
    tokenizer.save_pretrained(os.path.join(folder, "tokenizer"))
    return "tokenizer" if os.path.isfile(os.path.join(folder, "tokenizer",
                                                      "tokenizer.json")) else None


def make_readable(path: str) -> None:
    """Give a written file the permissions of the umask (``0666 & ~umask``): onnx's external data
    and safetensors' files come out ``0600``, unlike every other file of the artifact."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


__all__ = ["commit", "make_readable", "prepare_out", "save_tokenizer", "staged", "temp_folder",
           "write_manifest"]
