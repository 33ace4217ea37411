"""The output folder of ``passctl compile``: its default name, and the checks that ``-o`` (which
replaces the whole folder) destroys nothing but an earlier passctl artifact."""

from __future__ import annotations

import os
import tempfile
from typing import Optional, Tuple

from passctl.ir.errors import UserError
from passctl.tools.model_source import IR_TEXT_SUFFIX
from passctl.tools.report import REPORT_FILE, REPORT_SCHEMA


def default_out(model_path: str) -> str:
    """``./<model stem>.passctl``: in the current folder, never next to a packaged model."""
    stem = os.path.basename(model_path)
    for suffix in (".onnx", IR_TEXT_SUFFIX, ".py"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    return f"{stem}.passctl"


def _artifact_files(folder: str) -> Tuple[Optional[set], str]:
    """Names a passctl artifact in ``folder`` owns and its ``emitter`` from its ``report.json``
    (``(None, "")``: no passctl ``report.json`` there)."""
    import json

    try:
        with open(os.path.join(folder, REPORT_FILE)) as f:
            report = json.load(f)
    except (OSError, ValueError):
        return None, ""
    if not isinstance(report, dict) or report.get("schema") != REPORT_SCHEMA:
        return None, ""
    artifact = report.get("artifact") if isinstance(report.get("artifact"), dict) else {}
    files = artifact.get("files") if isinstance(artifact.get("files"), list) else []
    return {REPORT_FILE, *(str(f) for f in files)}, str(report.get("emitter", ""))


def check_output_path(out: str, model_path: str) -> None:
    """Refuse, before any work, an output that would destroy something that is not an artifact.

    ``-o`` replaces the whole folder, so it must be new, empty, or a passctl artifact: a
    ``report.json`` of the passctl report schema and only plain files its emitter writes that
    the report lists (or that the emitter may add afterwards: ``model.onnx.data``, TensorRT's
    ``model.engine``).

    Raises:
        UserError: ``out`` exists and is not a real folder (a file, symbolic link, device node,
            FIFO or socket: see :func:`passctl.targets.base.refuse_non_folder_output`), is below
            a file, holds the input model, is the
            current folder, one of its ancestors or the home folder, or is a non-empty folder that
            is not a passctl artifact or holds something else besides (the first one is named).
    """
    from passctl.targets.base import refuse_non_folder_output

    shown = out
    out = os.path.abspath(out)
    refuse_non_folder_output(out, shown)
    parent = os.path.dirname(out)
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent) if os.path.dirname(parent) != parent else ""
    if parent and not os.path.isdir(parent):
        raise UserError(f"output '{shown}': '{parent}' is a file, not a folder; choose another -o")
    real_out, real_model = os.path.realpath(out), os.path.realpath(model_path)
    cwd, home = os.path.realpath(os.getcwd()), os.path.realpath(os.path.expanduser("~"))
    if os.path.commonpath([real_out, cwd]) == real_out or real_out == home:
        what = "the home folder" if real_out == home else "the current folder or one above it"
        raise UserError(f"output folder '{shown}' is {what} and -o replaces the whole folder; "
                        "choose a new or empty -o")
    if os.path.commonpath([real_out, real_model]) == real_out:
        raise UserError(f"output folder '{shown}' contains the input model '{model_path}' and would "
                        "replace it; choose another -o")
    if os.path.isdir(out):
        _refuse_foreign_entries(out, shown)
    if parent and not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"output '{shown}': cannot write in '{parent}' (permission denied); "
                        "choose a writable -o")


#: The files each emitter writes (model.engine: built later by build_engine.sh; the data file:
#: written when the weights are large), and those it may add after its report listed the others.
_EMITTER_FILES = {"onnxruntime": {"model.onnx", "model.onnx.data", "session.json"},
                  "tvm": {"manifest.json", "model.so", "model.params", "ir.onnx"},
                  "tensorrt": {"model.onnx", "model.onnx.data", "manifest.json", "precision.json",
                               "build_engine.sh", "model.engine"}}
_WRITTEN_LATER = {"model.onnx.data", "model.engine"}


def _refuse_foreign_entries(out: str, shown: str) -> None:
    """Refuse an existing non-empty folder ``out`` (``shown``: as the user gave it) unless it is a
    passctl artifact holding only plain files its emitter writes that its report lists (or that
    the emitter adds later: :data:`_WRITTEN_LATER`).

    Raises:
        UserError: ``out`` is not a passctl artifact, or holds something else (the first one, sorted
            by name, is named).
    """
    import stat

    names = sorted(os.listdir(out))
    listed, kind = _artifact_files(out)
    if names and listed is None:
        shown_names = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        raise UserError(f"output folder '{shown}' exists and is not a passctl artifact (holds "
                        f"{shown_names}); choose a new or empty -o")
    own = _EMITTER_FILES.get(kind, set().union(*_EMITTER_FILES.values()))
    for n in names:
        try:
            plain = stat.S_ISREG(os.lstat(os.path.join(out, n)).st_mode)
        except OSError:
            plain = False
        if not plain or (n != "report.json" and (n not in own or (
                n not in listed and n not in _WRITTEN_LATER))):
            what = "" if plain else " (not a plain file)"
            raise UserError(f"output folder '{shown}' is a passctl {kind or 'compile'} artifact "
                            f"but also holds '{n}'{what}, which passctl did not write; -o "
                            "replaces the whole folder: move it out or choose a new or empty -o")


def check_writable_folder(folder: str, option: str) -> None:
    """Create ``folder`` if needed and prove a file can be written in it.

    Raises:
        UserError: ``folder`` (or a part of its path) is a file, or it cannot be created or
            written.
    """
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise UserError(f"{option} '{folder}' is a file; give a folder path")
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise UserError(f"{option} '{folder}': cannot write there ({e.strerror or e}); choose a "
                        "writable folder") from e
