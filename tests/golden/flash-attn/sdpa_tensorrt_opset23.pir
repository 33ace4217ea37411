# RUN: passctl opt %s -p flash-attn --target a100 --emit tensorrt
# CATCHES: the flash-attn group as expanded for the TensorRT emitter at opset 23: passctl::Attention
#   lowered by lower-standard to the standard ONNX Attention-23 (which TensorRT's parser maps to
#   its fused attention) on the 4-D tensors as they are, with scale and is_causal, and no
#   com.microsoft op.
model ir_version 10 opset {"": 23} producer "" "" {
  graph @g(%q: f32[1,2,3,4], %k: f32[1,2,3,4], %v: f32[1,2,3,4]) -> (f32[1,2,3,4]) {
    %sqrt_d = init f32[] dense<2.0>
    %kt = Transpose(%k) {perm = [0, 1, 3, 2]}
    %qk = MatMul(%q, %kt)
    %s = Div(%qk, %sqrt_d)
    %p = Softmax(%s) {axis = -1}
    %y: f32[1,2,3,4] = MatMul(%p, %v)
    return %y
  }
}
# EXPECTED:
# model ir_version 10 opset {"": 23} producer "" "" {
#   graph @g(%q: f32[1,2,3,4], %k: f32[1,2,3,4], %v: f32[1,2,3,4]) -> (f32[1,2,3,4]) {
#     %y: f32[1,2,3,4] = Attention(%q, %k, %v) {scale = 0.5, is_causal = 0}
#     return %y
#   }
# }
