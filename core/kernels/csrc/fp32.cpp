// fp32 versions of the fused kernels, for CPUs without bf16 hardware (AVX2-only: the engine runs fp32 there).
// Written once on 8-lane GCC vectors (kernels.h: vf8, exp8), so the same code is AVX2 + FMA code under
// -march=x86-64-v3 and still vector code on an AVX-512 machine. The entry points in attention.cpp and
// elementwise.cpp send fp32 tensors here. Built with -ffp-contract=off: a * b + c stays two roundings, as
// torch's own kernels compute it, so the elementwise ones (rotary, the norm's products) round like torch.
#include "kernels.h"

namespace hybridrl {
namespace {

// One (sequence, kv head, query row): the G query heads that share the head against its T keys and values,
// read in place from the cache views (rows ks_t / vs_t floats apart). s: G x T scratch. D % 8 == 0.
void attend_f32(const float* q, int64_t qs_head, const float* k, int64_t ks_t, const float* v, int64_t vs_t,
                const float* m, int64_t G, int64_t T, int64_t D, float scale, float* s, float* out) {
  for (int64_t t = 0; t < T; ++t) {
    const float* kt = k + t * ks_t;
    if (m[t] < MASKED) {  // a masked key (left padding): not read
      for (int64_t g = 0; g < G; ++g) s[g * T + t] = -INFINITY;
      continue;
    }
    for (int64_t g = 0; g < G; ++g) {
      const float* qg = q + g * qs_head;
      vf8 a0 = vf8{}, a1 = vf8{};
      int64_t d = 0;
      for (; d + 16 <= D; d += 16) {
        a0 += vload(qg + d) * vload(kt + d);
        a1 += vload(qg + d + 8) * vload(kt + d + 8);
      }
      if (d < D) a0 += vload(qg + d) * vload(kt + d);
      s[g * T + t] = vsum(a0 + a1) * scale + m[t];
    }
  }
  for (int64_t g = 0; g < G; ++g) {  // softmax per head; a row whose keys are all masked attends to nothing
    float* sg = s + g * T;
    const float mx = *std::max_element(sg, sg + T);
    if (mx == -INFINITY) {
      std::fill(sg, sg + T, 0.f);
      continue;
    }
    vf8 sum = vf8{};  // the live keys' exponentials, 8 lanes wide in their order (kernels.h: batch invariance)
    live_chunks<8>(sg, T, [&](float* chunk) {
      const vf8 e = exp8(vload(chunk) - mx);
      vstore(chunk, e);
      sum += e;
    });
    const float inv = 1.f / vsum(sum);
    for (int64_t t = 0; t < T; ++t) sg[t] *= inv;
  }
  // values: 32 columns at a time for up to 4 heads, the accumulators in registers
  for (int64_t c0 = 0; c0 < D; c0 += 32) {
    const int64_t cw = std::min<int64_t>(32, D - c0) / 8;
    for (int64_t g0 = 0; g0 < G; g0 += 4) {
      const int64_t gb = std::min<int64_t>(4, G - g0);
      vf8 acc[4][4] = {};
      for (int64_t t = 0; t < T; ++t) {
        if (m[t] < MASKED) continue;  // weight 0 for every head: its value adds nothing (not read)
        vf8 vt[4];
        for (int64_t c = 0; c < cw; ++c) vt[c] = vload(v + t * vs_t + c0 + 8 * c);
        for (int64_t j = 0; j < gb; ++j) {
          const vf8 p = vsplat(s[(g0 + j) * T + t]);
          for (int64_t c = 0; c < cw; ++c) acc[j][c] += p * vt[c];
        }
      }
      for (int64_t j = 0; j < gb; ++j)
        for (int64_t c = 0; c < cw; ++c) vstore(out + (g0 + j) * D + c0 + 8 * c, acc[j][c]);
    }
  }
}

}  // namespace

at::Tensor decode_attention_f32(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                                double scale) {
  TORCH_CHECK(k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat, "decode_attention: fp32 q, k, v");
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), D = q.size(3), KVH = k.size(1), T = k.size(2), G = H / KVH;
  TORCH_CHECK(D % 8 == 0, "decode_attention: fp32 head_dim must be a multiple of 8, got ", D);
  auto out = at::empty({B, L, H, D}, q.options());
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float* mp = mask.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t ms_b = mask.size(0) == 1 ? 0 : mask.size(2) * T, ms_l = mask.size(2) == 1 ? 0 : T;
  at::parallel_for(0, B * KVH * L, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s(G * T);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / (KVH * L), kh = task / L % KVH, i = task % L;
      attend_f32(qp + b * q.stride(0) + kh * G * q.stride(1) + i * q.stride(2), q.stride(1),
                 kp + b * k.stride(0) + kh * k.stride(1), k.stride(2), vp + b * v.stride(0) + kh * v.stride(1),
                 v.stride(2), mp + b * ms_b + i * ms_l, G, T, D, static_cast<float>(scale), s.data(),
                 op + ((b * L + i) * H + kh * G) * D);
    }
  });
  return out;
}

