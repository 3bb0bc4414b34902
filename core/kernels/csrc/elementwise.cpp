// Row-wise fused kernels: RMSNorm, rotary, the gated MLP's activation, cache writes, temperature sampling.
#include "kernels.h"

namespace hybridrl {

// x (..., N) bf16, weight (N) bf16 -> bf16: the Llama RMSNorm rounding steps, bf16(w * bf16(x * rsqrt(mean(x^2) + eps)))
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(weight.dim() == 1 && x.size(-1) == weight.size(0) && weight.is_contiguous(), "rms_norm: weight shape");
  if (x.scalar_type() == at::kFloat) return rms_norm_f32(x, weight, eps);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16, "rms_norm: bf16 or fp32");
  const auto xc = x.contiguous();
  auto out = at::empty_like(xc);
  const int64_t N = x.size(-1), rows = xc.numel() / std::max<int64_t>(N, 1);
  const auto* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr());
  const auto* wp = reinterpret_cast<const uint16_t*>(weight.data_ptr());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* xr = xp + r * N;
#if defined(__AVX512F__)
      if (N % 16 == 0) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < N; i += 16) { const __m512 f = load_bf16(xr + i); acc = _mm512_fmadd_ps(f, f, acc); }
        const __m512 inv = _mm512_set1_ps(1.f / std::sqrt(_mm512_reduce_add_ps(acc) / static_cast<float>(N)
                                                          + static_cast<float>(eps)));
        for (int64_t i = 0; i < N; i += 16) {
          const __m512 y = round_bf16(_mm512_mul_ps(load_bf16(xr + i), inv));
          store_bf16(op + r * N + i, round_bf16(_mm512_mul_ps(load_bf16(wp + i), y)));
        }
        continue;
      }
#endif
      // 16 partial sums, as the vector path's lanes: one running fp32 sum over N values drifts by ~N ulps and
      // moved ~1% of the outputs by a bf16 ulp (an AVX2-only CPU's test failed on it)
      float part[16] = {0.f};
      for (int64_t i = 0; i < N; ++i) { const float f = bf16_to_f32(xr[i]); part[i % 16] = std::fma(f, f, part[i % 16]); }
      const float inv = 1.f / std::sqrt(sum16(part) / static_cast<float>(N) + static_cast<float>(eps));
      for (int64_t i = 0; i < N; ++i) {
        const float y = bf16_to_f32(f32_to_bf16(bf16_to_f32(xr[i]) * inv));
        op[r * N + i] = f32_to_bf16(bf16_to_f32(wp[i]) * y);
      }
    }
  });
  return out;
}

// One decode step's keys and values into the slot cache: cache[b, :, pos[b]] = new[b, :, 0] for b < n
void write_decode(at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& k_new, const at::Tensor& v_new,
                  const at::Tensor& pos) {
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && pos.scalar_type() == at::kLong, "write_decode");
  TORCH_CHECK(k_new.stride(3) == 1 && v_new.stride(3) == 1 && k_new.scalar_type() == k_cache.scalar_type()
              && v_new.scalar_type() == v_cache.scalar_type(), "write_decode: new keys/values");
  const auto posc = pos.contiguous();
  const int64_t n = k_new.size(0), H = k_cache.size(1), M = k_cache.size(2), D = k_cache.size(3);
  const int64_t es = k_cache.element_size();
  const int64_t* pp = posc.data_ptr<int64_t>();
  for (int64_t b = 0; b < n; ++b) TORCH_CHECK(pp[b] >= 0 && pp[b] < M, "write_decode: position out of the cache");
  auto* kc = static_cast<char*>(k_cache.data_ptr());
  auto* vc = static_cast<char*>(v_cache.data_ptr());
  const auto* kn = static_cast<const char*>(k_new.data_ptr());
  const auto* vn = static_cast<const char*>(v_new.data_ptr());
  for (int64_t b = 0; b < n; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t dst = ((b * H + h) * M + pp[b]) * D * es;
      std::memcpy(kc + dst, kn + (b * k_new.stride(0) + h * k_new.stride(1)) * es, D * es);
      std::memcpy(vc + dst, vn + (b * v_new.stride(0) + h * v_new.stride(1)) * es, D * es);
    }
}

