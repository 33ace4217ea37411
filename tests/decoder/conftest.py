import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import pytest  # noqa: E402


@pytest.fixture(scope="session", params=["llama", "mqa"])
def past_decoder(request, tmp_path_factory):
    """(transformers model, its dynamo export in the Optimum layout with past_key_values) for GQA
    (4 heads, 2 KV heads) and MQA (1 KV head); shared by the rotary and attention-past tests."""
    from decoder_helpers import export_past_decoder, tiny_model

    model = tiny_model(request.param, seed=3)
    path = tmp_path_factory.mktemp(request.param) / "decoder.onnx"
    return model, export_past_decoder(model, str(path))
