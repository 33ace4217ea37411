"""The pass API: a pass has a kebab-case name, a one-line summary, typed options and statistics."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Optional

from passctl.ir import Model


@dataclass
class PassResult:
    """What a pass did: ``modified`` tells whether the model changed; ``stats`` counts what it did
    (e.g. ``{"folded": 35}``; rule sets count applications per rule)."""

    modified: bool
    stats: Dict[str, Any] = field(default_factory=dict)


class PreconditionError(Exception):
    """Raised by :meth:`Pass.requires` when a model does not meet a pass's preconditions."""


class PostconditionError(Exception):
    """Raised by :meth:`Pass.ensures` when a pass did not establish what it promises."""


class Pass:
    """Base class of all passes.

    Subclasses set ``name`` (kebab-case) and ``summary`` (one line), declare options as a dataclass
    assigned to ``Options`` (its fields are the typed options, parsed from pipeline text
    ``name{key=value}``), and implement :meth:`run`. ``self.options`` holds the parsed options.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    Options: ClassVar[Optional[type]] = None

    def __init__(self, options: Any = None, **kwargs: Any):
        if options is None and self.Options is not None:
            options = self.Options(**kwargs)
        elif kwargs:
            raise TypeError(f"pass '{self.name}': give options either as an object or as keywords")
        self.options = options

    def run(self, model: Model) -> PassResult:
        """Rewrite ``model`` in place; return whether it changed and the statistics."""
        raise NotImplementedError

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
