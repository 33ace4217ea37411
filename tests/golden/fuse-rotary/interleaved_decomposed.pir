# RUN: passctl opt %s -p infer-shapes,fuse-rotary{max_positions=4},dce,lower-standard --target cpu
# CATCHES: GPT-J's rotate_every_two (stack(-x[1::2], x[0::2]).flatten(-2), repeat-interleaved
#   cos/sin) not recognized as interleaved=1, or its decomposition at opset 18 (no RotaryEmbedding
#   op) pairing the wrong elements (the numeric check runs the decomposed form).
model ir_version 8 opset {"": 18} producer "" "" {
  graph @g(%x: f32[1,2,3,4], %position_ids: i64[1,3]) -> (f32[1,2,3,4]) {
    %inv = init f32[2] dense<1.0, 0.01>
    %ax2 = init i64[1] dense<2>
    %ax1 = init i64[1] dense<1>
    %ax3 = init i64[1] dense<3>
    %axl = init i64[1] dense<-1>
    %zero = init i64[1] dense<0>
    %two = init i64[1] dense<2>
    %big = init i64[1] dense<9223372036854775807>
    %shp = init i64[4] dense<1, 2, 3, 4>
    %last2 = init i64[1] dense<2>
    %last4 = init i64[1] dense<4>
    %pu = Unsqueeze(%position_ids, %ax2)
    %pf = Cast(%pu) {to = 1}
    %f = Mul(%pf, %inv)
    %c0 = Cos(%f)
    %s0 = Sin(%f)
    %sh = Shape(%c0)
    %sh2 = Shape(%c0) {end = 2}
    %cs = Concat(%sh, %last2) {axis = 0}
    %cs2 = Concat(%sh2, %last4) {axis = 0}
    %c1 = Unsqueeze(%c0, %axl)
    %s1 = Unsqueeze(%s0, %axl)
    %c2 = Expand(%c1, %cs)
    %s2 = Expand(%s1, %cs)
    %c3 = Reshape(%c2, %cs2)
    %s3 = Reshape(%s2, %cs2)
    %c = Unsqueeze(%c3, %ax1)
    %s = Unsqueeze(%s3, %ax1)
    %xc = Mul(%x, %c)
    %ev = Slice(%x, %zero, %big, %ax3, %two)
    %od = Slice(%x, %ax1, %big, %ax3, %two)
    %n = Neg(%od)
    %u1 = Unsqueeze(%n, %axl)
    %u2 = Unsqueeze(%ev, %axl)
    %st = Concat(%u1, %u2) {axis = -1}
    %rot = Reshape(%st, %shp)
    %rs = Mul(%rot, %s)
    %y: f32[1,2,3,4] = Add(%xc, %rs)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 18} producer "" "" {
#   graph @g(%x: f32[1,2,3,4], %position_ids: i64[1,3]) -> (f32[1,2,3,4]) {
#     %rotary_cos_cache = init f32[4,2] dense<1.0, 1.0, 0.5403023, 0.99995, -0.4161468, 0.9998, -0.9899925, 0.99955004>
#     %rotary_sin_cache = init f32[4,2] dense<0.0, 0.0, 0.84147096, 0.009999833, 0.9092974, 0.019998666, 0.14112, 0.0299955>
#     %rotary_heads_axis = init i64[1] dense<1>
#     %rotary_start = init i64[1] dense<0>
#     %rotary_end = init i64[1] dense<4>
#     %rotary_axis = init i64[1] dense<-1>
#     %rotary_step = init i64[1] dense<2>
#     %rotary_start_4 = init i64[1] dense<1>
#     %rotary_end_5 = init i64[1] dense<4>
#     %rotary_axis_6 = init i64[1] dense<-1>
#     %rotary_step_7 = init i64[1] dense<2>
#     %rotary_last = init i64[1] dense<-1>
#     %gather_out = Gather(%rotary_cos_cache, %position_ids) {axis = 0}
#     %unsqueeze_out = Unsqueeze(%gather_out, %rotary_heads_axis)
#     %gather_out_0 = Gather(%rotary_sin_cache, %position_ids) {axis = 0}
#     %unsqueeze_out_2 = Unsqueeze(%gather_out_0, %rotary_heads_axis)
#     %slice_out = Slice(%x, %rotary_start, %rotary_end, %rotary_axis, %rotary_step)
#     %slice_out_8 = Slice(%x, %rotary_start_4, %rotary_end_5, %rotary_axis_6, %rotary_step_7)
#     %mul_out = Mul(%slice_out, %unsqueeze_out)
#     %mul_out_10 = Mul(%slice_out_8, %unsqueeze_out_2)
#     %sub_out = Sub(%mul_out, %mul_out_10)
#     %mul_out_12 = Mul(%slice_out_8, %unsqueeze_out)
#     %mul_out_14 = Mul(%slice_out, %unsqueeze_out_2)
#     %add_out = Add(%mul_out_12, %mul_out_14)
#     %unsqueeze_out_16 = Unsqueeze(%sub_out, %rotary_last)
#     %unsqueeze_out_18 = Unsqueeze(%add_out, %rotary_last)
#     %concat_out = Concat(%unsqueeze_out_16, %unsqueeze_out_18) {axis = -1}
#     %shape_out = Shape(%x)
#     %y: f32[1,2,3,4] = Reshape(%concat_out, %shape_out)
#     return %y
#   }
# }
