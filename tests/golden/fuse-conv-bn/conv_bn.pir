# RUN: passctl opt %s -p fuse-conv-bn,dce --target cpu
# CATCHES: the BatchNormalization after a Conv with a bias not folded, or folded with wrong
#   per-output-channel math (w * scale / sqrt(var + eps), (b - mean) * scale / sqrt(var + eps) + bias:
#   the exact float32 bits of the folded weight and bias are compared), a lost epsilon, the Conv's
#   attributes dropped, the fused node's provenance (loc of both source nodes) lost, or the
#   statistics left behind as unused initializers after dce.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[1,2,3,3]) -> (f32[1,2,3,3]) {
    %w = init f32[2,2,1,1] dense<0.5, -1.0, 2.0, 0.25>
    %b = init f32[2] dense<0.1, -0.2>
    %scale = init f32[2] dense<1.5, 0.75>
    %bias = init f32[2] dense<-0.3, 0.4>
    %mean = init f32[2] dense<0.2, -0.1>
    %var = init f32[2] dense<2.0, 0.5>
    %c: f32[1,2,3,3] = Conv(%x, %w, %b) {pads = [0, 0, 0, 0], strides = [1, 1]} name "conv"
    %y: f32[1,2,3,3] = BatchNormalization(%c, %scale, %bias, %mean, %var) {epsilon = 0.001} name "bn"
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[1,2,3,3]) -> (f32[1,2,3,3]) {
#     %w_bn = init f32[2,2,1,1] dense<0.53019756, -1.0603951, 2.1192021, 0.26490027>
#     %w_bn_bias = init f32[2] dense<-0.40603954, 0.2940399>
#     %y: f32[1,2,3,3] = Conv(%x, %w_bn, %w_bn_bias) {pads = [0, 0, 0, 0], strides = [1, 1]} loc("conv", "bn")
#     return %y
#   }
# }
