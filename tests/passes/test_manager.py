"""PassManager: order, records, fixpoint groups with a step limit, verify-each, PassFailure naming."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from helpers import assert_same_outputs, parse

from passctl.ir import from_onnx, to_onnx
from passctl.ir.errors import UserError
from passctl.passes.base import Pass, PassResult, PreconditionError
from passctl.passes.manager import FixpointGroup, PassFailure, PassManager, VerifyError

MODEL = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2,3] x) => (float[2,3] y) {
        a = Identity (x)
        b = Identity (a)
        c = Identity (b)
        y = Relu (c)
    }"""


class Log(Pass):
    """Appends its label to a shared list; never modifies."""

    name = "log"

    def __init__(self, label, seen):
        super().__init__()
        self.label, self.seen = label, seen

    def run(self, model):
        self.seen.append(self.label)
        return PassResult(False, {"label": self.label})


class RemoveOneIdentity(Pass):
    """Removes the first Identity per run (so a fixpoint needs one round per Identity, plus one)."""

    name = "remove-one-identity"

    def run(self, model):
        for node in model.graph:
            if node.op_type == "Identity":
                node.outputs[0].replace_all_uses_with(node.inputs[0], replace_graph_outputs=True)
                model.graph.remove(node)
                return PassResult(True, {"removed": 1})
        return PassResult(False, {"removed": 0})


class AlwaysModified(Pass):
    name = "always-modified"

    def run(self, model):
        return PassResult(True)


class BreakIR(Pass):
    """Removes the Relu without rewiring its users: the graph output dangles."""

    name = "break-ir"

    def run(self, model):
        relu = next(n for n in model.graph if n.op_type == "Relu")
        model.graph.remove(relu, safe=False)
        return PassResult(True)


class Explode(Pass):
    name = "explode"

    def run(self, model):
        raise ZeroDivisionError("division by zero in explode")


def _model():
    return from_onnx(parse(MODEL))


def test_runs_in_order_and_records():
    seen = []
    model = _model()
    result = PassManager([Log("a", seen), RemoveOneIdentity(), Log("b", seen)]).run(model)
    assert seen == ["a", "b"]
    assert [r.name for r in result.records] == ["log", "remove-one-identity", "log"]
    assert [r.index for r in result.records] == [1, 2, 3]
    assert [r.modified for r in result.records] == [False, True, False]
    assert result.records[0].stats == {"label": "a"} and result.records[1].stats == {"removed": 1}
    assert all(r.time_ms >= 0 for r in result.records) and result.modified
    assert [n.op_type for n in model.graph] == ["Identity", "Identity", "Relu"]


def test_fixpoint_group_repeats_until_nothing_changes():
    proto = parse(MODEL)
    model = from_onnx(proto)
    result = PassManager([FixpointGroup([RemoveOneIdentity()], max_steps=10)]).run(model)
    # Three Identity nodes: three modifying rounds and a fourth that finds nothing.
    assert [r.modified for r in result.records] == [True, True, True, False]
    assert [r.round for r in result.records] == [1, 2, 3, 4]
    assert result.warnings == []
    assert [n.op_type for n in model.graph] == ["Relu"]
    assert_same_outputs(proto, to_onnx(model))


def test_fixpoint_step_limit_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="passctl.passes.manager"):
        result = PassManager([FixpointGroup([AlwaysModified()], max_steps=3, name="loop")]).run(_model())
    assert len(result.records) == 3
    assert len(result.warnings) == 1
    assert result.warnings[0].startswith("loop [always-modified] still modified the model after 3 rounds")
    assert result.warnings[0] in caplog.text


def test_verify_each_names_the_breaking_pass():
    seen = []
    with pytest.raises(VerifyError) as info:
        PassManager([Log("a", seen), RemoveOneIdentity(), BreakIR(), Log("never", seen)]).run(_model())
    e = info.value
    assert e.pass_name == "break-ir" and e.before == ["log", "remove-one-identity"]
    assert str(e).startswith("pass break-ir broke the IR after passes [log, remove-one-identity]: ")
    assert any(d.severity == "error" for d in e.diagnostics)
    assert seen == ["a"]


def test_verify_each_is_forced_on_in_tests():
    # conftest.py sets PassManager.default_verify_each, so even verify_each=False verifies.
    assert PassManager([], verify_each=False).verify_each
    with pytest.raises(VerifyError):
        PassManager([BreakIR()], verify_each=False).run(_model())


def test_without_verify_each_the_break_goes_unnoticed(monkeypatch):
    monkeypatch.setattr(PassManager, "default_verify_each", False)
    result = PassManager([BreakIR()]).run(_model())
    assert result.records[0].modified


def test_pass_failure_names_pass_and_predecessors():
    with pytest.raises(PassFailure) as info:
        PassManager([RemoveOneIdentity(), RemoveOneIdentity(), Explode()]).run(_model())
    e = info.value
    assert (e.pass_name, e.before) == ("explode", ["remove-one-identity", "remove-one-identity"])
    assert str(e) == ("pass 'explode' failed after passes [remove-one-identity, remove-one-identity]: "
                      "ZeroDivisionError: division by zero in explode")
    assert isinstance(e.__cause__, ZeroDivisionError)


def test_user_error_from_a_pass_passes_through():
    class Refuses(Pass):
        name = "refuses"

        def run(self, model):
            raise UserError("model.onnx: node 'y' (Relu) is not supported by refuses; drop the pass")

    with pytest.raises(UserError, match="not supported by refuses"):
        PassManager([Refuses()]).run(_model())


def test_requires_and_non_result_are_failures():
    class NeedsConv(Pass):
        name = "needs-conv"

        def requires(self, model):
            if not any(n.op_type == "Conv" for n in model.graph):
                raise PreconditionError("needs a Conv")

        def run(self, model):
            return PassResult(False)

    class ReturnsNone(Pass):
        name = "returns-none"

        def run(self, model):
            return None

    with pytest.raises(PassFailure, match="pass 'needs-conv' failed after passes \\[\\]: PreconditionError"):
        PassManager([NeedsConv()]).run(_model())
    with pytest.raises(PassFailure, match="returned NoneType, expected PassResult"):
        PassManager([ReturnsNone()]).run(_model())


def test_input_that_does_not_verify_is_reported_before_any_pass():
    model = _model()
    relu = next(n for n in model.graph if n.op_type == "Relu")
    model.graph.remove(relu, safe=False)
    with pytest.raises(VerifyError, match="^the input IR does not verify: "):
        PassManager([Log("a", [])]).run(model)


def test_real_pipeline_numerics():
    proto = parse("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2,3] x) => (float[2,3] y) {
            two = Constant <value = float[1] {2.0}> ()
            t = Mul (two, two)
            a = Identity (x)
            b = Mul (a, t)
            y = Add (b, x)
        }""")
    from passctl.passes.pipeline_text import build_pipeline

    model = from_onnx(proto)
    result = PassManager(build_pipeline("cleanup")).run(model)
    assert [r.name for r in result.records] == ["infer-shapes", "eliminate-identity", "fold-constants", "cse", "dce"]
    out = to_onnx(model)
    assert [n.op_type for n in out.graph.node] == ["Mul", "Add"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert_same_outputs(proto, out, inputs={"x": x})
