"""explain prints readable patterns; list-rules lists the rules (fresh-user trial, H17)."""

from __future__ import annotations

from passctl.passes.rewrite.pattern import AttrVar
from passctl.passes.rewrite.ruleset import list_rules


def test_attrvar_repr_is_readable():
    assert repr(AttrVar("group")) == "?group"
    assert repr(AttrVar("axis", default=-1)) == "?axis=-1"
    assert repr(AttrVar("activation", check=lambda v: v is None)) == \
        "?activation if lambda v: v is None"

    def positive(v):
        return v > 0

    assert repr(AttrVar("alpha", check=positive)) == "?alpha if positive"


def test_explain_shows_no_python_object_dumps(cli, conv_bn_model):
    r = cli("explain", "conv-add-clip", conv_bn_model)
    assert r.rc == 0, r.err
    assert "activation=?activation if lambda v: v is None" in r.out
    assert "AttrVar(" not in r.out and "<function" not in r.out and " at 0x" not in r.out


def test_unknown_rule_without_close_match_points_to_list_rules(cli, conv_bn_model):
    r = cli("explain", "zzzzqqqq", conv_bn_model)
    assert r.rc == 2 and "`passctl list-rules`" in r.err
    assert len(r.err) < 300  # no dump of every rule name


def test_list_rules_lists_every_rule_with_its_pattern(cli):
    r = cli("list-rules")
    assert r.rc == 0, r.err
    rows = {line.split()[0] for line in r.out.splitlines()[1:] if line.strip()}
    assert {cls.name for cls in list_rules()} <= rows
    assert "Add(Conv(%x, %w" in r.out
