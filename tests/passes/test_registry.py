"""Pass registry: lookup, suggestions, aliases (incl. not-yet-implemented ones), plugin files, entry points."""

from __future__ import annotations

import textwrap

import pytest

from passctl.ir.errors import UserError
from passctl.passes import registry
from passctl.passes.base import Pass, PassResult
from passctl.passes.pipelines import CLEANUP
from passctl.passes.registry import (UnknownPassError, expand_alias, expand_names, get_pass,
                                     list_passes, load_entry_points, load_plugin_file, register_pass)


class _Noop(Pass):
    name = "test-noop"
    summary = "does nothing"

    def run(self, model):
        return PassResult(False)


def test_register_and_get_and_list():
    assert register_pass(_Noop) is _Noop
    assert get_pass("test-noop") is _Noop
    names = [c.name for c in list_passes()]
    assert names == sorted(names)
    # The built-in passes are imported lazily on the first lookup.
    assert {"test-noop", "dce", "cse", "fold-constants", "eliminate-identity", "fuse-conv-bn",
            "infer-shapes"} <= set(names)


def test_register_rejects_bad_names_and_duplicates():
    class Bad(Pass):
        name = "Bad_Name"

    with pytest.raises(TypeError, match="kebab-case"):
        register_pass(Bad)

    class Alias(Pass):
        name = "cleanup"

    with pytest.raises(ValueError, match="alias"):
        register_pass(Alias)

    class OtherDce(Pass):
        name = "dce"

    with pytest.raises(ValueError, match="already registered"):
        register_pass(OtherDce)
    assert register_pass(replace=True)(OtherDce) is OtherDce
    assert get_pass("dce") is OtherDce


def test_unknown_name_suggests_closest():
    with pytest.raises(UnknownPassError, match=r"unknown pass 'fold-constant'; did you mean 'fold-constants'\?"):
        get_pass("fold-constant")
    with pytest.raises(UserError, match="did you mean 'cleanup'"):
        expand_names(["claenup"])
    with pytest.raises(UserError, match="passctl list-passes"):
        get_pass("zzzzzz")


def test_cleanup_alias_expands_in_order():
    assert expand_alias("cleanup") == CLEANUP == ["infer-shapes", "eliminate-identity", "fold-constants", "cse", "dce"]
    assert expand_alias("cleanup", "a10") == CLEANUP  # targets without their own list use cpu's
    assert expand_names(["dce", "cleanup", "fuse-conv-bn"]) == [
        "dce", "infer-shapes", "eliminate-identity", "fold-constants", "cse", "dce", "fuse-conv-bn"]


def test_quantize_alias_expands_for_every_target():
    # quantize is no longer reserved: the same passes for every target and emitter.
    for target in ("cpu", "a10", "h100"):
        assert expand_alias("quantize", target) == ["infer-shapes", "quantize-int8", "dce"]
    assert expand_alias("quantize", "a10", "tensorrt") == ["infer-shapes", "quantize-int8", "dce"]
    assert get_pass("quantize-int8").name == "quantize-int8"


@pytest.fixture
def reserved_alias(monkeypatch):
    """A group reserved for a later feature (no alias is reserved in this version: quantize was)."""
    from passctl.passes import pipelines

    monkeypatch.setitem(pipelines.ALIASES, "future-group", {"cpu": []})
    monkeypatch.setitem(pipelines.NOT_YET, "future-group", "time travel is not implemented in this version")
    return "future-group"


def test_aliases_without_passes_say_what_is_missing(reserved_alias):
    with pytest.raises(UserError) as info:
        expand_alias(reserved_alias, "h100")
    assert str(info.value).startswith(f"`{reserved_alias}` has no passes yet: ")
    assert "time travel" in str(info.value) and "not implemented in this version" in str(info.value)


def test_empty_alias_message_exact(reserved_alias):
    with pytest.raises(UserError) as info:
        expand_names(["cleanup", reserved_alias])
    assert str(info.value) == ("`future-group` has no passes yet: time travel is not implemented in "
                               "this version")


def test_plugin_file_registers_its_passes(tmp_path):
    plugin = tmp_path / "my_passes.py"
    plugin.write_text(textwrap.dedent("""
        from passctl.passes.base import Pass, PassResult
        from passctl.passes.registry import register_pass

        @register_pass
        class CountNodes(Pass):
            name = "count-nodes"
            summary = "counts nodes"

            def run(self, model):
                return PassResult(False, {"nodes": len(model.graph)})
    """))
    assert load_plugin_file(plugin) == ["count-nodes"]
    cls = get_pass("count-nodes")
    assert cls.summary == "counts nodes" and cls.__module__.startswith("passctl_plugin_")
    # Loading the same file again re-registers the same-named class without error.
    assert load_plugin_file(str(plugin)) == ["count-nodes"]


def test_plugin_file_errors_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="plugin file not found"):
        load_plugin_file(tmp_path / "missing.py")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UserError, match=r"must be a \.py file"):
        load_plugin_file(tmp_path / "notes.txt")
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(UserError, match=r"bad\.py: plugin file raised RuntimeError while being imported: boom"):
        load_plugin_file(bad)


def test_entry_point_group_loads_installed_plugins(tmp_path, monkeypatch):
    (tmp_path / "ep_plugin_mod.py").write_text(textwrap.dedent("""
        from passctl.passes.base import Pass, PassResult

        class FromEntryPoint(Pass):
            name = "from-entry-point"
            summary = "registered through an entry point"

            def run(self, model):
                return PassResult(False)
    """))
    dist = tmp_path / "ep_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[passctl.passes]\nfrom_ep = ep_plugin_mod:FromEntryPoint\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "from_ep" in load_entry_points()
    assert get_pass("from-entry-point").summary == "registered through an entry point"


def test_broken_entry_point_is_a_user_error(tmp_path, monkeypatch):
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[passctl.passes]\nbroken = no_such_module_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match="entry point 'broken = no_such_module_xyz'.*failed to import"):
        load_entry_points()
