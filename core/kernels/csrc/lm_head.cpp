// The fused LM head's per-block row work (core/train/lm_head.py): one pass over a block of logits per row, in
// cache, where the PyTorch path makes ~6 elementwise passes over (positions x block) fp32 temporaries (max, subtract,
// exp, sum, product, sum; backward: subtract, exp, scale, scatter, product, divide, cast). What it saves, measured:
// core/train/lm_head.py's docstring.
//
// Targets come as a CSR over rows: row_ptr (M + 1), tok (Q) their vocabulary ids; a target outside [v0, v1) is
// another block's. Both dtypes (bf16, fp32) read the block through a per-thread fp32 row; the math is 8-lane vf8
// (kernels.h), one code for every x86-64 CPU.
#include "kernels.h"

namespace hybridrl {
namespace {

// row r of a (M, Vb) block as fp32 into buf; returns its max
float load_row(const at::Tensor& logits, int64_t r, float* buf) {
  const int64_t Vb = logits.size(1), rs = logits.stride(0);
  float mx = -INFINITY;
  if (logits.scalar_type() == at::kBFloat16) {
    const auto* x = reinterpret_cast<const uint16_t*>(logits.data_ptr()) + r * rs;
    for (int64_t i = 0; i < Vb; ++i) mx = std::max(mx, buf[i] = bf16_to_f32(x[i]));
  } else {
    const float* x = logits.data_ptr<float>() + r * rs;
    for (int64_t i = 0; i < Vb; ++i) mx = std::max(mx, buf[i] = x[i]);
  }
  return mx;
}

inline float exp1(float x) {  // exp8's polynomial for one value (x <= 0), so tails round as the body
  vf8 v = vsplat(x);
  return exp8(v)[0];
}

void check_block(const at::Tensor& logits, const at::Tensor& row_ptr, const at::Tensor& tok, const char* what) {
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1, what, ": logits (M, Vb) with unit stride on Vb");
  TORCH_CHECK(logits.scalar_type() == at::kBFloat16 || logits.scalar_type() == at::kFloat, what, ": bf16 or fp32");
  TORCH_CHECK(row_ptr.scalar_type() == at::kLong && row_ptr.is_contiguous() && row_ptr.numel() == logits.size(0) + 1,
              what, ": row_ptr (M + 1) int64");
  TORCH_CHECK(tok.scalar_type() == at::kLong && tok.is_contiguous(), what, ": tok int64");
}

}  // namespace

// Folds a block of logits (M, Vb), vocabulary columns [v0, v0 + Vb), into each row's running state, in logit units:
// peak (the max so far), total (sum of exp((x - peak) / T)), moment (sum of exp((x - peak) / T) * x; when
// with_moment), and writes each target's logit: picked[slot] for the targets in this block (slot = CSR index).
void head_fold(const at::Tensor& logits, int64_t v0, at::Tensor peak, at::Tensor total, at::Tensor moment,
               bool with_moment, const at::Tensor& row_ptr, const at::Tensor& tok, at::Tensor picked,
               double temperature) {
  check_block(logits, row_ptr, tok, "head_fold");
  const int64_t M = logits.size(0), Vb = logits.size(1);
  TORCH_CHECK(peak.is_contiguous() && total.is_contiguous() && moment.is_contiguous() && picked.is_contiguous()
              && peak.scalar_type() == at::kFloat && total.scalar_type() == at::kFloat
              && moment.scalar_type() == at::kFloat && picked.scalar_type() == at::kFloat
              && peak.numel() == M && total.numel() == M && (!with_moment || moment.numel() == M)
              && picked.numel() == tok.numel(), "head_fold: fp32 state of M rows, picked of Q targets");
  float *pk = peak.data_ptr<float>(), *tt = total.data_ptr<float>(), *mo = moment.data_ptr<float>();
  float* out = picked.data_ptr<float>();
  const int64_t *rp = row_ptr.data_ptr<int64_t>(), *tk = tok.data_ptr<int64_t>();
  const float inv_t = static_cast<float>(1.0 / temperature);
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(Vb);
    float* w = buf.data();
    for (int64_t r = begin; r < end; ++r) {
      const float new_peak = std::max(pk[r], load_row(logits, r, w));
      for (int64_t j = rp[r]; j < rp[r + 1]; ++j)
        if (tk[j] >= v0 && tk[j] < v0 + Vb) out[j] = w[tk[j] - v0];
      const vf8 pv = vsplat(new_peak);
      vf8 s0 = vf8{}, m0 = vf8{};
      int64_t i = 0;
      for (; i + 8 <= Vb; i += 8) {
        const vf8 x = vload(w + i), e = exp8((x - pv) * inv_t);
        s0 += e;
        m0 += e * x;
      }
      float s = vsum(s0), m = vsum(m0);
      for (; i < Vb; ++i) {
        const float e = exp1((w[i] - new_peak) * inv_t);
        s += e;
        m += e * w[i];
      }
      const float rescale = pk[r] == -INFINITY ? 0.f : std::exp((pk[r] - new_peak) * inv_t);
      tt[r] = tt[r] * rescale + s;
      if (with_moment) mo[r] = mo[r] * rescale + m;
      pk[r] = new_peak;
    }
  });
}

