"""The compile context: what one compilation knows that passes read instead of being told by name.

In the spirit of TVM's ``PassContext`` and MLIR's data layout (DLTI) attributes: the driver builds
one :class:`CompileContext` (target profile, the input sizes the artifact is built for, calibration
feeds, the numeric check's bounds) and each pass takes from it what it needs
(:meth:`passctl.passes.base.Pass.configure`); an option given in the pipeline text always wins.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional

from passctl.support.profiles import TargetProfile, get_target, list_targets

__all__ = ["CheckBound", "CompileContext", "current_context"]


class CheckBound(NamedTuple):
    """One bound of the numeric check: ``metric`` error (``max-rel``, ``mean-rel`` or ``cosine``,
    :data:`passctl.support.check.METRICS`) at most ``rtol``; ``source`` says where it comes from
    (``--rtol``, ``default``, or the name of the pass whose error budget it is) and ``label`` how
    messages name that pass (``amp``, ``quantize``; empty for the others)."""

    metric: str
    rtol: float
    source: str
    label: str = ""


@dataclass
class CompileContext:
    """What one compilation knows, for the passes and the numeric check to read.

    Attributes:
        target: the target profile (``--target``); None when nothing chose one (passes then use
            their own default, the cpu profile).
        emitter: the emitter name the pipeline feeds (``--emit``), or ``""``.
        input_sizes: sizes of the graph inputs' unknown dims that the artifact is built or tuned
            for, as ``{"input[axis]": size}`` or ``{dim_param: size}`` (an emitter's
            :meth:`~passctl.targets.base.Emitter.input_sizes`: a TensorRT profile's OPT sizes);
            calibrating passes measure there unless told otherwise.
        calibration: a folder of ``.npz`` calibration feeds (arrays by graph input name) for the
            passes that calibrate (amp, quantize) and have no ``calib`` option of their own.
        check_bounds: the bounds the numeric check (``--check``, ``--check-each``) applies.
        artifact_optimization: the ONNX Runtime ``graph_optimization_level`` the artifact ships
            with when the emitter was told one (``--emit 'onnxruntime{optimization_level=...}'``:
            ``ORT_ENABLE_EXTENDED``...), ``""`` for the emitter's default; budgeted passes measure
            at that level.

    Use it as ``with context: ...`` to make it :func:`current_context` inside the block.
    """

    target: Optional[TargetProfile] = None
    emitter: str = ""
    input_sizes: Dict[str, int] = field(default_factory=dict)
    calibration: str = ""
    check_bounds: List[CheckBound] = field(default_factory=list)
    artifact_optimization: str = ""

    @classmethod
    def for_target(cls, name: Optional[str], emitter: Optional[str] = None) -> "CompileContext":
        """A context for the target profile called ``name``; no target profile when ``name`` is
        None or names none (pass groups are also looked up by emitter name, ``tvm``)."""
        known = {p.name for p in list_targets()}
        target = get_target(name) if name and name.strip().lower() in known else None
        return cls(target=target, emitter=emitter or "")

    def __enter__(self) -> "CompileContext":
        self._tokens = getattr(self, "_tokens", []) + [_CURRENT.set(self)]
        return self

    def __exit__(self, *exc) -> None:
        _CURRENT.reset(self._tokens.pop())


_CURRENT: contextvars.ContextVar[Optional[CompileContext]] = contextvars.ContextVar(
    "passctl_compile_context", default=None)


def current_context() -> CompileContext:
    """The innermost context entered with ``with context:``, else an empty one (no target, no
    sizes, no calibration feeds, no bounds)."""
    context = _CURRENT.get()
    return context if context is not None else CompileContext()
