# RUN: passctl opt %s -p amp{dtype=bf16,budget=0.5,metric=max-rel} --target cpu
# CATCHES: amp on the cpu target in bf16 with the measured search (a budget far above bf16's error,
#   so every eligible node goes low whatever the measurement's last bits): the emulated form
#   (each rounding node computes in float32 between a Cast up and a Cast down to bf16), weights
#   stored in bf16 and cast up at run time, and Casts shared per value.
# NUMERIC: rtol=3e-2 (bf16 keeps 8 significant bits: about 2^-8 relative per op)
model ir_version 8 opset {"": 17} producer "" "" {
  graph @g(%x: f32[2,4]) -> (f32[2,3]) {
    %w = init f32[4,3] dense<0.5, -1.0, 2.0, 0.25, 1.5, -0.5, 0.75, -2.0, 1.0, 0.125, -0.25, 0.625>
    %b = init f32[3] dense<0.125, -0.25, 0.375>
    %m: f32[2,3] = MatMul(%x, %w)
    %a: f32[2,3] = Add(%m, %b)
    %y: f32[2,3] = Relu(%a)
    return %y
  }
}
# EXPECTED:
# model ir_version 8 opset {"": 17} producer "" "" {
#   graph @g(%x: f32[2,4]) -> (f32[2,3]) {
#     %w_bf16 = init bf16[4,3] dense<0.5, -1.0, 2.0, 0.25, 1.5, -0.5, 0.75, -2.0, 1.0, 0.125, -0.25, 0.625>
#     %b_bf16 = init bf16[3] dense<0.125, -0.25, 0.375>
#     %b_bf16_f32: f32[3] = Cast(%b_bf16) {to = 1}
#     %w_bf16_f32: f32[4,3] = Cast(%w_bf16) {to = 1}
#     %x_bf16: bf16[2,4] = Cast(%x) {to = 16}
#     %x_bf16_f32: f32[2,4] = Cast(%x_bf16) {to = 1}
#     %m_f32: f32[2,3] = MatMul(%x_bf16_f32, %w_bf16_f32)
#     %m: bf16[2,3] = Cast(%m_f32) {to = 16}
#     %m_f32_1: f32[2,3] = Cast(%m) {to = 1}
#     %a_f32: f32[2,3] = Add(%m_f32_1, %b_bf16_f32)
#     %a: bf16[2,3] = Cast(%a_f32) {to = 16}
#     %a_f32_5: f32[2,3] = Cast(%a) {to = 1}
#     %y_bf16_f32: f32[2,3] = Relu(%a_f32_5)
#     %y_bf16: bf16[2,3] = Cast(%y_bf16_f32) {to = 16}
#     %y: f32[2,3] = Cast(%y_bf16) {to = 1}
#     return %y
#   }
# }
