# RUN: passctl opt %s -p quantize{budget=1.0,samples=2,seed=0} --target cpu-vnni
# CATCHES: static int8 QDQ on a cpu target with VNNI (ONNX Runtime's U8S8 form, 8-bit weights; named so the golden holds on any machine): the MatMul weight stored as
#   int8 constants with symmetric per-output-channel scales (axis 1) and zero point 0, the
#   activation as uint8 with zero point 128, the scale values (calibrated on seeded random feeds
#   of the graph input alone: numpy draws, the same on any machine), and QDQ only around the
#   MatMul's inputs. The budget is far above the int8 error, so the search keeps it quantized.
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
#     %"MatMul@0_w_int8" = init i8[4,3] dense<85, -64, 127, 42, 95, -32, 127, -127, 64, 21, -16, 40>
#     %"MatMul@0_w_scale" = init f32[3] dense<0.005905512, 0.015748031, 0.015748031>
#     %"MatMul@0_w_zero_point" = init i8[3] dense<0, 0, 0>
#     %x_int8: u8[2,4] = QuantizeLinear(%x, %x_scale, %x_zero_point)
#     %x_dq: f32[2,4] = DequantizeLinear(%x_int8, %x_scale, %x_zero_point)
#     %"MatMul@0_w_dq": f32[4,3] = DequantizeLinear(%"MatMul@0_w_int8", %"MatMul@0_w_scale", %"MatMul@0_w_zero_point") {axis = 1}
#     %y: f32[2,3] = MatMul(%x_dq, %"MatMul@0_w_dq")
#     return %y
#   }
# }
