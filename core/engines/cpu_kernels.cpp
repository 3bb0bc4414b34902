#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

inline float bf16_to_f32(uint16_t x) {
  uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {  // round to nearest even, as c10::BFloat16
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

#if defined(__AVX512F__)
inline __m512 load_bf16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
inline __m512 load_bf16_masked(const uint16_t* p, __mmask16 k) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p)), 16));
}
// x rounded to the nearest bf16 (ties to even), still as fp32; NaN stays NaN
inline __m512 round_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)),
                                     _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_castsi512_ps(r), x);
}
inline void store_bf16(uint16_t* p, __m512 x) {  // x already a bf16 value (round_bf16)
  _mm256_storeu_si256((__m256i*)p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x), 16)));
}

// e^x for x <= 0 (softmax after subtracting the max), 0 below -87: 2^(x log2 e) = 2^n * 2^f, f in [-0.5, 0.5], degree-6 polynomial
inline __m512 exp512(__m512 x) {
  const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);  // below: exactly 0 (and -inf)
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147180559945309f));
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_maskz_mov_ps(live, _mm512_scalef_ps(p, n));
}

// The 16 horizontal sums of v[0..15] as one vector (lane j = sum of v[j]): three shuffle-and-add levels, ~40
// instructions where 16 separate reductions take ~130.
inline __m512 reduce16(const __m512* v) {
  __m512 w[8], x[4];
  for (int i = 0; i < 8; ++i)
    w[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)
    x[i] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 z01 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 z23 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(z01, z23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(z01, z23, _MM_SHUFFLE(3, 1, 3, 1)));
}

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
    const __m512 mxv = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t = 0; t < T; t += 16) {
      __mmask16 km = T - t >= 16 ? 0xffff : (__mmask16)((1u << (T - t)) - 1);
      __m512 e = _mm512_maskz_mov_ps(km, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(km, sg + t), mxv)));
      _mm512_mask_storeu_ps(sg + t, km, e);
      sum = _mm512_add_ps(sum, e);
    }
    const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(sum));
    for (int64_t t = 0; t < T; t += 16) {
      __mmask16 km = T - t >= 16 ? 0xffff : (__mmask16)((1u << (T - t)) - 1);
      _mm512_mask_storeu_ps(sg + t, km, _mm512_mul_ps(_mm512_maskz_loadu_ps(km, sg + t), inv));
    }
  }
}

