"""PyTorch frontend: nn.Module / ExportedProgram / FILE.py:FUNCTION through passctl.compile and the
CLI, compared with the module's own eager outputs in torch (not only with an intermediate export)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # the frontend's optional dependency; the test env has it

import passctl  # noqa: E402
from passctl.tools.cli import main  # noqa: E402


def _rel(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def _run_artifact(result, arrays):
    names = [v.name for v in result.model.graph.inputs]
    return list(passctl.run(result.artifact, dict(zip(names, arrays))).values())


@pytest.mark.slow
def test_torchvision_resnet18_module_matches_torch_eager(tmp_path):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    resnet = torchvision.models.resnet18().eval()
    x = torch.randn(2, 3, 96, 96)
    result = passctl.compile(resnet, pipeline="cleanup,fuse", example_inputs=(x,),
                             dynamic_dims=[{0: "batch"}], output=str(tmp_path / "r18"), check=True)
    assert result.check["ok"] and result.check["torch"]["ok"]
    assert result.report["model"]["source"] == "pytorch"
    assert result.report["op_histogram"]["after"].get("com.microsoft::FusedConv", 0) >= 17  # the fusions fired
    with torch.no_grad():
        want = resnet(x).numpy()
        other = torch.randn(3, 3, 96, 96)  # a batch size the export never saw (dynamic axis)
        want_other = resnet(other).numpy()
    assert _rel(_run_artifact(result, [x.numpy()])[0], want) <= 1e-5
    assert _rel(_run_artifact(result, [other.numpy()])[0], want_other) <= 1e-5


def _small_bert():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=120, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128,
                                     max_position_embeddings=64)
    torch.manual_seed(0)
    bert = transformers.BertModel(config).eval()
    with torch.no_grad():  # fresh init has unit norms and zero biases; trained models do not
        for p in bert.parameters():
            p.add_(0.02 * torch.randn_like(p))
    return bert


@pytest.mark.slow
def test_transformers_bert_from_config_matches_torch_eager(tmp_path):
    bert = _small_bert()
    ids = torch.randint(0, 120, (1, 12))
    mask = torch.ones(1, 12, dtype=torch.int64)
    mask[0, 9:] = 0  # padding: the mask path is exercised
    result = passctl.compile(bert, pipeline="cleanup,fuse", example_inputs=(ids, mask),
                             output=str(tmp_path / "bert"), check=True)
    assert result.check["torch"]["ok"]
    with torch.no_grad():
        eager = bert(ids, mask)
    got = _run_artifact(result, [ids.numpy(), mask.numpy()])
    assert _rel(got[0], eager.last_hidden_state.numpy()) <= 1e-5
    assert _rel(got[1], eager.pooler_output.numpy()) <= 1e-5
    paths = {p for row in result.report["provenance"] for p in row["from"]}
    assert any(p.startswith("encoder.layer.1.attention") for p in paths)  # module paths


@pytest.mark.slow
def test_exported_program_is_accepted(tmp_path):
    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(6, 5)

        def forward(self, x):
            return torch.nn.functional.gelu(self.proj(x))

    torch.manual_seed(1)
    tiny = Tiny().eval()
    x = torch.randn(4, 6)
    program = torch.export.export(tiny, (x,))
    result = passctl.compile(program, pipeline="cleanup,fuse", output=str(tmp_path / "p"))
    with torch.no_grad():
        want = tiny(x).numpy()
    assert _rel(_run_artifact(result, [x.numpy()])[0], want) <= 1e-5
    assert any(row["from"] and row["from"][0].startswith("proj/")
               for row in result.report["provenance"])


@pytest.mark.slow
def test_cli_factory_spec_compiles_and_the_report_names_module_paths(tmp_path, monkeypatch):
    factory = tmp_path / "model.py"
    factory.write_text(textwrap.dedent('''
        import torch

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.q_proj = torch.nn.Linear(8, 8)
                self.norm = torch.nn.LayerNorm(8)

            def forward(self, x):
                return self.norm(torch.relu(self.q_proj(x)) + x)

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = torch.nn.ModuleList([Block() for _ in range(3)])

            def forward(self, x):
                for layer in self.layers:
                    x = layer(x)
                return x

        def make_model():
            torch.manual_seed(0)
            return Net(), (torch.randn(2, 8),)
    '''))
    monkeypatch.chdir(tmp_path)
    assert main(["model.py:make_model", "--pipeline", "cleanup,fuse", "-o", "out", "--check",
                 "-q"]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["model"]["argument"] == "model.py:make_model"
    assert report["check"]["ok"] and report["check"]["torch"]["ok"]
    paths = {p.split("/")[0] for row in report["provenance"] for p in row["from"]}
    assert {"layers.0.q_proj", "layers.2.norm"} <= paths
    import importlib.util
    spec = importlib.util.spec_from_file_location("factory_under_test", factory)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    net, (x,) = module.make_model()
    with torch.no_grad():
        want = net.eval()(x).numpy()
    got = passctl.run(str(tmp_path / "out"), {"x": x.numpy()})
    assert _rel(next(iter(got.values())), want) <= 1e-5


@pytest.mark.parametrize("spec, needle", [
    ("nofile.py:make", "Python file 'nofile.py' not found"),
    ("model.py:absent", "has no function 'absent'"),
    ("model.py:broken", "raised ZeroDivisionError"),
    ("model.py:wrong", "return (module, example_inputs)"),
])
def test_cli_factory_errors_are_one_line_exit_2(tmp_path, monkeypatch, capsys, spec, needle):
    (tmp_path / "model.py").write_text("def broken():\n    return 1 / 0\n\n"
                                       "def wrong():\n    return 42\n")
    monkeypatch.chdir(tmp_path)
    assert main([spec, "-o", "out"]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_module_without_example_inputs_is_a_user_error(tmp_path):
    with pytest.raises(passctl.UserError, match="needs example_inputs"):
        passctl.compile(torch.nn.Linear(2, 2), output=str(tmp_path / "o"))


def test_without_torch_the_error_says_what_to_install(tmp_path):
    code = ("import sys; sys.modules['torch'] = None\n"
            "import passctl\n"
            "try:\n    passctl.compile('m.py:make')\n"
            "except passctl.UserError as e:\n    print(e)\n")
    (tmp_path / "m.py").write_text("def make():\n    pass\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, check=True)
    assert "pip install -e '.[torch]'" in out.stdout
