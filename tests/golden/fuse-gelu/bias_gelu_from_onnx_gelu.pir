# RUN: passctl opt %s -p infer-shapes,fuse-gelu,dce --target cpu
# CATCHES: ONNX's Gelu (opset 20, as both torch exporters write F.gelu there) after a Linear layer's
#   bias Add not turned into passctl::Gelu(x, bias) (BiasGelu on ONNX Runtime).
model ir_version 9 opset {"": 20} producer "" "" {
  graph @g(%x: f32[2,4]) -> (f32[2,4]) {
    %bias = init f32[4] dense<0.1, -0.2, 0.3, 0.5>
    %xb = Add(%x, %bias)
    %y: f32[2,4] = Gelu(%xb) {approximate = "tanh"}
    return %y
  }
}
# EXPECTED:
# model ir_version 9 opset {"": 20, "passctl": 1} producer "" "" {
#   graph @g(%x: f32[2,4]) -> (f32[2,4]) {
#     %bias = init f32[4] dense<0.1, -0.2, 0.3, 0.5>
#     %y: f32[2,4] = passctl::Gelu(%x, %bias) {approximate = "tanh"}
#     return %y
#   }
# }