// attend() for D = 32 * C32: per query head, scores 16 positions at a time, then the values with the
// accumulator in registers (the values are re-read per head from L1: a head's T x D block is ~10 KB)
template <int C32>
void attend_avx512(const uint16_t* q, int64_t qs_head, const uint16_t* k, int64_t ks_t, const uint16_t* v,
                   int64_t vs_t, const float* m, int64_t G, int64_t T, float scale, float* s, uint16_t* out,
                   const uint16_t* next_k) {
  constexpr int D = 32 * C32, C = 2 * C32;
  const __m512 scv = _mm512_set1_ps(scale);
  for (int64_t g = 0; g < G; ++g) {
    Dot<C32> dot;
    dot.load(q + g * qs_head);
    float* sg = s + g * T;
    int64_t t = 0;
    for (; t + 16 <= T; t += 16) {
      if (g == 0)  // the values of these positions are read after the softmax: start fetching them now
        for (int j = 0; j < 16; ++j)
          for (int c = 0; c < D; c += 32) _mm_prefetch(reinterpret_cast<const char*>(v + (t + j) * vs_t + c), _MM_HINT_T0);
      __m512 part[16];
      for (int j = 0; j < 16; ++j) part[j] = dot.partial(k + (t + j) * ks_t);
      _mm512_storeu_ps(sg + t, _mm512_fmadd_ps(reduce16(part), scv, _mm512_loadu_ps(m + t)));
    }
    for (; t < T; ++t) sg[t] = _mm512_reduce_add_ps(dot.partial(k + t * ks_t)) * scale + m[t];
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
      float a = 0.f;
      for (int64_t d = 0; d < D; ++d) a += qf[g * D + d] * bf16_to_f32(k[t * ks_t + d]);
      s[g * T + t] = a + m[t];
    }
  for (int64_t g = 0; g < G; ++g) {
    float* sg = s + g * T;
    const float mx = *std::max_element(sg, sg + T);
    float sum = 0.f;
    for (int64_t t = 0; t < T; ++t) sum += (sg[t] = std::exp(sg[t] - mx));
    for (int64_t t = 0; t < T; ++t) sg[t] /= sum;
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t d = 0; d < D; ++d) acc[g * D + d] += s[g * T + t] * bf16_to_f32(v[t * vs_t + d]);
  for (int64_t i = 0; i < G * D; ++i) out[i] = f32_to_bf16(acc[i]);
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            double scale) {
  // q (B, H, 1, D); k, v (B, KVH, T, D), any strides but a unit one on D; mask (B or 1, 1, 1, T) fp32 additive
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 && v.scalar_type() == at::kBFloat16,
              "decode_attention: bf16 q, k, v");
  TORCH_CHECK(q.dim() == 4 && q.size(2) == 1 && k.dim() == 4 && v.dim() == 4, "decode_attention: one query per sequence");
  TORCH_CHECK(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1, "decode_attention: head_dim must have unit stride");
  TORCH_CHECK(mask.scalar_type() == at::kFloat && mask.is_contiguous() && mask.size(-1) == k.size(2), "decode_attention: mask");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3), KVH = k.size(1), T = k.size(2), G = H / KVH;
  TORCH_CHECK(H % KVH == 0, "decode_attention: heads not a multiple of kv heads");
  auto out = at::empty({B, 1, H, D}, q.options());
  const auto* qp = reinterpret_cast<const uint16_t*>(q.data_ptr());
  const auto* kp = reinterpret_cast<const uint16_t*>(k.data_ptr());
  const auto* vp = reinterpret_cast<const uint16_t*>(v.data_ptr());
  const float* mp = mask.data_ptr<float>();
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  const int64_t ms = mask.size(0) == 1 ? 0 : T;
  at::parallel_for(0, B * KVH, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(G * T);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / KVH, kh = task % KVH;
      const int64_t nb = (task + 1) / KVH, nkh = (task + 1) % KVH;
      const uint16_t* next_k = task + 1 < end ? kp + nb * k.stride(0) + nkh * k.stride(1) : nullptr;
      attend(qp + b * q.stride(0) + kh * G * q.stride(1), q.stride(1), kp + b * k.stride(0) + kh * k.stride(1),
             k.stride(2), vp + b * v.stride(0) + kh * v.stride(1), v.stride(2), mp + b * ms, G, T, D,
             static_cast<float>(scale), s.data(), op + (b * H + kh * G) * D, next_k);
    }
  });
  return out;
}

// x (..., N) bf16, weight (N) bf16 -> bf16: the Llama RMSNorm rounding steps, bf16(w * bf16(x * rsqrt(mean(x^2) + eps)))
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16, "rms_norm: bf16");
  TORCH_CHECK(weight.dim() == 1 && x.size(-1) == weight.size(0) && weight.is_contiguous(), "rms_norm: weight shape");
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
      float ss = 0.f;
      for (int64_t i = 0; i < N; ++i) { const float f = bf16_to_f32(xr[i]); ss += f * f; }
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(N) + static_cast<float>(eps));
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

