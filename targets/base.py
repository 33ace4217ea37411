"""The emitter interface (IR model -> artifact folder) and atomic output folders."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from typing import Any, Callable, ClassVar, Dict, Iterator, List, Optional

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
    #: ``{output form: why this emitter cannot take it}`` for the forms passes declare
    #: (:meth:`passctl.passes.base.Pass.output_forms`), e.g. ``{"uint8-qdq": "TensorRT requires
    #: zero points of 0"}``.
    refused_forms: ClassVar[Dict[str, str]] = {}

    def preflight(self, target: TargetProfile, check: bool = False) -> None:
        """Refuse, before any pass runs, a request this emitter cannot fulfil for ``target`` on
        this machine (``check``: the caller will run the artifact here afterwards).

        Raises:
            UserError: one line saying what is impossible and what to do instead.
        """

    def check_passes(self, passes) -> None:
        """Refuse, before any pass runs, pass options whose output this emitter cannot take
        (``passes``: the pipeline's passes, groups flattened): an output form a pass declares
        (:meth:`passctl.passes.base.Pass.output_forms`) that :attr:`refused_forms` lists.

        Raises:
            UserError: one line naming the pass option and what to do.
        """
        for p in passes:
            for form in p.output_forms():
                why = self.refused_forms.get(form.name)
                if why is not None:
                    raise UserError(f"--emit {self.name}: {p.name}{{{form.option}}} writes "
                                    f"{form.text}, and {why}; {form.fix}")

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

    The staging folder is ``.<out name>.tmp-<pid>-XXXX``; those a killed run left (their pid no
    longer runs) are removed first (:func:`remove_stale_staging`).

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
    remove_stale_staging(out)
    try:
        staging = tempfile.mkdtemp(prefix=staging_prefix(out, "tmp"), dir=parent)
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
        old = tempfile.mkdtemp(prefix=staging_prefix(out, "old"), dir=parent)
        os.rmdir(old)
        os.rename(out, old)
    os.rename(staging, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    logger.info("wrote %s", out)


def host_id() -> str:
    """8 hex digits naming this machine (a hash of its host name): process ids are judged only on
    the machine that made them (an output folder on a shared file system)."""
    import hashlib
    import socket

    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def staging_prefix(out: str, kind: str) -> str:
    """``.<out name>.<kind>-<pid>.<host id>-``: the name prefix of :func:`atomic_output_dir`'s
    hidden folders beside ``out`` (``kind``: ``tmp`` for the staging folder, ``old`` for the
    replaced artifact), with this process's id and this machine's (:func:`host_id`), so a later
    run can tell the folders of a killed run from those of a run still going."""
    return f".{os.path.basename(out)}.{kind}-{os.getpid()}.{host_id()}-"


def _pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this machine (one of another user counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return True
    return True


def remove_stale_staging(out: str) -> List[str]:
    """Remove the hidden staging folders a killed run (``kill -9``, power loss) left beside ``out``:
    ``.<out name>.tmp-<pid>[.<host id>]-*`` and ``.<out name>.old-<pid>[.<host id>]-*``
    (:func:`staging_prefix`) whose process ``<pid>`` no longer runs. Folders of live processes,
    of another machine (another host id) and names without a pid are kept.

    Returns:
        the paths removed.
    """
    import re

    parent, base = os.path.dirname(os.path.abspath(out)), os.path.basename(out)
    return remove_dead_pid_folders(parent, re.compile(
        r"\." + re.escape(base) + r"\.(?:tmp|old)-(\d+)(?:\.([0-9a-f]{8}))?-[^/]*"))


def remove_dead_pid_folders(parent: str, pattern) -> List[str]:
    """Remove the folders in ``parent`` whose name fully matches ``pattern`` (a compiled regex
    whose group 1 is a process id, and an optional group 2 the :func:`host_id` of the machine
    that made it) when that process no longer runs on this machine; links, files, folders of live
    processes and of other machines are kept, errors ignored.

    Returns:
        the paths removed.
    """
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    removed = []
    for name in names:
        m = pattern.fullmatch(name)
        path = os.path.join(parent, name)
        if m is None or os.path.islink(path) or not os.path.isdir(path):
            continue
        host = m.group(2) if m.re.groups >= 2 else None
        if (host is not None and host != host_id()) or _pid_alive(int(m.group(1))):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            logger.info("removed %s, left by a killed passctl run (pid %s)", path, m.group(1))
            removed.append(path)
    return removed


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
