"""`passctl show --weights` never overwrites the input model or its data (fresh-user trial, H17)."""

from __future__ import annotations

import numpy as np
import onnx
from cli_helpers import conv_bn_proto, sha256
from onnx import numpy_helper


def test_weights_onto_the_model_itself_is_refused(cli, conv_bn_model):
    before = sha256(conv_bn_model)
    r = cli("show", conv_bn_model, "--weights", conv_bn_model)
    assert r.rc == 2 and "is the input model" in r.err
    assert sha256(conv_bn_model) == before


def test_weights_onto_the_external_data_file_is_refused(cli, tmp_path):
    proto = conv_bn_proto()
    proto.graph.initializer[0].CopyFrom(numpy_helper.from_array(
        np.ones((4, 3, 3, 3), np.float32), "w"))
    path = tmp_path / "ext.onnx"
    onnx.save(proto, str(path), save_as_external_data=True, location="ext.data",
              size_threshold=0)
    data = tmp_path / "ext.data"
    before = sha256(data)
    r = cli("show", path, "--weights", data)
    assert r.rc == 2 and "data files" in r.err
    assert sha256(data) == before


def test_weights_in_an_unwritable_place_is_a_user_error(cli, conv_bn_model, tmp_path):
    r = cli("show", conv_bn_model, "--weights", "/proc/no-such-folder/w.bin")
    assert r.rc == 2 and "cannot write" in r.err and "Traceback" not in r.err
    r = cli("show", conv_bn_model, "--weights", tmp_path)
    assert r.rc == 2 and "is a folder" in r.err


def test_weights_to_a_new_file_still_works(cli, conv_bn_model, tmp_path):
    r = cli("show", conv_bn_model, "--weights", tmp_path / "w.bin")
    assert r.rc == 0 and "Conv" in r.out
