"""explain prints readable patterns; list-rules lists the rules (fresh-user trial, H17)."""

from __future__ import annotations

import re

from passctl.passes.rewrite.pattern import AttrVar
from passctl.passes.rewrite import ruleset
from passctl.passes.rewrite.ruleset import get_rule, list_rules


def test_attrvar_repr_is_readable():
    assert repr(AttrVar("group")) == "?group"
    assert repr(AttrVar("axis", default=-1)) == "?axis=-1"
    assert repr(AttrVar("activation", check=lambda v: v is None, describe="absent")) == \
        "?activation if absent"
    # a lambda without a description: no Python source in what users read
    assert repr(AttrVar("activation", check=lambda v: v is None)) == "?activation if <predicate>"

    def positive(v):
        return v > 0

    assert repr(AttrVar("alpha", check=positive)) == "?alpha if positive"


def test_explain_shows_no_python_object_dumps(cli, conv_bn_model):
    r = cli("explain", "conv-add-clip", conv_bn_model)
    assert r.rc == 0, r.err
    assert "activation=?activation if absent" in r.out
    assert "lambda" not in r.out and "AttrVar(" not in r.out and "<function" not in r.out and " at 0x" not in r.out


def test_no_rule_pattern_shows_python_source(cli):
    r = cli("list-rules")
    assert r.rc == 0, r.err
    assert "lambda" not in r.out and "<predicate>" not in r.out  # every built-in check is described
    assert "training_mode=?training_mode=0 if 0 (inference)" in r.out
    assert "spatial=?spatial if 1 or absent" in r.out


def test_failed_constraint_says_what_the_pattern_wants(tmp_path):
    from onnx import TensorProto, helper

    from passctl.ir import from_onnx
    from passctl.passes.rewrite import explain

    f = TensorProto.FLOAT
    inits = [helper.make_tensor(n, f, [2], [1.0, 2.0]) for n in ("s", "b", "m", "v")]
    inits.append(helper.make_tensor("w", f, [2, 2, 1, 1], [1.0, 0.0, 0.0, 1.0]))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["y"], name="bn",
                              spatial=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, [1, 2, 3, 3])],
                              [helper.make_tensor_value_info("y", f, [1, 2, 3, 3])], inits)
    model = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 7)]))
    rule = next(cls.name for cls in list_rules() if "BatchNormalization(Conv(" in
                cls().describe_pattern())
    text = str(explain(rule, model))
    assert "attribute spatial=0" in text and "the pattern wants 1 or absent" in text, text
    assert "lambda" not in text


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


def _zero_padded(name):
    """Natural order computed another way: every digit run left-padded to 20 digits, then plain
    string order (a check independent of ruleset.natural_key)."""
    return re.sub(r"\d+", lambda m: m.group(0).zfill(20), name), name


def test_list_rules_is_in_natural_order(cli, monkeypatch):
    """attention-2-... is listed before attention-10-... (plain string order put it after)."""
    silu = get_rule("silu")
    for n in (10, 2):  # registered in the "wrong" order on purpose
        monkeypatch.setitem(ruleset._RULES, f"zz-order-check-{n}",
                            type(f"OrderCheck{n}", (silu,), {"name": f"zz-order-check-{n}"}))
    r = cli("list-rules")
    assert r.rc == 0, r.err
    # a rule's row starts at column 0; wrapped summary / pattern lines start with spaces
    names = [line.split()[0] for line in r.out.splitlines()[1:] if line[:1].strip()]
    assert set(names) == set(ruleset._RULES)
    assert names == sorted(names, key=_zero_padded)
    assert names.index("zz-order-check-2") < names.index("zz-order-check-10")
    # the built-in attention rules: number 2 before number 10 (both exist)
    first = {int(m.group(1)): i for i, n in enumerate(names) if (m := re.match(r"attention-(\d+)-", n))}
    assert 2 in first and 10 in first and first[2] < first[10]
    assert [n for n in sorted(first, key=first.get)] == sorted(first)
