"""Small readability fixes from the fresh-user trial (H17): list-passes types, binary .pir,
quiet infer-shapes on -1 declared dims."""

from __future__ import annotations

import logging
import shutil

import onnx
from cli_helpers import conv_bn_proto


def test_list_passes_shows_full_option_types(cli):
    r = cli("list-passes")
    assert r.rc == 0, r.err
    assert "emulate: Optional[bool] = None" in r.out
    assert "emulate: Optional = None" not in r.out


def test_onnx_file_named_pir_says_so(cli, conv_bn_model, tmp_path):
    pir = tmp_path / "model.pir"
    shutil.copy(conv_bn_model, pir)
    r = cli("show", pir)
    assert r.rc == 2
    assert "looks like an ONNX (protobuf) file" in r.err and "rename it to .onnx" in r.err
    blob = tmp_path / "blob.pir"
    blob.write_bytes(b"\xff\xfe\x00\x01binary")
    r = cli("verify", blob)
    assert r.rc == 2 and "looks like a binary file" in r.err


def test_infer_shapes_treats_negative_declared_dims_as_unknown(cli, tmp_path, caplog):
    proto = conv_bn_proto()
    proto.graph.output[0].type.tensor_type.shape.dim[0].dim_value = -1
    proto.graph.value_info.append(onnx.helper.make_tensor_value_info(
        "c", onnx.TensorProto.FLOAT, [-1, 4, -1, 8]))
    path = tmp_path / "neg.onnx"
    onnx.save(proto, str(path))
    with caplog.at_level(logging.WARNING):
        r = cli("compile", path, "--pipeline", "infer-shapes", "-o", tmp_path / "out", "-q")
    assert r.rc == 0, r.err
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING], caplog.text
    got = onnx.load(str(tmp_path / "out" / "model.onnx"))
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in list(got.graph.value_info) + list(got.graph.output)}
    assert shapes["c"] == [1, 4, 8, 8] and shapes["y"] == [1, 4, 8, 8]
