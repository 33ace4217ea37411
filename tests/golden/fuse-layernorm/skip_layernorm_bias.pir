# RUN: passctl opt %s -p infer-shapes,fuse-layernorm,dce --target cpu
# CATCHES: the BERT form Add(Add(x, bias), skip) in front of a LayerNorm without scale or bias
#   (skip-layernorm-bias-1) not fused with the Linear bias as passctl::SkipLayerNorm's 5th input
#   (scale and beta omitted as none), or the bias mistaken for the skip input.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,4], %skip: f32[2,4]) -> (f32[2,4]) {
    %two = init f32[] dense<2.0>
    %eps = init f32[] dense<1e-05>
    %bias = init f32[4] dense<0.1, -0.2, 0.3, 0.5>
    %xb = Add(%x, %bias)
    %s0 = Add(%xb, %skip)
    %m = ReduceMean(%s0) {axes = [-1], keepdims = 1}
    %d = Sub(%s0, %m)
    %p = Pow(%d, %two)
    %v = ReduceMean(%p) {axes = [-1], keepdims = 1}
    %ve = Add(%v, %eps)
    %s = Sqrt(%ve)
    %y: f32[2,4] = Div(%d, %s)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "passctl": 1} producer "" "" {
#   graph @g(%x: f32[2,4], %skip: f32[2,4]) -> (f32[2,4]) {
#     %bias = init f32[4] dense<0.1, -0.2, 0.3, 0.5>
#     %y: f32[2,4] = passctl::SkipLayerNorm(%x, %skip, none, none, %bias) {epsilon = 1e-05}
#     return %y
#   }
# }