namespace {
// Row b of logits (B, V) as the unnormalised weights of softmax(logits * it) into w (V): the scaled row, its max,
// exp and sum -- one order of operations, so that sample_rows' log-probs and token_logprobs' are the same bits.
// Returns the total.
float row_weights(const at::Tensor& logits, int64_t b, float it, float* w) {
  const int64_t V = logits.size(1), rs = logits.stride(0);
  const bool is_bf16 = logits.scalar_type() == at::kBFloat16;
  // the row as fp32, scaled by 1 / temperature
  if (is_bf16) {
    const auto* x = reinterpret_cast<const uint16_t*>(logits.data_ptr()) + b * rs;
    for (int64_t i = 0; i < V; ++i) w[i] = bf16_to_f32(x[i]) * it;
  } else {
    const float* x = logits.data_ptr<float>() + b * rs;
    for (int64_t i = 0; i < V; ++i) w[i] = x[i] * it;
  }
  float mx = -INFINITY, total = 0.f;
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 mv = _mm512_set1_ps(-INFINITY);
  for (; i + 16 <= V; i += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(w + i));
  mx = _mm512_reduce_max_ps(mv);
#endif
  for (; i < V; ++i) mx = std::max(mx, w[i]);
  i = 0;
#if defined(__AVX512F__)
  const __m512 mxv = _mm512_set1_ps(mx);
  __m512 sv = _mm512_setzero_ps();
  for (; i + 16 <= V; i += 16) {
    const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(w + i), mxv));
    _mm512_storeu_ps(w + i, e);
    sv = _mm512_add_ps(sv, e);
  }
  total = _mm512_reduce_add_ps(sv);
#else
  vf8 s0 = vf8{}, s1 = vf8{};  // 16 lanes in two 8-lane sums, as the AVX-512 path's
  for (; i + 16 <= V; i += 16) {
    const vf8 e0 = exp8(vload(w + i) - mx), e1 = exp8(vload(w + i + 8) - mx);
    vstore(w + i, e0);
    vstore(w + i + 8, e1);
    s0 += e0;
    s1 += e1;
  }
  total = vsum(s0 + s1);
#endif
  float part[16] = {0.f};  // the tail in 16 partial sums too
  for (int64_t j = 0; i < V; ++i, ++j) part[j % 16] += (w[i] = std::exp(w[i] - mx));
  total += sum16(part);
  return total;
}
}  // namespace

