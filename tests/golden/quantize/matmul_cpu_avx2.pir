# RUN: passctl opt %s -p quantize{budget=1.0,samples=2,seed=0} --target cpu-avx2
# CATCHES: the same MatMul for x86 without VNNI (cpu-avx2): ONNX Runtime's U8S8 kernels add pairs of
#   products in saturating int16 there, so the weight codes stay in [-63, 63] (scale max|w| / 63,
#   7 bits, reduce_range) while the activation keeps uint8 with zero point 128; a regression to
#   8-bit codes here would ship an artifact whose error changes with the machine.
# NUMERIC: rtol=5e-2 (int8 weights and uint8 activations: 1/127 and 1/255 of the range per operand)
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,4]) -> (f32[2,3]) {
    %w = init f32[4,3] dense<0.5, -1.0, 2.0, 0.25, 1.5, -0.5, 0.75, -2.0, 1.0, 0.125, -0.25, 0.625>
    %y: f32[2,3] = MatMul(%x, %w)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[2,4]) -> (f32[2,3]) {
#     %x_scale = init f32[] dense<0.007613738>
#     %x_zero_point = init u8[] dense<128>
#     %"MatMul@0_w_int8" = init i8[4,3] dense<42, -31, 63, 21, 47, -16, 63, -63, 31, 10, -8, 20>
#     %"MatMul@0_w_scale" = init f32[3] dense<0.011904762, 0.031746034, 0.031746034>
#     %"MatMul@0_w_zero_point" = init i8[3] dense<0, 0, 0>
#     %x_int8: u8[2,4] = QuantizeLinear(%x, %x_scale, %x_zero_point)
#     %x_dq: f32[2,4] = DequantizeLinear(%x_int8, %x_scale, %x_zero_point)
#     %"MatMul@0_w_dq": f32[4,3] = DequantizeLinear(%"MatMul@0_w_int8", %"MatMul@0_w_scale", %"MatMul@0_w_zero_point") {axis = 1}
#     %y: f32[2,3] = MatMul(%x_dq, %"MatMul@0_w_dq")
#     return %y
#   }
# }
