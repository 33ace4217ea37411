# RUN: passctl opt %s -p fuse-conv-bn,dce --target cpu
# CATCHES: BatchNormalization after a ConvTranspose without a bias (rule fold-conv-transpose-bn) not
#   folded, or folded without adding the bias input.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[1,2,2,2]) -> (f32[1,2,3,3]) {
    %w = init f32[2,2,2,2] dense<0.5, -1.0, 2.0, 0.25, 1.5, -0.5, 0.75, -2.0, 1.0, 0.125, -0.25, 0.625, 0.375, 1.25, -0.75, 0.5>
    %scale = init f32[2] dense<1.5, 0.75>
    %bias = init f32[2] dense<-0.3, 0.4>
    %mean = init f32[2] dense<0.2, -0.1>
    %var = init f32[2] dense<2.0, 0.5>
    %c = ConvTranspose(%x, %w)
    %y: f32[1,2,3,3] = BatchNormalization(%c, %scale, %bias, %mean, %var)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[1,2,2,2]) -> (f32[1,2,3,3]) {
#     %w_bn = init f32[2,2,2,2] dense<0.53032875, -1.0606575, 2.121315, 0.26516438, 1.5909743, -0.53032476, 0.79548717, -2.121299, 1.0606575, 0.13258219, -0.26516438, 0.66291094, 0.39774358, 1.325812, -0.79548717, 0.53032476>
#     %w_bn_bias = init f32[2] dense<-0.5121315, 0.50606495>
#     %y: f32[1,2,3,3] = ConvTranspose(%x, %w_bn, %w_bn_bias)
#     return %y
#   }
# }
