"""The emitter registry: built-ins, a registered third-party emitter with typed options parsed by
the pipeline-text parser, the passctl.emitters entry points, and output forms an emitter refuses."""

from __future__ import annotations

import json
import os
from typing import Optional

import pytest

from passctl.ir.errors import UserError
from passctl.passes.base import OutputForm, Pass
from passctl.targets import Emitter, emitter_names, get_emitter, register_emitter
from passctl.targets import registry


class _JsonEmitter(Emitter):
    """Writes the graph's node op types as JSON (an emitter a plugin could add)."""

    name = "json-ops"
    refused_forms = {"uint8-qdq": "json-ops wants signed codes"}

    def __init__(self, indent: int = 0, sort: bool = False, label: Optional[str] = None):
        if indent < 0:
            raise UserError(f"indent={indent}: give 0 or more")
        self.indent, self.sort, self.label = indent, sort, label

    def write(self, model, target, folder):
        ops = [n.op_type for n in model.graph]
        with open(os.path.join(folder, "ops.json"), "w") as f:
            json.dump(sorted(ops) if self.sort else ops, f, indent=self.indent or None)
        return {"emitter": self.name, "files": ["ops.json"]}


@pytest.fixture
def json_emitter():
    register_emitter(_JsonEmitter)
    yield _JsonEmitter
    registry._EMITTERS.pop("json-ops", None)


def test_a_registered_emitter_gets_typed_options(json_emitter):
    assert emitter_names() == ["onnxruntime", "tvm", "tensorrt", "json-ops"]
    e = get_emitter("json-ops{indent=2, sort=true, label='a,b'}")
    assert isinstance(e, _JsonEmitter) and (e.indent, e.sort, e.label) == (2, True, "a,b")
    assert get_emitter("JSON-OPS{label=auto}").label is None  # auto: an Optional's None
    with pytest.raises(UserError, match=r"^--emit 'json-ops\{indent=x\}': option indent='x' must "
                                        r"be an integer$"):
        get_emitter("json-ops{indent=x}")
    with pytest.raises(UserError, match=r"^--emit 'json-ops\{indent=-1\}': indent=-1: give 0"):
        get_emitter("json-ops{indent=-1}")
    with pytest.raises(UserError, match=r"unknown json-ops emitter option 'sorted'; known: indent, "
                                        r"sort, label \(as key=value\); did you mean 'sort'\?"):
        get_emitter("json-ops{sorted=true}")
    with pytest.raises(ValueError, match="already registered"):
        register_emitter(type("Other", (Emitter,), {"name": "json-ops"}))


def test_an_emitter_refuses_a_declared_output_form(json_emitter):
    class _Writes(Pass):
        name = "writes-uint8"

        def output_forms(self):
            return [OutputForm("uint8-qdq", "mode=u8", "uint8 codes", "drop mode=u8")]

    with pytest.raises(UserError, match=r"^--emit json-ops: writes-uint8\{mode=u8\} writes uint8 "
                                        r"codes, and json-ops wants signed codes; drop mode=u8$"):
        get_emitter("json-ops").check_passes([_Writes()])
    get_emitter("onnxruntime").check_passes([_Writes()])  # refuses nothing


def test_entry_points_register_emitters(monkeypatch):
    class _EntryPoint:
        name, value = "json", "somewhere:_JsonEmitter"

        def load(self):
            return _JsonEmitter

    def entry_points(group):
        return [_EntryPoint()] if group == registry.ENTRY_POINT_GROUP else []

    monkeypatch.setattr(registry.importlib.metadata, "entry_points", entry_points)
    try:
        assert registry.load_entry_points() == ["json"]
        assert "json-ops" in emitter_names()
    finally:
        registry._EMITTERS.pop("json-ops", None)

    class _Broken(_EntryPoint):
        def load(self):
            raise ImportError("no module named somewhere")

    monkeypatch.setattr(registry.importlib.metadata, "entry_points",
                        lambda group: [_Broken()])
    with pytest.raises(UserError, match=r"entry point 'json = somewhere:_JsonEmitter' \(group "
                                        r"passctl.emitters\) failed to import: ImportError"):
        registry.load_entry_points()


PLUGIN = '''
import json, os
from passctl.targets import Emitter, register_emitter


@register_emitter(replace=True)
class OpsEmitter(Emitter):
    name = "ops-list"

    def __init__(self, sort: bool = False):
        self.sort = sort

    def write(self, model, target, folder):
        ops = [n.op_type for n in model.graph]
        with open(os.path.join(folder, "ops.json"), "w") as f:
            json.dump(sorted(ops) if self.sort else ops, f)
        return {"emitter": self.name, "files": ["ops.json"]}
'''


def test_compile_emits_with_an_emitter_a_plugin_file_registers(tmp_path):
    from small_graphs import conv_relu_conv

    from passctl.tools.cli import main

    model = conv_relu_conv(tmp_path / "m.onnx")
    (tmp_path / "plugin.py").write_text(PLUGIN)
    try:
        rc = main([model, "--load", str(tmp_path / "plugin.py"), "--emit", "ops-list{sort=true}",
                   "-o", str(tmp_path / "out"), "-q"])
        assert rc == 0
        assert json.loads((tmp_path / "out" / "ops.json").read_text()) == ["Conv", "Conv", "Relu"]
        report = json.loads((tmp_path / "out" / "report.json").read_text())
        assert report["emitter"] == "ops-list" and report["artifact"]["files"] == ["ops.json"]
    finally:
        registry._EMITTERS.pop("ops-list", None)
