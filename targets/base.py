"""The emitter interface (IR model -> artifact folder), emitter registry, atomic output folders."""

from __future__ import annotations

import contextlib
import difflib
import logging
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Optional

from passctl.ir import Model
from passctl.ir.errors import PassctlError, UserError
from passctl.support.profiles import TargetProfile

logger = logging.getLogger(__name__)


class EmitError(PassctlError):
    """The emitter produced an artifact that does not work (an internal error: CLI exit 3)."""


class Emitter:
    """Turns a compiled IR model into a runnable artifact in a folder.

    Subclasses set ``name`` and implement :meth:`write`. An emitter never rewrites the graph: what
    a target needs changed is a pass in the pipeline. :meth:`emit` gives the atomic folder
    protocol: everything is built in a temporary folder next to ``out`` and renamed onto ``out``
    only when complete, so a failed run leaves no partial ``out`` (and an existing ``out`` is kept
    until the new one is ready).
    """

    name: str = ""

    def preflight(self, target: TargetProfile, check: bool = False) -> None:
        """Refuse, before any pass runs, a request this emitter cannot fulfil for ``target`` on
        this machine (``check``: the caller will run the artifact here afterwards).

        Raises:
            UserError: one line saying what is impossible and what to do instead.
        """

    def check_passes(self, passes) -> None:
        """Refuse, before any pass runs, pass options whose output this emitter cannot take
        (``passes``: the pipeline's passes, groups flattened).

        Raises:
            UserError: one line naming the pass option and what to do.
        """

    def input_sizes(self, model: Model) -> Dict[str, int]:
        """The sizes of ``model``'s unknown graph-input dims that the artifact will be built or
        tuned for, as ``{"input[axis]": size}`` (empty when the emitter fixes none). Called on the
        loaded model before any pass runs, so a missing size fails before the work, and
        calibrating passes (amp, quantize) can measure at these sizes.

        Raises:
            UserError: the emitter needs sizes that its options do not give.
        """
        return {}

    def write(self, model: Model, target: TargetProfile, folder: str) -> Dict[str, Any]:
        """Write the artifact for ``model`` into the existing, empty ``folder``.

        Returns:
            a JSON-ready dict describing what was written (recorded in ``report.json``).
        """
        raise NotImplementedError

    def emit(self, model: Model, target: TargetProfile, out: str,
             finalize: Optional[Callable[[str, Dict[str, Any]], None]] = None) -> Dict[str, Any]:
        """Write the artifact into ``out`` atomically.

        Args:
            model: the compiled model (not modified).
            target: the target profile.
            out: the output folder; replaced only after everything succeeded.
            finalize: called as ``finalize(staging_folder, info)`` after :meth:`write`, to add
                files (the CLI's check and ``report.json``) before the folder is published.

        Returns:
            the dict returned by :meth:`write`.
        """
        with atomic_output_dir(out) as staging:
            info = self.write(model, target, staging)
            if finalize is not None:
                finalize(staging, info)
        return info


def dtype_name(value) -> Optional[str]:
    """The numpy name of ``value``'s element type (``"float16"``), or None when ``value`` is None
    or untyped."""
    if value is None or value.dtype is None:
        return None
    import numpy as np

    return np.dtype(value.dtype.numpy()).name


def value_specs(values) -> List[Dict[str, Any]]:
    """A manifest's ``inputs`` / ``outputs``: ``[{"name", "shape", "dtype"}]`` for graph values
    (``shape``: the dims, ints or ``dim_param`` names, None for an unknown rank; ``dtype``: see
    :func:`dtype_name`)."""
    return [{"name": v.name, "shape": list(v.shape.dims) if v.shape is not None else None,
             "dtype": dtype_name(v)} for v in values]


@contextlib.contextmanager
def atomic_output_dir(out: str) -> Iterator[str]:
    """Yield a fresh staging folder next to ``out``; on success rename it onto ``out``.

    An existing ``out`` is replaced only after the body succeeded (it is moved aside, the staging
    folder renamed into place, then the old one deleted). On any exception the staging folder is
    deleted and ``out`` is left as it was.

    Raises:
        UserError: ``out`` exists and is not a real folder (a file, a symbolic link, a device
            node, a FIFO or a socket: none is ever replaced), or its parent folder cannot be
            created.
    """
    out = os.path.abspath(out)
    refuse_non_folder_output(out)
    parent = os.path.dirname(out)
    try:
        os.makedirs(parent, exist_ok=True)
    except FileExistsError:
        raise UserError(f"cannot create the output folder '{out}': a part of its path is a file; "
                        "choose another -o")
    except OSError as e:
        raise UserError(f"cannot create the output's parent folder '{parent}': {e.strerror}; "
                        "choose a writable -o")
    try:
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.tmp-", dir=parent)
    except OSError as e:
        raise UserError(f"cannot write in the output's parent folder '{parent}': {e.strerror}; "
                        "choose a writable -o")
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _chmod_default(staging)
    old = None
    try:
        refuse_non_folder_output(out)  # it may have appeared while the body ran
    except UserError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if os.path.lexists(out):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.old-", dir=parent)
        os.rmdir(old)
        os.rename(out, old)
    os.rename(staging, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    logger.info("wrote %s", out)


def refuse_non_folder_output(out: str, shown: Optional[str] = None, option: str = "-o") -> None:
    """Refuse an existing ``out`` that is not a real folder: the output folder is replaced as a
    whole, which must never happen to a file, a symbolic link (even one to a folder: the link
    itself would be replaced), a device node, a FIFO or a socket. Looks at ``out`` itself
    (``os.lstat``), not at what a link points to; a missing ``out`` passes.

    Args:
        out: the output path.
        shown: the path as the user gave it, for the message (default ``out``).
        option: the command-line option that named it, for the message.

    Raises:
        UserError: one line naming ``out``, what it is and what to give instead.
    """
    import stat

    shown = out if shown is None else shown
    try:
        mode = os.lstat(out).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return  # missing, or below a file: the parent-folder checks say so
    except OSError as e:
        raise UserError(f"output '{shown}': cannot inspect it ({e.strerror}); choose another "
                        f"{option}") from None
    if stat.S_ISDIR(mode):
        return
    if stat.S_ISLNK(mode):
        target = os.path.realpath(out)
        raise UserError(f"output '{shown}' is a symbolic link (to '{target}') and {option} would "
                        f"replace the link; give the folder it points to ({option} {target}) or "
                        "a new path")
    if stat.S_ISREG(mode):
        raise UserError(f"output '{shown}' is a file; give a folder path with {option}")
    kind = ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket"
            if stat.S_ISSOCK(mode) else "a special file")
    raise UserError(f"output '{shown}' is {kind}, not a folder, and is never replaced; give a new "
                    f"or empty folder path with {option}")


