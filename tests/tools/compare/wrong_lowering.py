"""A ``--load`` plugin with a lowering that is wrong on purpose (for the bisect tests):
``passctl::Gelu(x)`` -> ``x * Sigmoid(1.5 x)`` for ONNX Runtime, tried before the right forms.
(Gelu's sigmoid approximation uses 1.702; 1.5 is off by about 1e-2.) Registered globally: load
it only in a separate process."""

from passctl.passes.lowering.table import register_lowering


def wrong_gelu(ctx, node):
    x = node.inputs[0]
    ctx.form = "Gelu->wrong-sigmoid"
    return ctx.b.op("Mul", x, ctx.b.op("Sigmoid", ctx.b.op("Mul", x, ctx.scalar(1.5, x, "k"))))


register_lowering("onnxruntime", "Gelu", wrong_gelu, first=True)
