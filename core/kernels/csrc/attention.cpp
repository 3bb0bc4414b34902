// Decode attention over the slot cache's strided views, read in place (see core/kernels/cpu.py).
#include "kernels.h"

namespace hybridrl {
namespace {

#if defined(__AVX512F__)
// q . k over D = 32 * C32 as a 16-lane partial sum (C32 compile-time: everything stays in registers)
#if defined(__AVX512BF16__)
template <int C32>
struct Dot {
  __m512bh q[C32];
  void load(const uint16_t* p) { for (int c = 0; c < C32; ++c) q[c] = (__m512bh)_mm512_loadu_si512(p + 32 * c); }
  __m512 partial(const uint16_t* k) const {
    __m512 a = _mm512_dpbf16_ps(_mm512_setzero_ps(), q[0], (__m512bh)_mm512_loadu_si512(k));
    for (int c = 1; c < C32; ++c) a = _mm512_dpbf16_ps(a, q[c], (__m512bh)_mm512_loadu_si512(k + 32 * c));
    return a;
  }
};
#else
template <int C32>
struct Dot {
  __m512 q[2 * C32];
  void load(const uint16_t* p) { for (int c = 0; c < 2 * C32; ++c) q[c] = load_bf16(p + 16 * c); }
  __m512 partial(const uint16_t* k) const {
    __m512 a = _mm512_mul_ps(q[0], load_bf16(k));
    for (int c = 1; c < 2 * C32; ++c) a = _mm512_fmadd_ps(q[c], load_bf16(k + 16 * c), a);
    return a;
  }
};
#endif

// softmax over each of the G rows of s (G x T), in place
inline void softmax_rows(float* s, int64_t G, int64_t T) {
  for (int64_t g = 0; g < G; ++g) {
    float* sg = s + g * T;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t t = 0; t < T; t += 16) {
      __mmask16 km = T - t >= 16 ? 0xffff : (__mmask16)((1u << (T - t)) - 1);
      mx = _mm512_max_ps(mx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), km, sg + t));
    }
    const float row_max = _mm512_reduce_max_ps(mx);
    if (row_max == -INFINITY) {  // every position masked (a padding query): attend to nothing
      std::fill(sg, sg + T, 0.f);
      continue;
    }
    const __m512 mxv = _mm512_set1_ps(row_max);
    __m512 sum = _mm512_setzero_ps();  // the live keys' exponentials, 16 lanes wide in their order (kernels.h)
    live_chunks<16>(sg, T, [&](float* chunk) {
      const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(chunk), mxv));
      _mm512_storeu_ps(chunk, e);
      sum = _mm512_add_ps(sum, e);
    });
    const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(sum));
    for (int64_t t = 0; t < T; t += 16) {
      __mmask16 km = T - t >= 16 ? 0xffff : (__mmask16)((1u << (T - t)) - 1);
      _mm512_mask_storeu_ps(sg + t, km, _mm512_mul_ps(_mm512_maskz_loadu_ps(km, sg + t), inv));
    }
  }
}

