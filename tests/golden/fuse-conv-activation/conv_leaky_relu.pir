# RUN: passctl opt %s -p fuse-conv-activation,dce --target cpu
# CATCHES: Conv + LeakyRelu not fused into FusedConv with activation "LeakyRelu" and
#   activation_params [alpha] (0.1 here, not the default 0.01).
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[1,2,3,3]) -> (f32[1,2,3,3]) {
    %w = init f32[2,2,1,1] dense<0.5, -1.0, 2.0, 0.25>
    %c = Conv(%x, %w)
    %y: f32[1,2,3,3] = LeakyRelu(%c) {alpha = 0.1}
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "com.microsoft": 1} producer "" "" {
#   graph @g(%x: f32[1,2,3,3]) -> (f32[1,2,3,3]) {
#     %w = init f32[2,2,1,1] dense<0.5, -1.0, 2.0, 0.25>
#     %y: f32[1,2,3,3] = com.microsoft::FusedConv(%x, %w) {activation = "LeakyRelu", activation_params = [0.1]}
#     return %y
#   }
# }
