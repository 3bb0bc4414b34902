// The gated MLP's activation in training: backward of silu(gate) * up (forward: silu_mul in elementwise.cpp / fp32.cpp).
// PyTorch's autograd makes four elementwise passes here (silu's backward, two products, a cast) over (tokens x
// intermediate) tensors -- 1536 wide for SmolLM2, ~2.5% of the long GRPO workload's update -- this makes one, with
// autograd's roundings: in bf16, y = bf16(silu(g)), d_up = bf16(dy y), d_silu = bf16(dy u) and
// d_gate = bf16(d_silu s (1 + g (1 - s))), s = sigmoid(g); in fp32 the same without the roundings.
#include "kernels.h"

namespace hybridrl {
namespace {

inline vf8 round_bf16_8(vf8 x) {  // to the nearest bf16, ties to even, as fp32 (finite x)
  vi8 u = (vi8)x;
  u = (u + 0x7fff + ((u >> 16) & 1)) & static_cast<int32_t>(0xffff0000u);
  return (vf8)u;
}

void load_row(const at::Tensor& t, int64_t r, int64_t n, float* out) {
  const int64_t rs = t.stride(0);
  if (t.scalar_type() == at::kBFloat16) {
    const auto* x = reinterpret_cast<const uint16_t*>(t.data_ptr()) + r * rs;
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(x[i]);
  } else {
    std::memcpy(out, t.data_ptr<float>() + r * rs, n * sizeof(float));
  }
}

void store_row(at::Tensor& t, int64_t r, int64_t n, const float* in) {
  if (t.scalar_type() == at::kBFloat16) cast_bf16(in, reinterpret_cast<uint16_t*>(t.data_ptr()) + r * n, n);
  else std::memcpy(t.data_ptr<float>() + r * n, in, n * sizeof(float));
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> silu_mul_bwd(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up) {
  const auto dtype = gate.scalar_type();
  TORCH_CHECK((dtype == at::kBFloat16 || dtype == at::kFloat) && up.scalar_type() == dtype
              && grad.scalar_type() == dtype && gate.sizes() == up.sizes() && grad.sizes() == gate.sizes()
              && gate.stride(-1) == 1 && up.stride(-1) == 1 && grad.stride(-1) == 1,
              "silu_mul_bwd: grad, gate and up of one shape and dtype (bf16 or fp32)");
  const bool bf16 = dtype == at::kBFloat16;
  const int64_t I = gate.size(-1), rows = gate.numel() / std::max<int64_t>(I, 1);
  const auto g2 = gate.reshape({rows, I}), u2 = up.reshape({rows, I}), d2 = grad.reshape({rows, I});
  auto d_gate = at::empty({rows, I}, gate.options()), d_up = at::empty({rows, I}, gate.options());
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(3 * I);
    float *g = buf.data(), *u = g + I, *dy = u + I;
    for (int64_t r = begin; r < end; ++r) {
      load_row(g2, r, I, g);
      load_row(u2, r, I, u);
      load_row(d2, r, I, dy);
      int64_t i = 0;
      for (; i + 8 <= I; i += 8) {
        const vf8 x = vload(g + i), e = exp8(x < 0.f ? x : -x);        // e^-|x|
        const vf8 s = x < 0.f ? e / (1.f + e) : 1.f / (1.f + e);       // sigmoid, no overflow either way
        vf8 y = x * s, dsilu = vload(dy + i) * vload(u + i);
        if (bf16) { y = round_bf16_8(y); dsilu = round_bf16_8(dsilu); }
        vstore(u + i, vload(dy + i) * y);                             // d_up (u is read above)
        vstore(g + i, dsilu * (s * (1.f + x * (1.f - s))));            // d_gate
      }
      for (; i < I; ++i) {
        const float x = g[i], s = 1.f / (1.f + std::exp(-x));
        float y = x * s, dsilu = dy[i] * u[i];
        if (bf16) { y = bf16_to_f32(f32_to_bf16(y)); dsilu = bf16_to_f32(f32_to_bf16(dsilu)); }
        u[i] = dy[i] * y;
        g[i] = dsilu * (s * (1.f + x * (1.f - s)));
      }
      store_row(d_gate, r, I, g);
      store_row(d_up, r, I, u);
    }
  });
  return {d_gate.view(gate.sizes()), d_up.view(gate.sizes())};
}

}  // namespace hybridrl
