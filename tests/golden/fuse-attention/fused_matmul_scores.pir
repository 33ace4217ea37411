# RUN: passctl opt %s -p infer-shapes,fuse-attention,dce --target cpu
# CATCHES: the scores written as com.microsoft::FusedMatMul(q, k, transB=1, alpha) (what fuse-gemm
#   makes of Q . Transpose(K), or ONNX Runtime's optimizer of Q . K^T * s) not fused: `fuse` before
#   `flash-attn` then left every attention unfused.
model ir_version 8 opset {"": 17, "com.microsoft": 1} producer "" "" {
  graph @g(%q: f32[1,2,3,4], %k: f32[1,2,3,4], %v: f32[1,2,3,4]) -> (f32[1,2,3,4]) {
    %qk = com.microsoft::FusedMatMul(%q, %k) {transB = 1, alpha = 0.5}
    %p = Softmax(%qk) {axis = -1}
    %y: f32[1,2,3,4] = MatMul(%p, %v)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17, "com.microsoft": 1, "passctl": 1} producer "" "" {
#   graph @g(%q: f32[1,2,3,4], %k: f32[1,2,3,4], %v: f32[1,2,3,4]) -> (f32[1,2,3,4]) {
#     %y: f32[1,2,3,4] = passctl::Attention(%q, %k, %v) {scale = 0.5, mask_kind = "none", is_causal = 0, num_heads = 2, kv_num_heads = 2, softmax_precision = 0, nan_to_zero = 0}
#     return %y
#   }
# }
