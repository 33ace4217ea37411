# RUN: passctl opt %s -p reparam --target cpu
# CATCHES: a RepVGG block (3x3 Conv + BN, 1x1 Conv + BN and an identity BN, summed) not merged into
#   one 3x3 Conv: the 1x1 kernel not placed at the centre, the identity's one-hot kernel or its BN
#   scale missing, a branch's epsilon (1e-3, 1e-2, default 1e-5) mixed up, the merged bias wrong
#   (exact float32 bits compared), or the branch weights left behind after dce.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[1,1,4,4]) -> (f32[1,1,4,4]) {
    %w3 = init f32[1,1,3,3] dense<0.5, -1.0, 0.25, 2.0, 1.5, -0.5, 0.75, -2.0, 1.0>
    %w1 = init f32[1,1,1,1] dense<0.6>
    %s3 = init f32[1] dense<1.5>
    %b3 = init f32[1] dense<0.1>
    %m3 = init f32[1] dense<0.2>
    %v3 = init f32[1] dense<2.0>
    %s1 = init f32[1] dense<0.75>
    %b1 = init f32[1] dense<-0.3>
    %m1 = init f32[1] dense<-0.1>
    %v1 = init f32[1] dense<0.5>
    %s0 = init f32[1] dense<1.25>
    %b0 = init f32[1] dense<0.05>
    %m0 = init f32[1] dense<0.3>
    %v0 = init f32[1] dense<1.5>
    %c3 = Conv(%x, %w3) {pads = [1, 1, 1, 1]}
    %n3 = BatchNormalization(%c3, %s3, %b3, %m3, %v3) {epsilon = 0.001}
    %c1 = Conv(%x, %w1)
    %n1 = BatchNormalization(%c1, %s1, %b1, %m1, %v1) {epsilon = 0.01}
    %n0 = BatchNormalization(%x, %s0, %b0, %m0, %v0)
    %a = Add(%n3, %n1)
    %r = Add(%a, %n0)
    %y: f32[1,1,4,4] = Relu(%r)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[1,1,4,4]) -> (f32[1,1,4,4]) {
#     %reparam_reparam_weight = init f32[1,1,3,3] dense<0.53019756, -1.0603951, 0.26509878, 2.1207902, 3.241336, -0.53019756, 0.7952963, -2.1207902, 1.0603951>
#     %reparam_reparam_bias = init f32[1] dense<-0.5632432>
#     %r: f32[1,1,4,4] = Conv(%x, %reparam_reparam_weight, %reparam_reparam_bias) {kernel_shape = [3, 3], strides = [1, 1], pads = [1, 1, 1, 1], dilations = [1, 1], group = 1}
#     %y: f32[1,1,4,4] = Relu(%r)
#     return %y
#   }
# }