// One token per row of logits (B, V) from softmax(logits * inv_temperature), by inverse CDF with the row's uniform
// u[b] in [0, 1): the first index whose cumulative weight exceeds u * total. Returns (tokens (B,) int64, their
// log-probs (B,) fp32). Per row, in a per-thread fp32 buffer: the scaled row, its max, exp and sum, the scan.
std::tuple<at::Tensor, at::Tensor> sample_rows(const at::Tensor& logits, double inv_temperature, const at::Tensor& u) {
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1, "sample_rows: logits (B, V) with unit stride on V");
  TORCH_CHECK(logits.scalar_type() == at::kBFloat16 || logits.scalar_type() == at::kFloat, "sample_rows: bf16 or fp32");
  TORCH_CHECK(u.scalar_type() == at::kFloat && u.numel() == logits.size(0), "sample_rows: one fp32 uniform per row");
  const int64_t B = logits.size(0), V = logits.size(1);
  const auto uc = u.contiguous();
  const float* up = uc.data_ptr<float>();
  auto tok = at::empty({B}, logits.options().dtype(at::kLong));
  auto logp = at::empty({B}, logits.options().dtype(at::kFloat));
  int64_t* tp = tok.data_ptr<int64_t>();
  float* lp = logp.data_ptr<float>();
  const float it = static_cast<float>(inv_temperature);
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> w(V);
    for (int64_t b = begin; b < end; ++b) {
      const float total = row_weights(logits, b, it, w.data());
      int64_t i = 0;
      // the scan: 16-wide block sums first, then inside the block
      const float target = up[b] * total;
      float acc = 0.f;
      int64_t pick = -1;
#if defined(__AVX512F__)
      for (; i + 16 <= V; i += 16) {
        const float blk = _mm512_reduce_add_ps(_mm512_loadu_ps(w.data() + i));
        if (acc + blk > target) break;
        acc += blk;
      }
#else
      for (; i + 16 <= V; i += 16) {  // the same 16-wide blocks: a running sum over the whole row drifts
        const float blk = sum16(w.data() + i);
        if (acc + blk > target) break;
        acc += blk;
      }
#endif
      for (; i < V; ++i) {
        acc += w[i];
        if (acc > target && w[i] > 0.f) { pick = i; break; }
      }
      if (pick < 0) {  // rounding left the target at or past the total: the last index with weight (the max has 1)
        pick = V - 1;
        while (w[pick] <= 0.f) --pick;
      }
      tp[b] = pick;
      lp[b] = std::log(w[pick]) - std::log(total);
    }
  });
  return {tok, logp};
}

// log softmax(logits * inv_temperature)[ids] per row of logits (B, V), fp32 (B,): the arithmetic of sample_rows'
// log-probs (row_weights), so a trainer that scores the engine's samples from the same logits gets the same bits
at::Tensor token_logprobs(const at::Tensor& logits, double inv_temperature, const at::Tensor& ids) {
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1, "token_logprobs: logits (B, V) with unit stride on V");
  TORCH_CHECK(logits.scalar_type() == at::kBFloat16 || logits.scalar_type() == at::kFloat, "token_logprobs: bf16 or fp32");
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.numel() == logits.size(0), "token_logprobs: one int64 id per row");
  const int64_t B = logits.size(0), V = logits.size(1);
  const auto ic = ids.contiguous();
  const int64_t* ip = ic.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) TORCH_CHECK(ip[b] >= 0 && ip[b] < V, "token_logprobs: id out of the vocabulary");
  auto logp = at::empty({B}, logits.options().dtype(at::kFloat));
  float* lp = logp.data_ptr<float>();
  const float it = static_cast<float>(inv_temperature);
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> w(V);
    for (int64_t b = begin; b < end; ++b) {
      const float total = row_weights(logits, b, it, w.data());
      lp[b] = std::log(w[ip[b]]) - std::log(total);
    }
  });
  return logp;
}

inline uint16_t mul_bf16(uint16_t a, uint16_t b) { return f32_to_bf16(bf16_to_f32(a) * bf16_to_f32(b)); }

