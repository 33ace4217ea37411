# RUN: passctl opt %s -p infer-shapes --target cpu
# CATCHES: values without a declared type left untyped by onnx shape inference (MatMul, Transpose,
#   Concat, a Reshape whose shape comes from Shape/Concat: data propagation), or a declared output
#   type overwritten.
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,3], %w: f32[3,4]) -> (f32[2,4], ?) {
    %minus1 = init i64[1] dense<-1>
    %m = MatMul(%x, %w)
    %t = Transpose(%m) {perm = [1, 0]}
    %c = Concat(%t, %t) {axis = 0}
    %s = Shape(%m)
    %n = Concat(%minus1, %s) {axis = 0}
    %r = Reshape(%c, %n)
    %y: f32[2,4] = Relu(%m)
    return %y, %r
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[2,3], %w: f32[3,4]) -> (f32[2,4], f32[2,2,4]) {
#     %minus1 = init i64[1] dense<-1>
#     %m: f32[2,4] = MatMul(%x, %w)
#     %t: f32[4,2] = Transpose(%m) {perm = [1, 0]}
#     %c: f32[8,2] = Concat(%t, %t) {axis = 0}
#     %s: i64[2] = Shape(%m)
#     %n: i64[3] = Concat(%minus1, %s) {axis = 0}
#     %r: f32[2,2,4] = Reshape(%c, %n)
#     %y: f32[2,4] = Relu(%m)
#     return %y, %r
#   }
# }
