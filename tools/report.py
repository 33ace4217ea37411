"""report.json (docs/report-schema.md), the terminal summary, a progress bar that waits a second."""

from __future__ import annotations

import collections
import json
import os
import threading
from typing import Any, Dict, List

from passctl.ir import Graph, Model

#: The value of ``report.json``'s ``schema`` key; bump it when a key changes meaning.
REPORT_SCHEMA = "passctl.report/1"
REPORT_FILE = "report.json"


def op_histogram(model: Model) -> Dict[str, int]:
    """Count nodes per operator in the main graph and all subgraphs.

    Keys are ``Node.qualified_op`` (``"Conv"``, ``"com.microsoft::FusedConv"``); sorted by count,
    most frequent first, then by name.
    """
    counts = collections.Counter(n.qualified_op for n in model.graph.all_nodes())
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def count_nodes(graph: Graph) -> int:
    """Nodes in ``graph`` and its subgraphs."""
    return sum(1 for _ in graph.all_nodes())


def write_report(folder: str, report: Dict[str, Any]) -> str:
    """Write ``report`` as ``folder/report.json`` (indented, keys in order); return its path."""
    path = os.path.join(folder, REPORT_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=2, default=_json_default)
        f.write("\n")
    os.replace(tmp, path)
    return path


def _json_default(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return str(obj)


def _fmt_err(x) -> str:
    return "n/a" if x is None else f"{float(x):.3g}"


TABLE_WIDTH = 120
"""Widest line of the terminal pass table; longer statistics wrap inside the "what it did" column."""
SHORT_TEXT = 40
"""Longest string statistic shown in the terminal table (longer ones are in report.json only)."""


def _shown(value: Any) -> bool:
    """Whether a statistic goes into the terminal table: a nonzero number, ``True``, or a nonempty
    string of at most :data:`SHORT_TEXT` characters. Lists and dicts (per-layer reports such as
    quantize's ``layers``, nested ``search`` records) are left to report.json."""
    import numpy as np

    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (bool, int, float)):
        return bool(value)
    return isinstance(value, str) and 0 < len(value) <= SHORT_TEXT


def stats_text(stats: Dict[str, Any]) -> str:
    """``"k=v, k=v"`` of the statistics :func:`_shown` keeps, or ``"modified"`` when none is."""
    return ", ".join(f"{k}={v}" for k, v in stats.items() if _shown(v)) or "modified"


def print_summary(console, report: Dict[str, Any]) -> None:
    """Print the short terminal summary of a compile run with rich.

    Shows the passes that changed the model with their scalar statistics (:func:`stats_text`; the
    table is at most :data:`TABLE_WIDTH` columns wide, longer statistics wrap), the node counts before
    and after, the check's worst errors under each of its ``bounds``, the total time and where the
    artifact is. ``report``: the one :func:`passctl.tools.compile.run_compile` just built.
    """
    from rich.table import Table

    fired: List[Dict[str, Any]] = [p for p in report["passes"] if p["modified"]]
    table = Table(title=None, show_header=True, header_style="bold", box=None, pad_edge=False)
    rows = [(p["name"], f"{p['time_ms']:.1f}", stats_text(p["stats"])) for p in fired]
    name_width = max([len("pass")] + [len(r[0]) for r in rows])
    ms_width = max([len("ms")] + [len(r[1]) for r in rows])
    # two spaces between columns (padding 1 on each side, no box)
    table.add_column("pass", no_wrap=True)
    table.add_column("ms", justify="right", no_wrap=True)
    table.add_column("what it did", overflow="fold",
                     max_width=max(len("what it did"), TABLE_WIDTH - name_width - ms_width - 4))
    for row in rows:
        table.add_row(*row)
    if fired:
        console.print(table)
    else:
        console.print("no pass changed the model")
    nodes = report["nodes"]
    console.print(f"nodes: {nodes['before']} -> {nodes['after']}")
    check = report.get("check")
    if check is not None and check["outputs"]:
        worst = max(check["outputs"], key=lambda o: float(o["max_rel"]))
        defaults = [f"{k}={v}" for k, v in check["dims"].items()
                    if check["dims_source"].get(k) == "default"]
        note = (f"; default sizes {', '.join(defaults)} (set them with --dim NAME=SIZE)"
                if defaults else "")
        given = len(check["overridden"])
        seeded = len(check["inputs"]) - given
        if not seeded:
            used = f"{given} given input(s) from --inputs"
        elif given:
            used = (f"{len(check['inputs'])} input(s): {given} given (--inputs), {seeded} seeded "
                    f"with seed {check['seed']}")
        else:
            used = f"{seeded} seeded input(s), seed {check['seed']}"
        on_atol = check["passed_on_atol"]
        if on_atol and check["ok"]:
            note += (f"; passed on atol: max abs error <= {check['atol']:g} though max rel error > "
                     f"rtol {check['rtol']:g} ({', '.join(on_atol)})")
        bounds = check["bounds"]
        rel_bound = "".join(f" (bound {b['rtol']:g})" for b in bounds
                            if b["metric"] == "max-rel" and len(bounds) > 1)
        bound = "".join(f", {b['metric']} error {_fmt_err(b['error'])} (bound {b['rtol']:g})"
                        for b in bounds if b["metric"] != "max-rel")
        console.print(f"check: max abs error {_fmt_err(check['max_abs'])}, max rel error "
                      f"{_fmt_err(check['max_rel'])}{rel_bound}{bound} (worst output "
                      f"'{worst['name']}') on {used}{note}")
    console.print(f"time: {report['timing']['total_s']:.2f} s; "
                  f"artifact: {report['artifact']['path']}")


class DelayedProgress:
    """A rich progress bar over the pipeline's passes that appears only after ``delay`` seconds.

    Runs shorter than the delay print nothing; longer ones show a transient bar (removed when
    done). Disabled when the console is not a terminal.
    """

    def __init__(self, console, total: int, delay: float = 1.0):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.enabled = console.is_terminal and total > 0
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                                  console=console, transient=True)
        self._task = self._progress.add_task("passes", total=total)
        self._lock = threading.Lock()
        self._started = False
        self._done = False
        self._timer = threading.Timer(delay, self._start)
        self._timer.daemon = True

    def _start(self) -> None:
        with self._lock:
            if not self._done:
                self._progress.start()
                self._started = True

    def __enter__(self) -> "DelayedProgress":
        if self.enabled:
            self._timer.start()
        return self

    def update(self, description: str, advance: int = 0) -> None:
        """Show ``description`` (e.g. the running pass) and advance by ``advance`` steps."""
        self._progress.update(self._task, description=description, advance=advance)

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._done = True
            self._timer.cancel()
            if self._started:
                self._progress.stop()