// attend() for D = 32 * C32: per query head, scores 16 positions at a time; then the values, a block of heads at a
// time with the accumulators in registers. Prefetches hide the cache's DRAM latency (-17% per step measured).
template <int C32>
void attend_avx512(const uint16_t* q, int64_t qs_head, const uint16_t* k, int64_t ks_t, const uint16_t* v,
                   int64_t vs_t, const float* m, int64_t G, int64_t T, float scale, float* s, uint16_t* out,
                   const uint16_t* next_k) {
  constexpr int D = 32 * C32, C = 2 * C32;
  const __m512 scv = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY), masked = _mm512_set1_ps(MASKED);
  // 16 keys a chunk from the first live one, the last chunk padded: each key's score takes the same lane of the same
  // reduction whatever masked keys lie before or after (a query scores alike in any batch)
  int64_t t0 = 0;
  while (t0 < T && m[t0] < MASKED) ++t0;
  for (int64_t g = 0; g < G; ++g) {
    Dot<C32> dot;
    dot.load(q + g * qs_head);
    float* sg = s + g * T;
    std::fill(sg, sg + t0, -INFINITY);
    for (int64_t t = t0; t < T; t += 16) {
      const int64_t n = std::min<int64_t>(16, T - t);
      const __mmask16 live = n == 16 ? 0xffff : (__mmask16)((1u << n) - 1);
      const __m512 mt = _mm512_maskz_loadu_ps(live, m + t);
      const __mmask16 dead = _mm512_cmp_ps_mask(mt, masked, _CMP_LT_OQ) | (__mmask16)~live;
      if (dead == 0xffff) {  // 16 masked keys (padding): not read
        _mm512_mask_storeu_ps(sg + t, live, ninf);
        continue;
      }
      if (g == 0)  // the values of these positions are read after the softmax: start fetching them now
        for (int j = 0; j < n; ++j)
          for (int c = 0; c < D; c += 32) _mm_prefetch(reinterpret_cast<const char*>(v + (t + j) * vs_t + c), _MM_HINT_T0);
      __m512 part[16];
      for (int j = 0; j < 16; ++j) part[j] = j < n ? dot.partial(k + (t + j) * ks_t) : _mm512_setzero_ps();
      _mm512_mask_storeu_ps(sg + t, live, _mm512_mask_blend_ps(dead, _mm512_fmadd_ps(reduce16(part), scv, mt), ninf));
    }
  }
  softmax_rows(s, G, T);
  // values: GB heads at a time, so each value row is converted to fp32 once per block, not once per head
  constexpr int GB = C <= 4 ? 4 : 2;
  for (int64_t g0 = 0; g0 < G; g0 += GB) {
    const int64_t gb = std::min<int64_t>(GB, G - g0);
    __m512 acc[GB * C];
    for (int i = 0; i < GB * C; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t t = 0; t < T; ++t) {
      if (next_k != nullptr && g0 == 0)  // the next (sequence, kv head)'s keys, while this one's values stream
        for (int c = 0; c < D; c += 32) _mm_prefetch(reinterpret_cast<const char*>(next_k + t * ks_t + c), _MM_HINT_T0);
      if (m[t] < MASKED) continue;  // weight 0 for every head: its value adds nothing (not read)
      __m512 vc[C];
      for (int c = 0; c < C; ++c) vc[c] = load_bf16(v + t * vs_t + 16 * c);
      for (int j = 0; j < GB; ++j) {
        if (j >= gb) break;
        const __m512 p = _mm512_set1_ps(s[(g0 + j) * T + t]);
        for (int c = 0; c < C; ++c) acc[j * C + c] = _mm512_fmadd_ps(p, vc[c], acc[j * C + c]);
      }
    }
    for (int64_t j = 0; j < gb; ++j)
      for (int c = 0; c < C; ++c) store_bf16(out + (g0 + j) * D + 16 * c, round_bf16(acc[j * C + c]));
  }
}
#endif

