"""The package's import graph: no import cycle between files (import-linter's layers contract,
run by .ci/run as ``lint-imports``, checks the layer order but not cycles inside a layer)."""

import grimp
import networkx as nx


def _file_graph() -> nx.DiGraph:
    """Every import between passctl's modules (function-level imports included), as grimp reads
    them from the source."""
    imports = grimp.build_graph("passctl")
    graph = nx.DiGraph()
    for module in imports.modules:
        graph.add_node(module)
        for imported in imports.find_modules_directly_imported_by(module):
            graph.add_edge(module, imported)
    return graph


def test_no_file_imports_another_that_imports_it_back():
    graph = _file_graph()
    assert "passctl.tools.cli" in graph and "passctl.support.check" in graph  # the real package
    cycles = [sorted(scc) for scc in nx.strongly_connected_components(graph) if len(scc) > 1]
    self_imports = sorted(m for m in graph if graph.has_edge(m, m))
    assert cycles == [] and self_imports == [], (cycles, self_imports)


def test_a_cycle_would_be_found():
    """The check itself: the graph of two files importing each other has that cycle."""
    graph = _file_graph()
    graph.add_edge("passctl.support.check", "passctl.tools.cli")
    graph.add_edge("passctl.tools.cli", "passctl.support.check")
    found = [scc for scc in nx.strongly_connected_components(graph) if len(scc) > 1]
    assert len(found) == 1 and {"passctl.support.check", "passctl.tools.cli"} <= found[0]
