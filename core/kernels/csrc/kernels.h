// Shared by the fused CPU kernels (core/kernels/cpu.py builds every .cpp here):
// bf16 <-> fp32 conversions with bf16's rounding, AVX-512 helpers, and the ops' declarations.
#pragma once
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace hybridrl {

// Output columns per tile of the fp32 packed-weight layout: fp32.cpp's kernel reads it, linear.cpp's packing writes it
constexpr int64_t kPackTileF32 = 16;

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

// The instruction set this build's vector paths use (tests assert each kernel's contract for the path taken).
inline const char* kernel_isa() {
#if defined(__AVX512BF16__)
  return "avx512_bf16";
#elif defined(__AVX512F__)
  return "avx512";
#elif defined(__AVX2__)
  return "avx2";
#else
  return "scalar";
#endif
}

// fp32 -> bf16, round to nearest even, any NaN -> 0x7fc0: c10::BFloat16's conversion, 16 lanes at a time where
// AVX512-BF16 is built. Two vector forms: vcvtneps2bf16 (the default), which flushes subnormal inputs to zero --
// harmless for activations and probabilities -- and, with `exact` (weights: a sync must give torch's cast bit for
// bit), the integer rounding in 16 lanes, which keeps them (testing each vector for a subnormal instead cost the
// weight sync ~30% here)
#if defined(__AVX512BF16__)
template <bool exact = false>
inline __m256i bf16x16(__m512 x) {
  __m256i b;
  if constexpr (exact) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    b = _mm512_cvtepi32_epi16(
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16));
  } else {
    b = (__m256i)_mm512_cvtneps_pbh(x);
  }
  return _mm256_mask_blend_epi16(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), b, _mm256_set1_epi16(0x7fc0));
}
#endif

template <bool exact = false>
inline void cast_bf16(const float* in, uint16_t* out, int64_t count) {
  int64_t i = 0;
#if defined(__AVX512BF16__)
  for (; i + 16 <= count; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bf16x16<exact>(_mm512_loadu_ps(in + i)));
#endif
  for (; i < count; ++i) out[i] = f32_to_bf16(in[i]);
}

// Sum of 16 values pairwise (8 + 8, 4 + 4, ...): the scalar paths' stand-in for a 16-lane reduction
inline float sum16(const float* v) {
  float a[8];
  for (int i = 0; i < 8; ++i) a[i] = v[i] + v[i + 8];
  for (int i = 0; i < 4; ++i) a[i] += a[i + 4];
  return (a[0] + a[2]) + (a[1] + a[3]);
}

// 8 fp32 lanes as a GCC vector: one ymm under -march=x86-64-v3 (AVX2 + FMA), two xmm on older targets, a ymm
// (or half a zmm) on AVX-512 -- the fp32 kernels (fp32.cpp) are written once on it for every x86-64 CPU.
typedef float vf8 __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));
inline vf8 vload(const float* p) { vf8 v; std::memcpy(&v, p, 32); return v; }
inline void vstore(float* p, vf8 v) { std::memcpy(p, &v, 32); }
inline vf8 vsplat(float x) { return vf8{} + x; }
inline float vsum(vf8 v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }
inline float vmax(vf8 v) {
  float m = v[0];
  for (int i = 1; i < 8; ++i) m = std::max(m, v[i]);
  return m;
}
// An additive mask value below this marks a masked key (the engine's masks hold the dtype's min, or -inf): the
// decode attention scores it -inf, never loads its value, and does not read the keys of a 16-key block that is
// all masked (a left-padded prompt's padding). Its weight after the softmax is exactly 0 either way (exp of anything
// below -87 is 0 below), so this changes no bit of a row that sees any key; a row that sees none gets zeros (with a
// dtype-min mask it used to average the values, as SDPA does: only prefill padding queries, whose outputs no real
// token reads).
constexpr float MASKED = -1e30f;

// e^x for x <= 0 as exp512 below (2^n * a degree-6 polynomial on [-0.5, 0.5] ln 2), exactly 0 below -87 and for -inf
// A softmax row's live scores (s[t] > -inf; masked ones set to 0) W at a time in their order, the last chunk padded
// with -inf (exactly 0 after exp8 / exp512): f(chunk) replaces a chunk by its exponentials, written back to their
// places. A query's sum then depends on its live keys only -- not on masked keys before, among or after them (left
// padding, a shared prefix's gap, a longer neighbour's tail): a sequence decodes alike in any batch.
template <int W, class F>
inline void live_chunks(float* s, int64_t T, F&& f) {
  float chunk[W];
  int64_t at[W], n = 0;
  for (int64_t t = 0; t <= T; ++t) {
    if (t < T && s[t] == -INFINITY) {
      s[t] = 0.f;
      continue;
    }
    if (t < T) {
      at[n] = t;
      chunk[n++] = s[t];
    }
    if (n == W || (t == T && n > 0)) {
      for (int64_t j = n; j < W; ++j) chunk[j] = -INFINITY;
      f(chunk);
      for (int64_t j = 0; j < n; ++j) s[at[j]] = chunk[j];
      n = 0;
    }
  }
}

