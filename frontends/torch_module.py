"""PyTorch frontend: an ``nn.Module`` or ``torch.export.ExportedProgram`` -> passctl IR.

The module is lowered through ``torch.export`` and the dynamo ONNX exporter
(``torch.onnx.export(..., dynamo=True)``, which needs ``onnxscript``), then imported like any ONNX
file. Each node's provenance is rewritten to the module path the exporter records in the node's
``pkg.torch.onnx.name_scopes`` metadata, e.g. ``layers.3.self_attn.q_proj/linear_12`` (module path,
then the ``torch.fx`` node it was exported from), so reports and errors name the user's modules.

torch is an optional dependency (``pip install -e '.[torch]'``): nothing here imports it before a
module is given.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import os
import sys
import warnings
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from passctl.ir import Model
from passctl.ir.errors import UserError

#: Install hint shared by every message that needs torch (works from a clone).
TORCH_INSTALL_HINT = "pip install -e '.[torch]' from a passctl clone"

#: Node metadata key the dynamo exporter fills with the module scopes of a node (a Python list
#: literal: ``['', 'layers.0', 'layers.0.q_proj', 'linear']``).
NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"


def require_torch():
    """Import torch, or raise a one-line :class:`UserError` saying what to install."""
    try:
        import torch
    except ImportError:
        raise UserError(f"a PyTorch model needs torch, which is not installed: {TORCH_INSTALL_HINT}"
                        ) from None
    if importlib.util.find_spec("onnxscript") is None:
        raise UserError("a PyTorch model is exported with torch.onnx's dynamo exporter, which needs "
                        f"onnxscript: {TORCH_INSTALL_HINT}")
    return torch


def is_torch_model(model: Any) -> bool:
    """Whether ``model`` is an ``nn.Module`` or ``ExportedProgram`` (without importing torch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    return isinstance(model, (torch.nn.Module, torch.export.ExportedProgram))


def _dynamic_shapes(torch, example_inputs: Tuple[Any, ...],
                    dynamic_dims: Optional[Sequence[Mapping[int, str]]]):
    """``dynamic_dims`` (one ``{axis: name}`` per positional input, ``None`` for static) as
    ``torch.export`` dynamic shapes; one ``Dim`` object per name so equal names are one symbol."""
    if not dynamic_dims:
        return None
    if len(dynamic_dims) != len(example_inputs):
        raise UserError(f"dynamic_dims has {len(dynamic_dims)} entries for {len(example_inputs)} "
                        "example inputs: give one {axis: name} mapping (or None) per input")
    dims: Dict[str, Any] = {}
    shapes = []
    for entry in dynamic_dims:
        if entry is None:
            shapes.append(None)
            continue
        shapes.append({int(axis): dims.setdefault(name, torch.export.Dim(name))
                       for axis, name in entry.items()})
    return tuple(shapes)


def export_onnx(model: Any, example_inputs: Sequence[Any] = (), path: str = "model.onnx", *,
                dynamic_dims: Optional[Sequence[Mapping[int, str]]] = None,
                opset: int = 18) -> str:
    """Export ``model`` to the ONNX file ``path`` with the dynamo exporter; returns ``path``.

    Args:
        model: a ``torch.nn.Module`` (put in ``eval()`` mode first by the caller) or a
            ``torch.export.ExportedProgram``.
        example_inputs: positional example tensors for a module (ignored for an exported program,
            which carries its own).
        path: the ONNX file to write (weights over 2 GB go to ``path + ".data"``).
        dynamic_dims: per positional input, ``{axis: dim name}`` for the axes that stay symbolic
            (the ONNX input gets ``dim_param`` = name), or ``None`` for a static input.
        opset: the ONNX opset the exporter targets (18, the dynamo exporter's default).

    Raises:
        UserError: torch or onnxscript is missing, or ``torch.export`` / the exporter refuses the
            module (the exporter's first message line is quoted).
    """
    torch = require_torch()
    example_inputs = tuple(example_inputs)
    program = isinstance(model, torch.export.ExportedProgram)
    if not program and not isinstance(model, torch.nn.Module):
        raise UserError(f"cannot compile a {type(model).__name__}: give a torch.nn.Module with "
                        "example_inputs, a torch.export.ExportedProgram, or an ONNX / .pir path")
    if not program and not example_inputs:
        raise UserError(f"{type(model).__name__}: an nn.Module needs example_inputs (a tuple of "
                        "tensors its forward takes) to be exported")
    # The exporter's own onnxscript optimizer stays on (what users of torch.onnx get): it folds
    # constants and Conv+BatchNormalization, keeping the BatchNormalization's module path.
    kwargs: Dict[str, Any] = {"dynamo": True, "opset_version": opset, "verbose": False}
    if not program:
        kwargs["dynamic_shapes"] = _dynamic_shapes(torch, example_inputs, dynamic_dims)
    try:
        # the exporter prints its progress ("[torch.onnx] Obtain model graph...") and warns about
        # renamed axes; passctl's own terminal output stays clean
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exported = torch.onnx.export(model, example_inputs if not program else (), **kwargs)
    except Exception as e:  # torch raises many types; the first line says what failed
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        name = type(model).__name__
        raise UserError(f"{name}: torch.onnx.export(dynamo=True) failed: {first[:300]} (export it "
                        "yourself with torch.onnx.export and give the .onnx file)") from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported.save(path, external_data=_needs_external_data(model, torch))
    return path


def _needs_external_data(model: Any, torch) -> bool:
    """Weights over 1.9 GB cannot live inside one protobuf (2 GB limit)."""
    if isinstance(model, torch.export.ExportedProgram):
        tensors = list(model.state_dict.values())
    else:
        tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors) > 1900 * 2**20


