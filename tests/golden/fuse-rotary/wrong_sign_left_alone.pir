# RUN: passctl opt %s -p infer-shapes,fuse-rotary{max_positions=4},dce --target cpu
# CATCHES: a near miss fused: cat(x1, -x2) * sin rotates the other way (the Neg on the other
#   half); the pass must leave the graph as it is (a fusion here changes the result).
model ir_version 8 opset {"": 18} producer "" "" {
  graph @g(%x: f32[1,2,3,4], %position_ids: i64[1,3]) -> (f32[1,2,3,4]) {
    %inv = init f32[2] dense<1.0, 0.01>
    %ax2 = init i64[1] dense<2>
    %ax1 = init i64[1] dense<1>
    %ax3 = init i64[1] dense<3>
    %zero = init i64[1] dense<0>
    %two = init i64[1] dense<2>
    %big = init i64[1] dense<9223372036854775807>
    %pu = Unsqueeze(%position_ids, %ax2)
    %pf = Cast(%pu) {to = 1}
    %f = Mul(%pf, %inv)
    %emb = Concat(%f, %f) {axis = -1}
    %c0 = Cos(%emb)
    %s0 = Sin(%emb)
    %c = Unsqueeze(%c0, %ax1)
    %s = Unsqueeze(%s0, %ax1)
    %xc = Mul(%x, %c)
    %x1 = Slice(%x, %zero, %two, %ax3, %ax1)
    %x2 = Slice(%x, %two, %big, %ax3, %ax1)
    %n = Neg(%x2)
    %rot = Concat(%x1, %n) {axis = -1}
    %rs = Mul(%rot, %s)
    %y: f32[1,2,3,4] = Add(%xc, %rs)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 18} producer "" "" {
#   graph @g(%x: f32[1,2,3,4], %position_ids: i64[1,3]) -> (f32[1,2,3,4]) {
#     %inv = init f32[2] dense<1.0, 0.01>
#     %ax2 = init i64[1] dense<2>
#     %ax1 = init i64[1] dense<1>
#     %ax3 = init i64[1] dense<3>
#     %zero = init i64[1] dense<0>
#     %two = init i64[1] dense<2>
#     %big = init i64[1] dense<9223372036854775807>
#     %pu: i64[1,3,1] = Unsqueeze(%position_ids, %ax2)
#     %pf: f32[1,3,1] = Cast(%pu) {to = 1}
#     %f: f32[1,3,2] = Mul(%pf, %inv)
#     %emb: f32[1,3,4] = Concat(%f, %f) {axis = -1}
#     %c0: f32[1,3,4] = Cos(%emb)
#     %s0: f32[1,3,4] = Sin(%emb)
#     %c: f32[1,1,3,4] = Unsqueeze(%c0, %ax1)
#     %s: f32[1,1,3,4] = Unsqueeze(%s0, %ax1)
#     %xc: f32[1,2,3,4] = Mul(%x, %c)
#     %x1: f32[1,2,3,2] = Slice(%x, %zero, %two, %ax3, %ax1)
#     %x2: f32[1,2,3,2] = Slice(%x, %two, %big, %ax3, %ax1)
#     %n: f32[1,2,3,2] = Neg(%x2)
#     %rot: f32[1,2,3,4] = Concat(%x1, %n) {axis = -1}
#     %rs: f32[1,2,3,4] = Mul(%rot, %s)
#     %y: f32[1,2,3,4] = Add(%xc, %rs)
#     return %y
#   }
# }