// One token per row of logits (B, V) from softmax(logits * inv_temperature), by inverse CDF with the row's uniform
// u[b] in [0, 1): the first index whose cumulative weight exceeds u * total. Returns (tokens (B,) int64, their
// log-probs (B,) fp32). Three passes per row: max, exp and sum (weights kept in a per-thread buffer), the scan.
std::tuple<at::Tensor, at::Tensor> sample_rows(const at::Tensor& logits, double inv_temperature, const at::Tensor& u) {
  TORCH_CHECK(logits.dim() == 2 && logits.stride(1) == 1, "sample_rows: logits (B, V) with unit stride on V");
  TORCH_CHECK(logits.scalar_type() == at::kBFloat16 || logits.scalar_type() == at::kFloat, "sample_rows: bf16 or fp32");
  TORCH_CHECK(u.scalar_type() == at::kFloat && u.numel() == logits.size(0), "sample_rows: one fp32 uniform per row");
  const int64_t B = logits.size(0), V = logits.size(1), rs = logits.stride(0);
  const bool is_bf16 = logits.scalar_type() == at::kBFloat16;
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
      for (; i + 16 <= V; i += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(w.data() + i));
      mx = _mm512_reduce_max_ps(mv);
#endif
      for (; i < V; ++i) mx = std::max(mx, w[i]);
      i = 0;
#if defined(__AVX512F__)
      const __m512 mxv = _mm512_set1_ps(mx);
      __m512 sv = _mm512_setzero_ps();
      for (; i + 16 <= V; i += 16) {
        const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(w.data() + i), mxv));
        _mm512_storeu_ps(w.data() + i, e);
        sv = _mm512_add_ps(sv, e);
      }
      total = _mm512_reduce_add_ps(sv);
#endif
      for (; i < V; ++i) total += (w[i] = std::exp(w[i] - mx));
      // the scan: 16-wide block sums first, then inside the block
      const float target = up[b] * total;
      float acc = 0.f;
      int64_t pick = -1;
      i = 0;
#if defined(__AVX512F__)
      for (; i + 16 <= V; i += 16) {
        const float blk = _mm512_reduce_add_ps(_mm512_loadu_ps(w.data() + i));
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

inline uint16_t mul_bf16(uint16_t a, uint16_t b) { return f32_to_bf16(bf16_to_f32(a) * bf16_to_f32(b)); }

// Llama's apply_rotary_pos_emb (unsqueeze_dim 1) for one tensor x (B, H, T, D), cos/sin (B, T, D), with its bf16
// rounding steps: bf16(bf16(x * cos) + bf16(rotate_half(x) * sin)); rotate_half(x) = cat(-x[D/2:], x[:D/2]).
at::Tensor rotary_one(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
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
  for (const auto* t : {&q, &k, &cos, &sin})
    TORCH_CHECK(t->scalar_type() == at::kBFloat16 && t->stride(-1) == 1, "rotary: bf16 with unit stride on head_dim");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && cos.dim() == 3 && sin.dim() == 3 && q.size(3) % 2 == 0
              && cos.size(2) == q.size(3) && sin.sizes() == cos.sizes() && cos.size(1) == q.size(2)
              && k.size(2) == q.size(2) && k.size(3) == q.size(3), "rotary: shapes");
  return {rotary_one(q, cos, sin), rotary_one(k, cos, sin)};
}

// The gated MLP's activation: bf16(bf16(silu(gate)) * up); gate/up (..., I) may be strided views (one fused matmul)
at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.scalar_type() == at::kBFloat16 && up.scalar_type() == at::kBFloat16 && gate.sizes() == up.sizes()
              && gate.stride(-1) == 1 && up.stride(-1) == 1, "silu_mul: bf16 gate and up of one shape");
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

}  // namespace

TORCH_LIBRARY(hybridrl_cpu, m) {
  m.def("decode_attention(Tensor q, Tensor k, Tensor v, Tensor mask, float scale) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("sample_rows(Tensor logits, float inv_temperature, Tensor u) -> (Tensor, Tensor)");
  m.def("rotary(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)");
  m.def("silu_mul(Tensor gate, Tensor up) -> Tensor");
  m.def("write_decode(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k_new, Tensor v_new, Tensor pos) -> ()");
}
TORCH_LIBRARY_IMPL(hybridrl_cpu, CPU, m) {
  m.impl("decode_attention", decode_attention);
  m.impl("rms_norm", rms_norm);
  m.impl("write_decode", write_decode);
  m.impl("sample_rows", sample_rows);
  m.impl("rotary", rotary);
  m.impl("silu_mul", silu_mul);
}