// Llama's RMSNorm in fp32: w * (x * (1 / sqrt(mean(x^2) + eps))), the two products rounded as torch rounds them;
// the sum of squares in 16 partial sums (torch's order differs: the last bits of the mean may too)
at::Tensor rms_norm_f32(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(weight.scalar_type() == at::kFloat, "rms_norm: fp32 x with an fp32 weight");
  const auto xc = x.contiguous();
  auto out = at::empty_like(xc);
  const int64_t N = x.size(-1), rows = xc.numel() / std::max<int64_t>(N, 1);
  const float *xp = xc.data_ptr<float>(), *wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* xr = xp + r * N;
      float* o = op + r * N;
      vf8 a0 = vf8{}, a1 = vf8{};
      int64_t i = 0;
      for (; i + 16 <= N; i += 16) {
        const vf8 f0 = vload(xr + i), f1 = vload(xr + i + 8);
        a0 += f0 * f0;
        a1 += f1 * f1;
      }
      float ss = vsum(a0 + a1);
      for (; i < N; ++i) ss += xr[i] * xr[i];
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(N) + static_cast<float>(eps));
      for (i = 0; i + 8 <= N; i += 8) vstore(o + i, vload(wp + i) * (vload(xr + i) * inv));
      for (; i < N; ++i) o[i] = wp[i] * (xr[i] * inv);
    }
  });
  return out;
}

// apply_rotary_pos_emb in fp32 for x (B, H, T, D), cos/sin (B or 1, T, D): x * cos + rotate_half(x) * sin
at::Tensor rotary_one_f32(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3), half = D / 2;
  auto out = at::empty({B, H, T, D}, x.options());
  const float *xp = x.data_ptr<float>(), *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t cb = cos.size(0) == 1 ? 0 : cos.stride(0), sb = sin.size(0) == 1 ? 0 : sin.stride(0);
  at::parallel_for(0, B * H * T, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / (H * T), h = (r / T) % H, t = r % T;
      const float* xr = xp + b * x.stride(0) + h * x.stride(1) + t * x.stride(2);
      const float* c = cp + b * cb + t * cos.stride(1);
      const float* s = sp + b * sb + t * sin.stride(1);
      float* o = op + r * D;
      int64_t d = 0;
      if (half % 8 == 0)
        for (; d < half; d += 8) {  // both halves at once: rotate_half = cat(-x2, x1)
          const vf8 x1 = vload(xr + d), x2 = vload(xr + d + half);
          vstore(o + d, x1 * vload(c + d) + (-x2) * vload(s + d));
          vstore(o + d + half, x2 * vload(c + d + half) + x1 * vload(s + d + half));
        }
      for (; d < D; ++d) {
        const float rot = d < half ? -xr[d + half] : xr[d - half];
        o[d] = xr[d] * c[d] + rot * s[d];
      }
    }
  });
  return out;
}

