# RUN: passctl opt %s -p fuse-conv-activation,dce --target cpu
# CATCHES: Conv + bias + Clip with min / max as constant inputs (ReLU6, opset 11+) not fused into
#   FusedConv with activation "Clip" and activation_params [0, 6] read from those inputs.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[1,2,3,3]) -> (f32[1,2,3,3]) {
    %w = init f32[2,2,1,1] dense<0.5, -1.0, 2.0, 0.25>
    %b = init f32[2] dense<0.1, -0.2>
    %lo = init f32[] dense<0.0>
    %hi = init f32[] dense<6.0>
    %c = Conv(%x, %w, %b)
    %y: f32[1,2,3,3] = Clip(%c, %lo, %hi)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "com.microsoft": 1} producer "" "" {
#   graph @g(%x: f32[1,2,3,3]) -> (f32[1,2,3,3]) {
#     %w = init f32[2,2,1,1] dense<0.5, -1.0, 2.0, 0.25>
#     %b = init f32[2] dense<0.1, -0.2>
#     %y: f32[1,2,3,3] = com.microsoft::FusedConv(%x, %w, %b) {activation = "Clip", activation_params = [0.0, 6.0]}
#     return %y
#   }
# }