// The gradient of the logits block (M, Vb) into out (a (M, Vb) view of the compute dtype), per row r and column i:
//   p = exp((x - logz_t[r]) / T)                              (softmax; logz_t = T log sum exp(x / T))
//   g = -g_pos[r] p + sum of the row's targets' weights at i  (d/dx of the weighted log-probs)
//       - g_ent[r] p (x - mean_t[r]) / T                      (d/dx of the weighted entropy; when with_ent)
//   out = g / T, rounded once to out's dtype.
// val (Q) are the targets' weights in CSR order.
void head_grad(const at::Tensor& logits, int64_t v0, const at::Tensor& logz_t, const at::Tensor& g_pos,
               const at::Tensor& g_ent, const at::Tensor& mean_t, bool with_ent, const at::Tensor& row_ptr,
               const at::Tensor& tok, const at::Tensor& val, at::Tensor out, double temperature) {
  check_block(logits, row_ptr, tok, "head_grad");
  const int64_t M = logits.size(0), Vb = logits.size(1), os = out.stride(0);
  TORCH_CHECK(out.size(0) == M && out.size(1) == Vb && out.stride(1) == 1
              && (out.scalar_type() == at::kBFloat16 || out.scalar_type() == at::kFloat), "head_grad: out (M, Vb)");
  for (const auto* t : {&logz_t, &g_pos, &g_ent, &mean_t, &val})
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->is_contiguous(), "head_grad: fp32 per-row / per-target values");
  TORCH_CHECK(logz_t.numel() == M && g_pos.numel() == M && val.numel() == tok.numel()
              && (!with_ent || (g_ent.numel() == M && mean_t.numel() == M)), "head_grad: sizes");
  const float *lz = logz_t.data_ptr<float>(), *gp = g_pos.data_ptr<float>(), *ge = g_ent.data_ptr<float>();
  const float *mt = mean_t.data_ptr<float>(), *vl = val.data_ptr<float>();
  const int64_t *rp = row_ptr.data_ptr<int64_t>(), *tk = tok.data_ptr<int64_t>();
  const bool out_bf16 = out.scalar_type() == at::kBFloat16;
  const float inv_t = static_cast<float>(1.0 / temperature);
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> buf(Vb);
    float* w = buf.data();
    for (int64_t r = begin; r < end; ++r) {
      load_row(logits, r, w);
      const vf8 lzv = vsplat(lz[r]), gpv = vsplat(-gp[r]);
      const float gent = with_ent ? ge[r] : 0.f, mean = with_ent ? mt[r] : 0.f;
      const vf8 gev = vsplat(gent), mv = vsplat(mean);
      int64_t i = 0;
      for (; i + 8 <= Vb; i += 8) {
        const vf8 x = vload(w + i), p = exp8((x - lzv) * inv_t);
        vf8 g = p * gpv;
        if (with_ent) g -= gev * p * ((x - mv) * inv_t);
        vstore(w + i, g);
      }
      for (; i < Vb; ++i) {
        const float p = exp1((w[i] - lz[r]) * inv_t);
        float g = p * -gp[r];
        if (with_ent) g -= gent * p * ((w[i] - mean) * inv_t);
        w[i] = g;
      }
      for (int64_t j = rp[r]; j < rp[r + 1]; ++j)
        if (tk[j] >= v0 && tk[j] < v0 + Vb) w[tk[j] - v0] += vl[j];
      for (i = 0; i < Vb; ++i) w[i] *= inv_t;
      if (out_bf16) cast_bf16(w, reinterpret_cast<uint16_t*>(out.data_ptr()) + r * os, Vb);
      else std::memcpy(out.data_ptr<float>() + r * os, w, Vb * sizeof(float));
    }
  });
}

}  // namespace hybridrl