inline vf8 exp8(vf8 x) {
  const vi8 live = x >= -87.f;
  x = x < -87.f ? vsplat(-87.f) : x;
  const vf8 t = x * 1.44269504088896341f;
  const vf8 n = (t + 12582912.f) - 12582912.f;  // round to nearest (|t| < 2^22): 1.5 * 2^23 pushes the fraction out
  const vf8 f = (t - n) * 0.693147180559945309f;
  vf8 p = vsplat(1.f / 720);
  p = p * f + 1.f / 120;
  p = p * f + 1.f / 24;
  p = p * f + 1.f / 6;
  p = p * f + 0.5f;
  p = p * f + 1.f;
  p = p * f + 1.f;
  const vi8 two_n = (__builtin_convertvector(n, vi8) + 127) << 23;
  return (vf8)((vi8)(p * (vf8)two_n) & live);
}

#if defined(__AVX512F__)
inline __m512 load_bf16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
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

#endif  // __AVX512F__

// linear_packed's common part (bf16 and fp32): x contiguous, the output (..., N) allocated, the packed weight's size
// checked against N rounded up to 16 (both layouts pad columns to 16), the bias as fp32 zero-padded to that width
struct LinearCall {
  at::Tensor x, y, bias;
  const float* b = nullptr;
  int64_t K = 0, M = 0, Np = 0;
};
inline LinearCall linear_call(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                              int64_t N) {
  LinearCall c;
  c.K = x.size(-1), c.Np = (N + 15) / 16 * 16, c.M = c.K ? x.numel() / c.K : 0;
  TORCH_CHECK(packed.numel() == c.Np * c.K, "linear_packed: packed weight has ", packed.numel(), " values, expected ",
              c.Np * c.K, " for (", N, ", ", c.K, ")");
  c.x = x.contiguous();
  auto sizes = x.sizes().vec();
  sizes.back() = N;
  c.y = at::empty(sizes, x.options());
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == N, "linear_packed: bias has ", bias->numel(), " values, expected ", N);
    c.bias = at::zeros({c.Np}, x.options().dtype(at::kFloat));  // 16-wide loads past N read zeros
    c.bias.narrow(0, 0, N).copy_(*bias);
    c.b = c.bias.data_ptr<float>();
  }
  return c;
}

// fp32.cpp: the fp32 versions the entry points below dispatch to
at::Tensor decode_attention_f32(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                                double scale);
at::Tensor rms_norm_f32(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor rotary_one_f32(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor silu_mul_f32(const at::Tensor& gate, const at::Tensor& up);
bool linear_f32_native();
at::Tensor linear_packed_f32(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                             int64_t N);

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            double scale);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor> rotary(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                          const at::Tensor& sin);
at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up);
void write_decode(at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& k_new, const at::Tensor& v_new,
                  const at::Tensor& pos);
bool linear_native();
at::Tensor pack_linear(const at::Tensor& weight);
void pack_linear_into(at::Tensor& packed, const at::Tensor& weight, int64_t row0, int64_t rows);
void load_linear_rows(at::Tensor& packed, const std::optional<at::Tensor>& param, const at::Tensor& src, int64_t row0,
                      int64_t rows);
at::Tensor unpack_linear(const at::Tensor& packed, int64_t row0, int64_t rows, int64_t N, int64_t K);
at::Tensor linear_packed(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                         int64_t N);
std::tuple<at::Tensor, at::Tensor> train_attention_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       const at::Tensor& mask, double scale);
std::tuple<at::Tensor, at::Tensor, at::Tensor> train_attention_bwd(const at::Tensor& grad_out, const at::Tensor& q,
                                                                   const at::Tensor& k, const at::Tensor& v,
                                                                   const at::Tensor& out, const at::Tensor& lse,
                                                                   const at::Tensor& mask, double scale);
std::tuple<at::Tensor, at::Tensor> sample_rows(const at::Tensor& logits, double inv_temperature, const at::Tensor& u);
at::Tensor token_logprobs(const at::Tensor& logits, double inv_temperature, const at::Tensor& ids);
void head_fold(const at::Tensor& logits, int64_t v0, at::Tensor peak, at::Tensor total, at::Tensor moment,
               bool with_moment, const at::Tensor& row_ptr, const at::Tensor& tok, at::Tensor picked,
               double temperature);
void head_grad(const at::Tensor& logits, int64_t v0, const at::Tensor& logz_t, const at::Tensor& g_pos,
               const at::Tensor& g_ent, const at::Tensor& mean_t, bool with_ent, const at::Tensor& row_ptr,
               const at::Tensor& tok, const at::Tensor& val, at::Tensor out, double temperature);

}  // namespace hybridrl
