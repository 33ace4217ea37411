"""The pass manager: runs passes in order, with verify-each, fixpoint groups and instruments."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional, Sequence, Union

from passctl.ir import Model
from passctl.ir.errors import PassctlError
from passctl.passes.base import Pass, PassResult

logger = logging.getLogger(__name__)


class PassFailure(PassctlError):
    """A pass raised (an internal error, CLI exit 3). Names the pass and the passes that ran before.

    Attributes:
        pass_name: the failing pass.
        before: names of the passes that completed before it, in order.
        reproducer: folder written by the crash reproducer instrument, when one ran.
    """

    def __init__(self, pass_name: str, before: Sequence[str], cause: BaseException):
        self.pass_name, self.before, self.cause = pass_name, list(before), cause
        self.reproducer: Optional[str] = None
        super().__init__(f"pass '{pass_name}' failed after passes [{', '.join(self.before)}]: "
                         f"{type(cause).__name__}: {cause}")


class VerifyError(PassctlError):
    """verify-each found an error after a pass (an internal error: the pass broke the IR)."""

    def __init__(self, pass_name: Optional[str], before: Sequence[str], diagnostics: Sequence[Any]):
        self.pass_name, self.before, self.diagnostics = pass_name, list(before), list(diagnostics)
        first = diagnostics[0]
        text = getattr(first, "message", str(first))
        where = getattr(first, "ir_line", None)
        more = f" (+{len(diagnostics) - 1} more)" if len(diagnostics) > 1 else ""
        detail = f"{text}" + (f" at `{where}`" if where else "") + more
        if pass_name is None:
            msg = f"the input IR does not verify: {detail}"
        else:
            msg = f"pass {pass_name} broke the IR after passes [{', '.join(self.before)}]: {detail}"
        super().__init__(msg)


@dataclass
class FixpointGroup:
    """Passes repeated, in order, until none modifies the model or ``max_steps`` rounds ran.

    Attributes:
        passes: the passes of one round.
        max_steps: the most rounds; reaching it with changes still happening logs a warning and
            adds it to :attr:`ManagerResult.warnings`.
        name: label used in records (``fixpoint`` by default).
    """

    passes: List[Pass]
    max_steps: int = 10
    name: str = "fixpoint"


@dataclass
class PassRecord:
    """One pass execution: name, wall time in milliseconds, whether it modified, its statistics."""

    name: str
    time_ms: float
    modified: bool
    stats: Dict[str, Any] = field(default_factory=dict)
    index: int = 0
    round: Optional[int] = None


@dataclass
class ManagerResult:
    """What a pipeline run did: the (in-place) model, per-pass records and warnings."""

    model: Model
    records: List[PassRecord] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    @property
    def modified(self) -> bool:
        return any(r.modified for r in self.records)

    @property
    def total_ms(self) -> float:
        return sum(r.time_ms for r in self.records)


def _verify(model: Model) -> List[Any]:
    from passctl.ir.verifier import verify

    # Output-type comparison exports the whole model: too slow to run after every pass.
    return [d for d in verify(model, check_output_types=False) if d.severity == "error"]


class PassManager:
    """Runs passes in order on a model, in place.

    Args:
        passes: :class:`Pass` objects and :class:`FixpointGroup` items, in order.
        verify_each: run ``passctl.ir.verifier.verify`` on the input and after every pass; also on
            whenever :attr:`default_verify_each` is set (tests set it, see ``tests/passes/conftest.py``).
        instruments: objects with any of the hooks ``on_start(model, passes)``,
            ``before_pass(pass_, model, index)``, ``after_pass(pass_, model, record)``,
            ``on_failure(pass_, model, error, index)`` and ``on_end(model, result)``
            (see :mod:`passctl.passes.instruments`).
        final_dce: when the pipeline modified the model and its last pass is not ``dce``, run
            ``dce`` once more at the end (recorded like any other pass), so that values a late
            pass replaced (e.g. the weights ``fuse-conv-bn`` folded) do not stay as unused
            initializers in the artifact.
    """

    default_verify_each: ClassVar[bool] = False

    def __init__(self, passes: Sequence[Union[Pass, FixpointGroup]], verify_each: bool = False,
                 instruments: Sequence[Any] = (), final_dce: bool = False):
        self.passes = list(passes)
        self.final_dce = bool(final_dce)
        self.verify_each = bool(verify_each) or PassManager.default_verify_each
        self.instruments = list(instruments)

    def flat_passes(self) -> List[Pass]:
        """The passes of the pipeline with fixpoint groups flattened (one round each)."""
        out: List[Pass] = []
        for p in self.passes:
            out.extend(p.passes if isinstance(p, FixpointGroup) else [p])
        return out

    def _hook(self, hook: str, *args) -> None:
        for inst in self.instruments:
            fn = getattr(inst, hook, None)
            if fn is not None:
                fn(*args)

    def run(self, model: Model) -> ManagerResult:
        """Run the pipeline on ``model`` (modified in place).

        Raises:
            VerifyError: (verify-each) the input, or the IR after a pass, does not verify.
            PassFailure: a pass raised; chained to the original exception.
            UserError: raised by a pass for a problem of the user's model is passed through.
        """
        result = ManagerResult(model)
        self._done: List[str] = []
        if self.verify_each:
            diags = _verify(model)
            if diags:
                raise VerifyError(None, [], diags)
        self._hook("on_start", model, self.flat_passes())
        for item in self.passes:
            if isinstance(item, FixpointGroup):
                self._run_fixpoint(item, model, result)
            else:
                self._run_one(item, model, result, None)
        flat = self.flat_passes()
        if (self.final_dce and flat and flat[-1].name != "dce"
                and any(r.modified for r in result.records)):
            from passctl.passes.registry import get_pass

            self._run_one(get_pass("dce")(), model, result, None)
        self._hook("on_end", model, result)
        return result

    def _run_fixpoint(self, group: FixpointGroup, model: Model, result: ManagerResult) -> None:
        for step in range(1, group.max_steps + 1):
            changed = False
            for p in group.passes:
                changed |= self._run_one(p, model, result, step).modified
            if not changed:
                return
        names = ", ".join(p.name for p in group.passes)
        msg = (f"{group.name} [{names}] still modified the model after {group.max_steps} rounds; "
               "stopped there (raise max_steps or look for two passes undoing each other)")
        logger.warning(msg)
        result.warnings.append(msg)

    def _run_one(self, p: Pass, model: Model, result: ManagerResult, round_: Optional[int]) -> PassRecord:
        from passctl.ir.errors import UserError

        index = len(result.records) + 1
        self._hook("before_pass", p, model, index)
        start = time.perf_counter()
        try:
            res = p(model)
        except UserError:
            raise
        except Exception as e:
            failure = PassFailure(p.name, self._done, e)
            for inst in self.instruments:
                fn = getattr(inst, "on_failure", None)
                if fn is not None:
                    try:
                        fn(p, model, failure, index)
                    except Exception:  # the instrument must not hide the pass's own error
                        logger.exception("instrument %r failed while handling a pass failure", inst)
            raise failure from e
        record = PassRecord(p.name, (time.perf_counter() - start) * 1e3, bool(res.modified),
                            dict(res.stats), index, round_)
        result.records.append(record)
        if self.verify_each:
            diags = _verify(model)
            if diags:
                raise VerifyError(p.name, self._done, diags)
        self._done.append(p.name)
        self._hook("after_pass", p, model, record)
        return record


def run_passes(model: Model, passes: Sequence[Union[Pass, FixpointGroup]], **kwargs) -> ManagerResult:
    """Shorthand for ``PassManager(passes, **kwargs).run(model)``."""
    return PassManager(passes, **kwargs).run(model)


__all__ = ["FixpointGroup", "ManagerResult", "PassFailure", "PassManager", "PassRecord", "PassResult",
           "VerifyError", "run_passes"]
