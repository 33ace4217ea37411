# RUN: passctl opt %s -p fuse-conv-bn,dce --target cpu
# CATCHES: BatchNormalization after a ConvTranspose with a bias (rule fold-conv-transpose-bias-bn)
#   not folded, or the per-channel scale applied along axis 0 of the weight (a ConvTranspose
#   weight is [in, out / group, k...]: output channels are axis 1).
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[1,2,2,2]) -> (f32[1,3,2,2]) {
    %w = init f32[2,3,1,1] dense<0.5, -1.0, 2.0, 0.25, 1.5, -0.5>
    %b = init f32[3] dense<0.1, -0.2, 0.3>
    %scale = init f32[3] dense<1.5, 0.75, 1.25>
    %bias = init f32[3] dense<-0.3, 0.4, 0.0>
    %mean = init f32[3] dense<0.2, -0.1, 0.5>
    %var = init f32[3] dense<2.0, 0.5, 1.0>
    %c = ConvTranspose(%x, %w, %b)
    %y: f32[1,3,2,2] = BatchNormalization(%c, %scale, %bias, %mean, %var) {epsilon = 0.001}
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[1,2,2,2]) -> (f32[1,3,2,2]) {
#     %w_bn = init f32[2,3,1,1] dense<0.53019756, -1.0596011, 2.498751, 0.26509878, 1.5894016, -0.62468773>
#     %w_bn_bias = init f32[3] dense<-0.40603954, 0.2940399, -0.24987508>
#     %y: f32[1,3,2,2] = ConvTranspose(%x, %w_bn, %w_bn_bias)
#     return %y
#   }
# }
