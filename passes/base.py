"""The pass API: a pass has a kebab-case name, a one-line summary, typed options and statistics."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, FrozenSet, List, Optional, Tuple

from passctl.ir import Model
from passctl.support.context import CompileContext


@dataclass
class PassResult:
    """What a pass did: ``modified`` tells whether the model changed; ``stats`` counts what it did
    (e.g. ``{"folded": 35}``; rule sets count applications per rule)."""

    modified: bool
    stats: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OutputForm:
    """A form of output a pass will write that some emitter may refuse, known from its options
    before it runs (:meth:`Pass.output_forms`; emitters list what they refuse in
    ``Emitter.refused_forms``).

    Attributes:
        name: the form, e.g. ``"uint8-qdq"``.
        option: the option text that chooses it, e.g. ``"activations=uint8"``.
        text: what the pass writes, e.g. ``"uint8 activations with zero point 128"``.
        fix: what to give instead, e.g. ``"drop activations=uint8"``.
    """

    name: str
    option: str
    text: str
    fix: str


class PreconditionError(Exception):
    """Raised by :meth:`Pass.requires` when a model does not meet a pass's preconditions."""


class PostconditionError(Exception):
    """Raised by :meth:`Pass.ensures` when a pass did not establish what it promises."""


class Pass:
    """Base class of all passes.

    Subclasses set ``name`` (kebab-case) and ``summary`` (one line), declare options as a dataclass
    assigned to ``Options`` (its fields are the typed options, parsed from pipeline text
    ``name{key=value}``), and implement :meth:`run`. ``self.options`` holds the parsed options;
    ``self.given_options`` names those the pipeline text (or the constructor's keywords) gave,
    which :meth:`configure` never replaces by the compile context's values.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Options: ClassVar[Optional[type]] = None
    given_options: FrozenSet[str] = frozenset()

    def __init__(self, options: Any = None, **kwargs: Any):
        if options is None and self.Options is not None:
            options = self.Options(**kwargs)
        elif kwargs:
            raise TypeError(f"pass '{self.name}': give options either as an object or as keywords")
        self.options = options
        self.given_options: FrozenSet[str] = frozenset(kwargs) if kwargs else _non_defaults(options)

    def run(self, model: Model) -> PassResult:
        """Rewrite ``model`` in place; return whether it changed and the statistics."""
        raise NotImplementedError

    def configure(self, context: CompileContext) -> List[str]:
        """Take what this pass needs from the compile context (the target profile, the input
        sizes the artifact is built for, calibration feeds) for the options not in
        :attr:`given_options`; no-op by default. Called when the pipeline is built and again
        once the driver knows the input sizes, so it must be idempotent.

        Returns:
            notes for the user (one line each) about values taken from the context.
        """
        return []

    def error_budget(self) -> Optional[Tuple[str, float, str]]:
        """``(metric, budget, label)`` when this pass's output is meant to differ from its input
        by up to ``budget`` under ``metric`` (amp, quantize), which the numeric check then
        applies by default; ``label`` names the pass in messages (``amp``). None by default."""
        return None

    def output_forms(self) -> List[OutputForm]:
        """The forms of output this pass will write that an emitter may refuse (checked before
        any pass runs; see :class:`OutputForm`). Empty by default."""
        return []

    def requires(self, model: Model) -> None:
        """Check what the pass needs before it runs (as onnx_ir's ``requires``); no-op by default.

        Raises:
            PreconditionError: the model is not in a form this pass accepts.
        """

    def ensures(self, model: Model) -> None:
        """Check what the pass promises after it ran (as onnx_ir's ``ensures``); no-op by default.

        Raises:
            PostconditionError: the pass did not establish what it promises.
        """

    def __call__(self, model: Model) -> PassResult:
        self.requires(model)
        result = self.run(model)
        if not isinstance(result, PassResult):
            raise TypeError(f"pass '{self.name}': run() returned {type(result).__name__}, "
                            "expected PassResult")
        self.ensures(model)
        return result

    @classmethod
    def option_fields(cls):
        """The declared options as ``dataclasses.Field`` objects (empty when there are none)."""
        return dataclasses.fields(cls.Options) if cls.Options is not None else ()

    def __repr__(self):
        return f"<pass {self.name}>"


def _non_defaults(options: Any) -> FrozenSet[str]:
    """The fields of an options dataclass that differ from their defaults (what a caller gave)."""
    if options is None or not dataclasses.is_dataclass(options):
        return frozenset()
    given = set()
    for f in dataclasses.fields(options):
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            given.add(f.name)
            continue
        if getattr(options, f.name) != default:
            given.add(f.name)
    return frozenset(given)
