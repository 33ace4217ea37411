"""The delayed progress bar, and --verify-each catching a plugin pass that breaks the IR."""

import io
import os
import time
from pathlib import Path

from rich.console import Console

from passctl.tools.report import DelayedProgress

BREAK_IR_PLUGIN = '''
from passctl.ir import Node
from passctl.passes.base import Pass, PassResult
from passctl.passes.registry import register_pass


@register_pass(replace=True)
class BreakIR(Pass):
    name = "break-ir"
    summary = "inserts a node at the top that reads the last node's output (use before definition)"

    def run(self, model):
        last = model.graph.nodes[-1]
        model.graph.insert_after(None, Node("", "Neg", [last.outputs[0]], name="early_neg"))
        return PassResult(True, {"broken": 1})
'''


def test_progress_bar_appears_only_after_the_delay():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=80)
    with DelayedProgress(console, total=2, delay=0.2) as progress:
        progress.update("fast-pass", advance=1)
    assert buf.getvalue() == ""
    with DelayedProgress(console, total=2, delay=0.05) as progress:
        progress.update("slow-pass")
        time.sleep(0.4)
    assert "slow-pass" in buf.getvalue()


def test_no_progress_bar_when_not_a_terminal():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=False)
    with DelayedProgress(console, total=1, delay=0.0) as progress:
        progress.update("pass")
        time.sleep(0.1)
    assert buf.getvalue() == ""


def test_verify_each_names_the_pass_that_broke_the_ir(cli, conv_bn_model, tmp_path):
    plugin = tmp_path / "break_ir.py"
    plugin.write_text(BREAK_IR_PLUGIN)
    out = tmp_path / "out"
    r = cli(conv_bn_model, "--load", plugin, "--pipeline", "eliminate-identity,break-ir",
            "--verify-each", "-o", out, "--reproducer-dir", tmp_path / "crash")
    assert r.rc == 3, (r.out, r.err)
    assert "pass break-ir broke the IR after passes [eliminate-identity]" in r.err
    assert "Traceback" not in r.err
    folder = Path(r.err.split("passctl: reproducer: ")[1].strip())
    assert folder.parent == tmp_path / "crash"
    assert {"command.sh", "traceback.txt", "model.pir"} <= set(os.listdir(folder))
    assert "early_neg" in (folder / "model.pir").read_text()
    assert "--verify-each" in (folder / "command.sh").read_text()
    assert not out.exists()