// Llama's apply_rotary_pos_emb (unsqueeze_dim 1) for one tensor x (B, H, T, D), cos/sin (B, T, D), with its bf16
// rounding steps: bf16(bf16(x * cos) + bf16(rotate_half(x) * sin)); rotate_half(x) = cat(-x[D/2:], x[:D/2]).
static at::Tensor rotary_one(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3), half = D / 2;
  auto out = at::empty({B, H, T, D}, x.options());
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr());
  const auto* cp = reinterpret_cast<const uint16_t*>(cos.data_ptr());
  const auto* sp = reinterpret_cast<const uint16_t*>(sin.data_ptr());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  const int64_t cb = cos.size(0) == 1 ? 0 : cos.stride(0), sb = sin.size(0) == 1 ? 0 : sin.stride(0);
  at::parallel_for(0, B * H * T, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / (H * T), h = (r / T) % H, t = r % T;
      const uint16_t* xr = xp + b * x.stride(0) + h * x.stride(1) + t * x.stride(2);
      const uint16_t* c = cp + b * cb + t * cos.stride(1);
      const uint16_t* s = sp + b * sb + t * sin.stride(1);
      uint16_t* o = op + r * D;
      for (int64_t d = 0; d < D; ++d) {
        const uint16_t rot = d < half ? static_cast<uint16_t>(xr[d + half] ^ 0x8000) : xr[d - half];
        o[d] = f32_to_bf16(bf16_to_f32(mul_bf16(xr[d], c[d])) + bf16_to_f32(mul_bf16(rot, s[d])));
      }
    }
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                          const at::Tensor& sin) {
  const auto dtype = q.scalar_type();
  for (const auto* t : {&q, &k, &cos, &sin})
    TORCH_CHECK((dtype == at::kBFloat16 || dtype == at::kFloat) && t->scalar_type() == dtype && t->stride(-1) == 1,
                "rotary: all bf16 or all fp32, with unit stride on head_dim");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && cos.dim() == 3 && sin.dim() == 3 && q.size(3) % 2 == 0
              && cos.size(2) == q.size(3) && sin.sizes() == cos.sizes() && cos.size(1) == q.size(2)
              && k.size(2) == q.size(2) && k.size(3) == q.size(3), "rotary: shapes");
  if (dtype == at::kFloat) return {rotary_one_f32(q, cos, sin), rotary_one_f32(k, cos, sin)};
  return {rotary_one(q, cos, sin), rotary_one(k, cos, sin)};
}

// The gated MLP's activation: bf16(bf16(silu(gate)) * up); gate/up (..., I) may be strided views (one fused matmul)
at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK((gate.scalar_type() == at::kBFloat16 || gate.scalar_type() == at::kFloat)
              && up.scalar_type() == gate.scalar_type() && gate.sizes() == up.sizes() && gate.stride(-1) == 1
              && up.stride(-1) == 1, "silu_mul: gate and up of one shape and dtype (bf16 or fp32)");
  if (gate.scalar_type() == at::kFloat) return silu_mul_f32(gate, up);
  const int64_t I = gate.size(-1), rows = gate.numel() / std::max<int64_t>(I, 1);
  const auto g2 = gate.reshape({rows, I}), u2 = up.reshape({rows, I});  // views when the rows are uniformly strided
  auto out = at::empty(gate.sizes(), gate.options());
  const auto* gp = reinterpret_cast<const uint16_t*>(g2.data_ptr());
  const auto* upp = reinterpret_cast<const uint16_t*>(u2.data_ptr());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  const int64_t gs = g2.stride(0), us = u2.stride(0);
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* g = gp + r * gs;
      const uint16_t* u = upp + r * us;
      uint16_t* o = op + r * I;
      int64_t i = 0;
#if defined(__AVX512F__)
      for (; i + 16 <= I; i += 16) {
        const __m512 x = load_bf16(g + i);
        // sigmoid from e = e^(-|x|) alone: 1 / (1 + e) for x >= 0, e / (1 + e) for x < 0 (no overflow either way)
        const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
        const __m512 r = _mm512_div_ps(_mm512_set1_ps(1.f), _mm512_add_ps(_mm512_set1_ps(1.f), e));
        const __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
        const __m512 sig = _mm512_mask_mul_ps(r, neg, r, e);
        const __m512 y = round_bf16(_mm512_mul_ps(x, sig));
        store_bf16(o + i, round_bf16(_mm512_mul_ps(y, load_bf16(u + i))));
      }
#endif
      for (; i < I; ++i) {
        const float x = bf16_to_f32(g[i]);
        const float y = bf16_to_f32(f32_to_bf16(x / (1.f + std::exp(-x))));
        o[i] = f32_to_bf16(y * bf16_to_f32(u[i]));
      }
    }
  });
  return out;
}

}  // namespace hybridrl
