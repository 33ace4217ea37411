"""Pipeline text: typed options from the pass's Options dataclass, errors with columns."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal, Optional

import pytest

from passctl.ir.errors import UserError
from passctl.passes.base import Pass, PassResult
from passctl.passes.pipeline_text import (PassSpec, PipelineSyntaxError, build_pipeline, expand_specs,
                                          format_pipeline, parse_pipeline)
from passctl.passes.registry import register_pass


class Precision(enum.Enum):
    FP16 = "fp16"
    BF16 = "bf16"


@dataclass
class _Opts:
    dtype: Precision = Precision.FP16
    budget: float = 1e-2
    steps: int = 3
    strict: bool = False
    keep: str = ""
    mode: Literal["fast", "exact"] = "fast"
    limit: Optional[int] = None


@pytest.fixture
def typed_pass():
    @register_pass
    class Typed(Pass):
        name = "typed"
        summary = "has every option type"
        Options = _Opts

        def run(self, model):
            return PassResult(False)

    return Typed


def test_names_and_typed_options(typed_pass):
    text = (" dce , typed{dtype=bf16, budget=1e-3,steps=0x10,strict=true,"
            "keep=\"a,b\",mode=exact,limit=none},cse")
    specs = parse_pipeline(text)
    assert [s.name for s in specs] == ["dce", "typed", "cse"]
    assert [s.column for s in specs] == [2, 8, text.rindex("cse") + 1]
    assert specs[1].options == {"dtype": Precision.BF16, "budget": 1e-3, "steps": 16, "strict": True,
                                "keep": "a,b", "mode": "exact", "limit": None}
    assert parse_pipeline("typed{limit=7}")[0].options == {"limit": 7}
    assert parse_pipeline("typed{}")[0].options == {}
    assert parse_pipeline("   ") == []


def test_build_and_format_round_trip(typed_pass):
    passes = build_pipeline("cleanup,typed{dtype=bf16,budget=0.001}")
    assert [p.name for p in passes] == ["infer-shapes", "eliminate-identity", "fold-constants", "cse", "dce", "typed"]
    assert passes[-1].options == _Opts(dtype=Precision.BF16, budget=0.001)
    text = format_pipeline(passes)
    assert text == "infer-shapes,eliminate-identity,fold-constants,cse,dce,typed{dtype=bf16,budget=0.001}"
    again = build_pipeline(text)
    assert [p.options for p in again] == [p.options for p in passes]


def test_real_pass_options_are_typed():
    spec = parse_pipeline("fold-constants{size_limit=4096,fold_dequantize=false}")[0]
    assert spec.options == {"size_limit": 4096, "fold_dequantize": False}
    # kebab-case keys are accepted too
    assert parse_pipeline("fold-constants{size-limit=8}")[0].options == {"size_limit": 8}


@pytest.mark.parametrize("text,column,message", [
    ("dce,", 5, "expected a pass name, found the end of the text"),
    ("dce;cse", 4, "expected ',' or '{' after pass 'dce', found ';'"),
    ("typed{steps=1.5}", 13, "option 'steps' of 'typed' expects an integer, got '1.5'"),
    ("typed{budget=abc}", 14, "option 'budget' of 'typed' expects a number such as 1e-3, got 'abc'"),
    ("typed{strict=maybe}", 14, "option 'strict' of 'typed' expects true or false, got 'maybe'"),
    ("typed{dtype=fp8}", 13, "option 'dtype' of 'typed' expects one of fp16, bf16, got 'fp8'"),
    ("typed{mode=slow}", 12, "option 'mode' of 'typed' expects one of fast, exact, got 'slow'"),
    ("typed{stpes=2}", 7, "pass 'typed' has no option 'stpes'; did you mean 'steps'? known options: "
                          "dtype, budget, steps, strict, keep, mode, limit"),
    ("typed{steps=1,steps=2}", 15, "option 'steps' of 'typed' is given twice"),
    ("typed{steps}", 12, "expected '=' after option 'steps', found '}'"),
    ("typed{steps=}", 13, "expected a value, found '}'"),
    ("typed{steps=1", 14, "expected ',' or '}' after the value of 'steps', found the end of the text"),
    ("typed{keep='ab}", 12, "unterminated '-quoted value"),
    ("dce{x=1}", 5, "pass 'dce' takes no options"),
    ("dce,fold-constant", 5, "unknown pass 'fold-constant'; did you mean 'fold-constants'?"),
    ("cleanup,quantize{calibration=kl}", 30,
     "option 'calibration' of 'quantize' expects one of minmax, percentile, got 'kl'"),
])
def test_errors_name_column_and_expectation(typed_pass, text, column, message):
    with pytest.raises(PipelineSyntaxError) as info:
        parse_pipeline(text)
    e = info.value
    assert isinstance(e, UserError)
    assert (e.column, e.message) == (column, message)
    assert str(e) == f"pipeline '{text}', column {column}: {message}"
    assert 1 <= column <= len(text) + 1


def test_unquoted_comma_in_a_value_suggests_quoting(typed_pass):
    """``dims=batch=1,seq=3`` reads as option ``seq``: the error shows the quoted form."""
    with pytest.raises(PipelineSyntaxError) as info:
        parse_pipeline("lower-tvm{dims=batch=1,seq=3}")
    assert info.value.column == len("lower-tvm{dims=batch=1,") + 1
    assert info.value.message == ("pass 'lower-tvm' has no option 'seq'; if 'seq=3' is part of the "
                                  "value of 'dims', quote the value: dims=\"batch=1,seq=3\"; known "
                                  "options: dims")
    # the suggested form parses to the intended value
    assert parse_pipeline('lower-tvm{dims="batch=1,seq=3"}')[0].options == {"dims": "batch=1,seq=3"}
    with pytest.raises(PipelineSyntaxError, match="quote the value: keep=\"a=1,b=2,c\";"):
        parse_pipeline("typed{keep=a=1,b=2,c}")
    # a plain misspelling after another option gets no quoting hint
    with pytest.raises(PipelineSyntaxError) as info:
        parse_pipeline("typed{steps=2,stpes=3}")
    assert "quote" not in info.value.message and "did you mean 'steps'" in info.value.message


def test_alias_options_go_to_the_passes_that_declare_them():
    specs = expand_specs(parse_pipeline("cleanup{size_limit=10}"))
    assert [(s.name, s.options) for s in specs] == [
        ("infer-shapes", {}), ("eliminate-identity", {}), ("fold-constants", {"size_limit": 10}),
        ("cse", {}), ("dce", {})]


def test_missing_required_option_is_a_user_error():
    @dataclass
    class Req:
        level: int

    @register_pass
    class NeedsLevel(Pass):
        name = "needs-level"
        Options = Req

        def run(self, model):
            return PassResult(False)

    with pytest.raises(UserError, match="pass 'needs-level'.*needs-level\\{key=value\\}"):
        build_pipeline("needs-level")
    assert build_pipeline("needs-level{level=2}")[0].options == Req(2)


def test_pass_spec_defaults():
    assert PassSpec("dce") == PassSpec("dce", {}, 0)


def test_reserved_alias_error_names_its_column(monkeypatch):
    # No alias is reserved in this version (quantize was); a group without passes still fails at
    # its column with the reason.
    from passctl.passes import pipelines

    monkeypatch.setitem(pipelines.ALIASES, "future-group", {"cpu": []})
    monkeypatch.setitem(pipelines.NOT_YET, "future-group", "time travel is not implemented in this version")
    with pytest.raises(PipelineSyntaxError) as info:
        parse_pipeline("cleanup,future-group{steps=1}")
    assert (info.value.column, info.value.message) == (
        9, "`future-group` has no passes yet: time travel is not implemented in this version")
