"""The compile context: passes take the target, input sizes and calibration feeds from it (options
the pipeline text gives win), declare their error budgets, and can read it while they run."""

from __future__ import annotations

from passctl.passes.base import Pass, PassResult
from passctl.passes.manager import PassManager
from passctl.passes.pipeline_text import build_pipeline, format_pipeline
from passctl.support.context import CheckBound, CompileContext, current_context
from passctl.support.profiles import get_target
from passctl.tools.numeric_check import bounds_note, check_bounds


def _pass(passes, name):
    return next(p for p in passes if p.name == name)


def test_target_comes_from_the_context_and_the_text_wins():
    context = CompileContext(target=get_target("a10"), emitter="tensorrt")
    passes = build_pipeline("quantize,amp", "a10", "tensorrt", context=context)
    assert _pass(passes, "quantize-int8").options.target == "a10"
    assert _pass(passes, "mixed-precision").options.target == "a10"
    passes = build_pipeline("quantize{target=cpu},amp{target=t4}", "a10", context=context)
    assert _pass(passes, "quantize-int8").options.target == "cpu"
    assert _pass(passes, "mixed-precision").options.target == "t4"
    # without a context nor a target the pass keeps its own default
    assert _pass(build_pipeline("quantize"), "quantize-int8").options.target == "cpu"
    # a name that is no profile (aliases are looked up by emitter name too) gives no target
    assert _pass(build_pipeline("quantize", "tvm"), "quantize-int8").options.target == "cpu"
    assert CompileContext.for_target("tensorrt", "tensorrt").target is None
    assert CompileContext.for_target(" A10 ").target == get_target("a10")


def test_input_sizes_become_calibration_dims_unless_calib_or_dims_is_given():
    context = CompileContext(target=get_target("a10"))
    passes = build_pipeline("quantize,amp{dims=\"x[0]=2\"},quantize{calib=feeds}", "a10",
                            context=context)
    assert [p.options.dims for p in passes if p.name != "infer-shapes" and p.name != "dce"] == \
        ["", "x[0]=2", ""]
    context.input_sizes = {"x[0]": 4, "x[2]": 48}
    notes = [note for p in passes for note in p.configure(context)]
    assert notes == ["quantize-int8 calibrates at the emitter's input sizes x[0]=4, x[2]=48 (give "
                     "quantize-int8{dims=...} or calib= to choose)"]
    quantize, amp, calibrated = [p for p in passes if p.name in ("quantize-int8", "mixed-precision")]
    assert (quantize.options.dims, amp.options.dims, calibrated.options.dims) == (
        "x[0]=4;x[2]=48", "x[0]=2", "")
    assert [note for p in passes for note in p.configure(context)] == []  # idempotent
    text = format_pipeline(passes)  # as_run reproduces the sizes
    assert 'quantize-int8{dims=x[0]=4;x[2]=48,target=a10}' in text
    assert _pass(build_pipeline(text), "quantize-int8").options.dims == "x[0]=4;x[2]=48"


def test_calibration_folder_comes_from_the_context(tmp_path):
    context = CompileContext(calibration=str(tmp_path))
    passes = build_pipeline("quantize,amp{calib=mine}", context=context)
    assert _pass(passes, "quantize-int8").options.calib == str(tmp_path)
    assert _pass(passes, "mixed-precision").options.calib == "mine"
    context.input_sizes = {"x[0]": 4}  # real feeds: no random feeds to size
    assert [n for p in passes for n in p.configure(context)] == []
    assert _pass(passes, "quantize-int8").options.dims == ""


def test_check_bounds_come_from_the_error_budgets_not_pass_names():
    flat = PassManager(build_pipeline("amp{budget=0.05},quantize{metric=max-rel,budget=0.1}",
                                      "cpu")).flat_passes()
    bounds = check_bounds(None, flat)
    assert bounds == [CheckBound("mean-rel", 0.05, "mixed-precision", "amp"),
                      CheckBound("max-rel", 0.1, "quantize-int8", "quantize")]
    assert bounds_note(bounds) == ("note: the check accepts mean-rel error 0.05 (the amp pass's "
                                   "budget) and max-rel error 0.1 (the quantize pass's budget) "
                                   "(give --rtol for a max-rel bound)")
    assert check_bounds(1e-3, flat) == [CheckBound("max-rel", 1e-3, "--rtol")]
    plain = PassManager(build_pipeline("cleanup")).flat_passes()
    assert check_bounds(None, plain) == [CheckBound("max-rel", 1e-4, "default")]
    assert bounds_note(check_bounds(None, plain)) is None


class _ReadsContext(Pass):
    """A pass (as a plugin would write it) that reads the context while it runs."""

    name = "reads-context"
    seen: list = []

    def run(self, model):
        context = current_context()
        self.seen.append((context.target.name if context.target else None,
                          dict(context.input_sizes)))
        return PassResult(False)


def test_a_pass_reads_the_current_context_while_it_runs(tmp_path):
    from small_graphs import conv_relu_conv

    from passctl.ir import load

    model = load(conv_relu_conv(tmp_path / "m.onnx"))
    _ReadsContext.seen = []
    PassManager([_ReadsContext()]).run(model)
    with CompileContext(target=get_target("h200"), input_sizes={"x[0]": 8}):
        with CompileContext(target=get_target("t4")):
            PassManager([_ReadsContext()]).run(model)
        PassManager([_ReadsContext()]).run(model)
    PassManager([_ReadsContext()]).run(model)
    assert _ReadsContext.seen == [(None, {}), ("t4", {}), ("h200", {"x[0]": 8}), (None, {})]