def module_provenance(model: Model) -> int:
    """Rewrite each imported node's provenance to its module path (from ``NAME_SCOPES_KEY``).

    ``['', 'layers.0', 'layers.0.q_proj', 'linear']`` becomes ``layers.0.q_proj/linear``: the
    innermost module scope and the fx node's name (unique in the program). Nodes without the
    metadata keep their ONNX node name. Returns the number of nodes renamed.
    """
    renamed = 0
    for node in model.graph.all_nodes():
        scopes_text = (node.metadata_props or {}).get(NAME_SCOPES_KEY)
        if not scopes_text:
            continue
        try:
            scopes = [s for s in ast.literal_eval(scopes_text) if s]
        except (ValueError, SyntaxError):
            continue
        if not scopes:
            continue
        modules, leaf = scopes[:-1], scopes[-1]
        node.provenance = (f"{modules[-1]}/{leaf}" if modules else leaf,)
        renamed += 1
    return renamed


def import_torch(model: Any, example_inputs: Sequence[Any] = (), workdir: str = ".", *,
                 dynamic_dims: Optional[Sequence[Mapping[int, str]]] = None) -> Model:
    """Export ``model`` (see :func:`export_onnx`) into ``workdir/model.onnx`` and import it.

    The returned :class:`Model` reads its weights from ``workdir`` (keep the folder until the model
    is saved). Provenance names module paths (:func:`module_provenance`).

    Raises:
        UserError: as :func:`export_onnx`.
    """
    from passctl.ir.onnx_import import load

    path = export_onnx(model, example_inputs, os.path.join(workdir, "model.onnx"),
                       dynamic_dims=dynamic_dims)
    imported = load(path)
    module_provenance(imported)
    return imported


def load_factory(spec: str) -> Tuple[Any, Tuple[Any, ...], Optional[Sequence[Mapping[int, str]]]]:
    """Call the factory that ``spec`` (``path/to/module.py:function``) names.

    The function takes no arguments and returns ``(module, example_inputs)`` or
    ``(module, example_inputs, dynamic_dims)``; a returned ``ExportedProgram`` needs no inputs.

    Returns:
        ``(model, example_inputs, dynamic_dims)``; ``model`` is put in ``eval()`` mode.

    Raises:
        UserError: the file or function does not exist, the file raises on import, or the function
            returns something else.
    """
    path, _, func = spec.rpartition(":")
    if not path.endswith(".py") or not func.isidentifier():
        raise UserError(f"'{spec}': a PyTorch model is given as FILE.py:FUNCTION, e.g. "
                        "model.py:make_model")
    if not os.path.isfile(path):
        raise UserError(f"'{spec}': Python file '{path}' not found")
    require_torch()
    name = "_passctl_factory_" + os.path.splitext(os.path.basename(path))[0]
    loader = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(loader)
    try:
        loader.loader.exec_module(module)
    except Exception as e:
        raise UserError(f"'{path}' raised {type(e).__name__} on import: {e}") from None
    factory = getattr(module, func, None)
    if not callable(factory):
        raise UserError(f"'{path}' has no function '{func}' (it should return "
                        "(module, example_inputs))")
    try:
        made = factory()
    except Exception as e:
        raise UserError(f"'{spec}' raised {type(e).__name__}: {e}") from None
    return normalize_torch_model(made, where=f"'{spec}'")


def normalize_torch_model(made: Any, where: str = "the model"):
    """``made`` (a module/program, or a tuple ``(module, example_inputs[, dynamic_dims])``) as
    ``(model, example_inputs, dynamic_dims)``; see :func:`load_factory`."""
    torch = require_torch()
    if isinstance(made, (torch.nn.Module, torch.export.ExportedProgram)):
        made = (made, ())
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise UserError(f"{where} returned {type(made).__name__}: return (module, example_inputs) "
                        "or (module, example_inputs, dynamic_dims)")
    model, inputs = made[0], made[1]
    dynamic = made[2] if len(made) == 3 else None
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if isinstance(model, torch.nn.Module):
        model.eval()
    return model, tuple(inputs), dynamic


def torch_outputs(model: Any, example_inputs: Sequence[Any]):
    """The model's own eager outputs on ``example_inputs`` as a list of numpy arrays (flattened
    like the exporter flattens them: tuples/lists/dicts in order), under ``torch.no_grad()``."""
    torch = require_torch()
    module = model.module() if isinstance(model, torch.export.ExportedProgram) else model
    with torch.no_grad():
        out = module(*example_inputs)
    flat = []

    def walk(x):
        if isinstance(x, torch.Tensor):
            flat.append(x.detach().cpu().numpy())
        elif isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)
        elif hasattr(x, "to_tuple"):  # transformers ModelOutput
            walk(x.to_tuple())
    walk(out)
    return flat