// silu(gate) * up in fp32, gate/up rows strided (slices of one fused product): x / (1 + e^-x) by e^-|x| alone
at::Tensor silu_mul_f32(const at::Tensor& gate, const at::Tensor& up) {
  const int64_t I = gate.size(-1), rows = gate.numel() / std::max<int64_t>(I, 1);
  const auto g2 = gate.reshape({rows, I}), u2 = up.reshape({rows, I});
  auto out = at::empty(gate.sizes(), gate.options());
  const float *gp = g2.data_ptr<float>(), *upp = u2.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t gs = g2.stride(0), us = u2.stride(0);
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float *g = gp + r * gs, *u = upp + r * us;
      float* o = op + r * I;
      int64_t i = 0;
      for (; i + 8 <= I; i += 8) {
        const vf8 x = vload(g + i);
        const vf8 e = exp8(x < 0.f ? x : -x);                      // e^-|x|
        const vf8 sig = x < 0.f ? e / (1.f + e) : 1.f / (1.f + e);  // no overflow either way
        vstore(o + i, (x * sig) * vload(u + i));
      }
      for (; i < I; ++i) o[i] = (g[i] / (1.f + std::exp(-g[i]))) * u[i];
    }
  });
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// fp32 linear y = x W^T + b on weights packed once (core/rollout/packed.py), for AVX2 + FMA (x86-64-v3 and later).
// Layout: W (N, K), N rounded up to 16 with zero columns, in tiles of 16 output columns; the tile at column c0 is
// stored at c0 * K as [K][16]: for each k the tile's 16 weights side by side, two 8-lane loads. Kernel: 6 rows x
// 16 columns of accumulators (12 ymm) per block; per k, 2 weight loads, 6 broadcasts of x, 12 FMAs. Each thread
// owns a contiguous run of tiles; a tile (K x 64 bytes) is reused by every 6-row block of x, and the thread's
// next tile is prefetched into L2 spread over the blocks, as the bf16 kernel does. fp32 sums in another order than
// MKL's: within a few fp32 ulps of F.linear, not bit-identical.
namespace {
constexpr int64_t kTileF = kPackTileF32, kRowsF = 6, kChunkF = 192;

#if defined(__AVX2__) && defined(__FMA__)
// one row's 16 outputs (+ bias), the first `cols` of them stored
inline void store_row_f32(float* y, __m256 a0, __m256 a1, __m256 b0, __m256 b1, int64_t cols) {
  a0 = _mm256_add_ps(a0, b0);
  a1 = _mm256_add_ps(a1, b1);
  if (cols == 16) {
    _mm256_storeu_ps(y, a0);
    _mm256_storeu_ps(y + 8, a1);
    return;
  }
  alignas(32) float row[16];
  _mm256_store_ps(row, a0);
  _mm256_store_ps(row + 8, a1);
  std::memcpy(y, row, cols * sizeof(float));
}

template <int MR>
inline void block_f32(const float* x, int64_t K, const float* tile, float* y, int64_t N, int64_t cols,
                      const float* bias, const char* pf, int64_t pf_lines) {
  // the accumulators live in registers only if every index into them is a compile-time constant (fully unrolled
  // loops; no runtime-indexed epilogue): a runtime-indexed store made GCC spill all 12 of them on every k
  __m256 acc[MR][2];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  int64_t credit = 0;
  for (int64_t k = 0; k < K; ++k) {
    const __m256 w0 = _mm256_loadu_ps(tile + k * 16), w1 = _mm256_loadu_ps(tile + k * 16 + 8);
    for (credit += pf_lines; credit >= K; credit -= K, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * K + k);
      acc[r][0] = _mm256_fmadd_ps(a, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, w1, acc[r][1]);
    }
  }
  const __m256 b0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
  const __m256 b1 = bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) store_row_f32(y + r * N, acc[r][0], acc[r][1], b0, b1, cols);
}
#endif
}  // namespace

bool linear_f32_native() {
#if defined(__AVX2__) && defined(__FMA__)
  return true;
#else
  return false;
#endif
}

at::Tensor linear_packed_f32(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                             int64_t N) {
  TORCH_CHECK(packed.scalar_type() == at::kFloat, "linear_packed: fp32 x needs an fp32 packed weight");
  const LinearCall c = linear_call(x, packed, bias, N);
  const int64_t K = c.K, M = c.M, Np = c.Np;
  const float* b = c.b;
  auto y = c.y;
  const auto& xc = c.x;
  const float* X = xc.data_ptr<float>();
  const float* P = packed.data_ptr<float>();
  float* Y = y.data_ptr<float>();
  const int64_t tiles = Np / kTileF;
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t m0 = 0; m0 < M; m0 += kChunkF) {
      const int64_t m1 = std::min(M, m0 + kChunkF), blocks = (m1 - m0 + kRowsF - 1) / kRowsF;
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t c0 = t * kTileF, cols = std::min(kTileF, N - c0);
        const float* tile = P + c0 * K;
#if defined(__AVX2__) && defined(__FMA__)
        const int64_t next_lines = t + 1 < t1 ? (kTileF * K * 4 + 63) / 64 : 0;
        for (int64_t i = 0; i < blocks; ++i) {
          const int64_t m = m0 + i * kRowsF, mr = std::min(kRowsF, m1 - m);
          const int64_t lo = next_lines * i / blocks, hi = next_lines * (i + 1) / blocks;
          const char* pf = next_lines ? reinterpret_cast<const char*>(tile + kTileF * K) + lo * 64 : nullptr;
          const float* bt = b ? b + c0 : nullptr;
          float* yt = Y + m * N + c0;
          switch (mr) {
            case 6: block_f32<6>(X + m * K, K, tile, yt, N, cols, bt, pf, hi - lo); break;
            case 5: block_f32<5>(X + m * K, K, tile, yt, N, cols, bt, pf, hi - lo); break;
            case 4: block_f32<4>(X + m * K, K, tile, yt, N, cols, bt, pf, hi - lo); break;
            case 3: block_f32<3>(X + m * K, K, tile, yt, N, cols, bt, pf, hi - lo); break;
            case 2: block_f32<2>(X + m * K, K, tile, yt, N, cols, bt, pf, hi - lo); break;
            default: block_f32<1>(X + m * K, K, tile, yt, N, cols, bt, pf, hi - lo); break;
          }
        }
#else
        for (int64_t m = m0; m < m1; ++m)  // scalar: the same sums in k order, one output at a time
          for (int64_t j = 0; j < cols; ++j) {
            float s = 0.f;
            for (int64_t k = 0; k < K; ++k) s = std::fma(X[m * K + k], tile[k * kTileF + j], s);
            Y[m * N + c0 + j] = s + (b ? b[c0 + j] : 0.f);
          }
#endif
      }
    }
  });
  return y;
}

}  // namespace hybridrl
