"""The small ``passctl`` subcommands: show, verify, explain, list-passes, list-rules, list-targets."""

from __future__ import annotations

import dataclasses
import logging
import sys
from typing import List, Optional, Sequence

from passctl.ir.errors import UserError
from passctl.tools.model_source import load_model

logger = logging.getLogger(__name__)


def load_plugins(files: Sequence[str]) -> List[dict]:
    """Import each ``--load`` file; return ``[{"file": absolute path, "passes": [names]}]``.

    Raises:
        UserError: a file is missing or raises while being imported.
    """
    import os

    from passctl.passes.registry import load_plugin_file

    return [{"file": os.path.abspath(path), "passes": load_plugin_file(path)} for path in files]


def _model_files(path: str) -> List[str]:
    """Real paths of the model file and every file it references (ONNX external data, the
    ``@raw``/``@onnx`` files of IR text): what ``show --weights`` must never replace."""
    import os
    import re

    from passctl.tools.model_source import IR_TEXT_SUFFIX

    folder, refs = os.path.dirname(os.path.abspath(path)), []
    try:
        if path.endswith(IR_TEXT_SUFFIX):
            with open(path, encoding="utf-8", errors="replace") as f:
                refs = re.findall(r'@(?:raw|onnx)\(\s*"((?:[^"\\]|\\.)*)"', f.read())
        else:
            import onnx

            proto = onnx.load(path, load_external_data=False)
            from onnx.external_data_helper import _get_all_tensors

            for t in _get_all_tensors(proto):
                refs += [e.value for e in t.external_data if e.key == "location"]
    except Exception:  # the model loaded already; a reference we cannot list is not fatal
        logger.debug("could not list the files %s references", path, exc_info=True)
    return [os.path.realpath(path)] + [os.path.realpath(os.path.join(folder, r)) for r in refs]


def show(model_spec: str, weights: Optional[str] = None) -> None:
    """Print ``model_spec`` as IR text on stdout (plain text: no wrapping, no markup).

    Large weights are referenced (to the source model's data, or to ``weights`` when given) so
    that the printed text parses back with ``passctl.ir.parser.parse_model``.

    Raises:
        UserError: the model does not load; ``weights`` is the model itself, one of its data
            files, a folder, or cannot be written.
    """
    import os

    from passctl.ir.printer import print_model

    model, path = load_model(model_spec)
    if weights is not None:
        if os.path.isdir(weights):
            raise UserError(f"--weights '{weights}' is a folder; give a file path")
        if os.path.realpath(weights) in _model_files(path):
            raise UserError(f"--weights '{weights}' is the input model or one of its data files "
                            "and would be overwritten; choose a new file")
    try:
        text = print_model(model, weights_path=weights)
    except OSError as e:
        raise UserError(f"--weights '{weights}': cannot write it ({e.strerror or e}); choose a "
                        "writable file path") from e
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def verify(model_spec: str, console) -> int:
    """Print the verifier's diagnostics (each with its IR line underlined); return 0.

    Raises:
        UserError: the model has at least one error-severity diagnostic (CLI exit 2).
    """
    from passctl.ir.verifier import verify as run_verifier

    model, path = load_model(model_spec)
    diagnostics = run_verifier(model)
    for d in diagnostics:
        console.print(f"{path}: {d}", markup=False, highlight=False)
    errors = sum(1 for d in diagnostics if d.severity == "error")
    summary = f"{path}: {errors} error(s), {len(diagnostics) - errors} warning(s)"
    if errors:
        raise UserError(summary + "; the IR above is invalid")
    console.print(summary, markup=False, highlight=False)
    return 0


def explain(rule: str, model_spec: str, plugin_files: Sequence[str], console) -> None:
    """Print the best partial match of rewrite rule ``rule`` in the model and why it failed."""
    from passctl.passes.rewrite.explain import explain as explain_rule

    load_plugins(plugin_files)
    model, _ = load_model(model_spec)
    text = explain_rule(rule, model)
    console.print(text if isinstance(text, str) else str(text), markup=False, highlight=False)


def _option_text(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        default = repr(field.default)
    elif field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        default = repr(field.default_factory())  # type: ignore[misc]
    else:
        default = "required"
    typ = field.type
    if isinstance(typ, type):
        typ = typ.__name__  # int, float, str...
    elif not isinstance(typ, str):  # typing forms: Optional[bool], Literal['a', 'b']...
        typ = str(typ).replace("typing.", "")
    help_text = field.metadata.get("help", "") if field.metadata else ""
    return f"{field.name}: {typ} = {default}" + (f"  ({help_text})" if help_text else "")


def _table(*columns: str):
    """A borderless rich table with a bold header of ``columns``, as the list-* subcommands print."""
    from rich.table import Table

    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for col in columns:
        table.add_column(col)
    return table


def list_passes(plugin_files: Sequence[str], console) -> None:
    """Print every registered pass (name, summary, options) and the pass groups."""
    from rich.markup import escape

    from passctl.passes.registry import expand_alias, list_aliases
    from passctl.passes.registry import list_passes as registered

    load_plugins(plugin_files)
    table = _table("pass", "summary", "options")
    for cls in registered():
        options = "\n".join(_option_text(f) for f in cls.option_fields()) or "-"
        # escaped: rich would take "[bool]" in "Optional[bool]" for a markup tag and drop it
        table.add_row(escape(cls.name), escape(cls.summary), escape(options))
    console.print(table)
    groups = _table("group", "passes (target cpu)")
    for alias in list_aliases():
        try:
            passes = ", ".join(expand_alias(alias, "cpu"))
        except UserError as e:
            passes = f"none yet: {str(e).split(': ', 1)[-1]}"
        groups.add_row(alias, passes)
    console.print(groups)


def list_rules(plugin_files: Sequence[str], console) -> None:
    """Print every registered rewrite rule: name, summary and pattern (for ``passctl explain``)."""
    from rich.markup import escape

    from passctl.passes.rewrite.ruleset import list_rules as registered

    load_plugins(plugin_files)
    table = _table("rule", "summary", "pattern")
    for cls in registered():
        try:
            pattern = cls().describe_pattern()
        except Exception as e:  # a plugin rule that cannot be built still gets listed
            pattern = f"(pattern unavailable: {type(e).__name__}: {e})"
        table.add_row(escape(cls.name), escape(cls.summary or "-"), escape(pattern))
    console.print(table)


def list_targets(console) -> None:
    """Print the target profiles as a table."""
    from passctl.support.profiles import list_targets as profiles

    table = _table("target", "compute capability", "memory", "fast dtypes", "emitter", "description")
    for t in profiles():
        memory = f"{t.memory_bytes / 1e9:.0f} GB" if t.memory_bytes else "host"
        table.add_row(t.name, t.sm or "-", memory, ", ".join(t.fast_dtypes) or "-",
                      t.default_emitter, t.description)
    console.print(table)