def _chmod_default(folder: str) -> None:
    """Give ``folder`` the mode ``mkdir`` would (0777 less the umask): ``mkdtemp`` makes it 0700."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)


def _registry() -> Dict[str, Emitter]:
    from passctl.targets.onnxruntime.emit import OnnxRuntimeEmitter
    from passctl.targets.tensorrt.emit import TensorRTEmitter
    from passctl.targets.tvm.emit import TvmEmitter

    return {
        "onnxruntime": OnnxRuntimeEmitter(),
        "tvm": TvmEmitter(),
        "tensorrt": TensorRTEmitter(),
    }


def emitter_names() -> List[str]:
    """Names accepted by ``--emit``."""
    return list(_registry())


def get_emitter(name: str) -> Emitter:
    """The emitter called ``name``, optionally with constructor options in braces, as in pipeline
    text: ``tvm{kernels=triton,fp32_precision=tf32x3,cuda_graph=false}`` (the options are the
    emitter class's constructor arguments, converted to their annotated types).

    Raises:
        UserError: unknown name (closest names suggested), an unknown option (the known ones
            listed), a value of the wrong type or an unterminated quote. A quoted value may hold commas
            (``tvm{key="a,b"}``): options are split on commas outside quotes, as in pipeline text.
    """
    import inspect
    import typing

    from passctl.passes.pipeline_text import _convert

    text = name.strip()
    base, brace, rest = text.partition("{")
    reg = _registry()
    emitter = reg.get(base.strip().lower())
    if emitter is None:
        close = difflib.get_close_matches(base.lower(), list(reg), n=2, cutoff=0.4)
        hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
        raise UserError(f"unknown emitter '{base}': {hint}known emitters: {', '.join(reg)}")
    if not brace:
        return emitter
    if not rest.endswith("}") or rest.count("{") or rest.count("}") != 1:
        raise UserError(f"--emit '{text}': options go in one pair of braces at the end, e.g. "
                        f"'{base}{{key=value,key=value}}'")
    cls = type(emitter)
    hints = typing.get_type_hints(cls.__init__)
    known = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    options: Dict[str, Any] = {}
    try:
        items = split_outside_quotes(rest[:-1])
    except ValueError as e:
        raise UserError(f"--emit '{text}': {e}") from None
    for item in filter(None, (x.strip() for x in items)):
        key, eq, raw = (x.strip() for x in item.partition("="))
        if key not in known:
            raise UserError(f"--emit '{text}': unknown {base} emitter option '{key}'; "
                            f"known: {', '.join(known)} (as key=value)")
        if not eq:
            raise UserError(f"--emit '{text}': option '{key}' needs a value ({key}=VALUE)")
        if key in options:
            raise UserError(f"--emit '{text}': option '{key}' is given twice")
        if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
            raw = raw[1:-1]
        hint = hints.get(key, str)
        if raw.lower() == "auto" and type(None) in typing.get_args(hint):
            options[key] = None  # an Optional option's None means "decide automatically"
            continue
        try:
            options[key] = _convert(raw, hint)
        except ValueError as e:
            raise UserError(f"--emit '{text}': option {key}='{raw}' must be {e}") from None
    try:
        return cls(**options)
    except UserError as e:
        raise UserError(f"--emit '{text}': {e}") from None


def split_outside_quotes(body: str, sep: str = ",") -> List[str]:
    """Split ``body`` on ``sep`` where it is not inside single or double quotes (the rule pipeline
    text uses for option values such as ``lower-tvm{dims="a=1,b=2"}``). Quotes are kept in the
    parts; a quote opens at a ``'`` or ``"`` and closes at the next same character.

    Args:
        body: the text between the braces, e.g. ``kernels=tvm,key="a,b"``.
        sep: the one-character separator.

    Returns:
        The parts, unstripped (``'a,"b,c"'`` -> ``['a', '"b,c"']``; ``''`` -> ``['']``).

    Raises:
        ValueError: a quote is not closed; the message names the quote and where it opens.
    """
    parts: List[str] = []
    start, quote, opened = 0, "", 0
    for i, ch in enumerate(body):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote, opened = ch, i
        elif ch == sep:
            parts.append(body[start:i])
            start = i + 1
    if quote:
        raise ValueError(f"unterminated {quote}-quoted value at {body[opened:]!r}; close it with {quote}")
    parts.append(body[start:])
    return parts
