# RUN: passctl opt %s -p fuse-conv-bn,dce --target cpu
# CATCHES: BatchNormalization after a Conv without a bias (rule fold-conv-bn) not folded, or folded
#   without creating the bias input ((0 - mean) * scale / sqrt(var + eps) + bias), or a grouped
#   Conv's (group = 2) per-output-channel scale applied along the wrong weight axis.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[1,2,3,3]) -> (f32[1,2,3,3]) {
    %w = init f32[2,1,1,1] dense<0.5, -1.0>
    %scale = init f32[2] dense<1.5, 0.75>
    %bias = init f32[2] dense<-0.3, 0.4>
    %mean = init f32[2] dense<0.2, -0.1>
    %var = init f32[2] dense<2.0, 0.5>
    %c = Conv(%x, %w) {group = 2}
    %y: f32[1,2,3,3] = BatchNormalization(%c, %scale, %bias, %mean, %var)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[1,2,3,3]) -> (f32[1,2,3,3]) {
#     %w_bn = init f32[2,1,1,1] dense<0.53032875, -1.0606495>
#     %w_bn_bias = init f32[2] dense<-0.5121315, 0.50606495>
#     %y: f32[1,2,3,3] = Conv(%x, %w_bn, %w_bn_bias) {group = 2}
#     return %y
#   }
# }