// One (sequence, kv head): the G query heads that share it against its T keys and values.
void attend(const uint16_t* q, int64_t qs_head, const uint16_t* k, int64_t ks_t, const uint16_t* v, int64_t vs_t,
            const float* m, int64_t G, int64_t T, int64_t D, float scale, float* s, uint16_t* out,
            const uint16_t* next_k) {
#if defined(__AVX512F__)
  if (D == 64) return attend_avx512<2>(q, qs_head, k, ks_t, v, vs_t, m, G, T, scale, s, out, next_k);
  if (D == 128) return attend_avx512<4>(q, qs_head, k, ks_t, v, vs_t, m, G, T, scale, s, out, next_k);
#endif
  std::vector<float> qf(G * D), acc(G * D, 0.f);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t d = 0; d < D; ++d) qf[g * D + d] = bf16_to_f32(q[g * qs_head + d]) * scale;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < G; ++g) {
      if (m[t] < MASKED) {  // a masked key: not read
        s[g * T + t] = -INFINITY;
        continue;
      }
      float a = 0.f;
      for (int64_t d = 0; d < D; ++d) a += qf[g * D + d] * bf16_to_f32(k[t * ks_t + d]);
      s[g * T + t] = a + m[t];
    }
  for (int64_t g = 0; g < G; ++g) {
    float* sg = s + g * T;
    const float mx = *std::max_element(sg, sg + T);
    if (mx == -INFINITY) {
      std::fill(sg, sg + T, 0.f);
      continue;
    }
    float sum = 0.f;
    for (int64_t t = 0; t < T; ++t) sum += (sg[t] = std::exp(sg[t] - mx));
    for (int64_t t = 0; t < T; ++t) sg[t] /= sum;
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < G && m[t] >= MASKED; ++g)
      for (int64_t d = 0; d < D; ++d) acc[g * D + d] += s[g * T + t] * bf16_to_f32(v[t * vs_t + d]);
  for (int64_t i = 0; i < G * D; ++i) out[i] = f32_to_bf16(acc[i]);
}

}  // namespace

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            double scale) {
  // q (B, H, L, D); k, v (B, KVH, T, D), any strides but a unit one on D; mask (B or 1, 1, L or 1, T) fp32
  // additive. Each of the L query rows is a decode query of its own (its mask row says which keys it sees): the
  // short prefills of an RL rollout (a prompt's tail after a shared prefix) take this path too.
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "decode_attention: 4-D q, k, v");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "decode_attention: head_dim must have unit stride");
  TORCH_CHECK(mask.scalar_type() == at::kFloat && mask.is_contiguous() && mask.dim() == 4 && mask.size(-1) == k.size(2)
              && (mask.size(2) == 1 || mask.size(2) == q.size(2)), "decode_attention: mask");
  TORCH_CHECK(q.size(1) % k.size(1) == 0, "decode_attention: heads not a multiple of kv heads");
  if (q.scalar_type() == at::kFloat) return decode_attention_f32(q, k, v, mask, scale);
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 && v.scalar_type() == at::kBFloat16,
              "decode_attention: bf16 or fp32 q, k, v");
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), D = q.size(3), KVH = k.size(1), T = k.size(2), G = H / KVH;
  auto out = at::empty({B, L, H, D}, q.options());
  const auto* qp = reinterpret_cast<const uint16_t*>(q.data_ptr());
  const auto* kp = reinterpret_cast<const uint16_t*>(k.data_ptr());
  const auto* vp = reinterpret_cast<const uint16_t*>(v.data_ptr());
  const float* mp = mask.data_ptr<float>();
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  const int64_t ms_b = mask.size(0) == 1 ? 0 : mask.size(2) * T, ms_l = mask.size(2) == 1 ? 0 : T;
  // tasks ordered (sequence, kv head, query row): consecutive tasks share their keys and values
  at::parallel_for(0, B * KVH * L, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(G * T);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / (KVH * L), kh = task / L % KVH, i = task % L;
      const int64_t nb = (task + 1) / (KVH * L), nkh = (task + 1) / L % KVH;
      const uint16_t* next_k = task + 1 < end ? kp + nb * k.stride(0) + nkh * k.stride(1) : nullptr;
      attend(qp + b * q.stride(0) + kh * G * q.stride(1) + i * q.stride(2), q.stride(1),
             kp + b * k.stride(0) + kh * k.stride(1), k.stride(2), vp + b * v.stride(0) + kh * v.stride(1),
             v.stride(2), mp + b * ms_b + i * ms_l, G, T, D, static_cast<float>(scale), s.data(),
             op + ((b * L + i) * H + kh * G) * D, next_k);
    }
  });
  return out;
}

}  // namespace hybridrl
