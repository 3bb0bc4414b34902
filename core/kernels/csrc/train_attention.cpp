// Attention for the bf16 training passes, forward and backward, on AVX512-BF16 (see core/train/train_attention.py).
//
// One job = one (batch row, KV head): its G query heads' rows stacked (M = G q rows of D), its T keys and values.
// Everything a job touches stays in per-thread buffers (~1.5 MB for M = 384, T = 278, D = 64): the scores never go
// to memory as a tensor, unlike the matmul path, and the products are large register-blocked bf16 GEMMs with fp32
// sums (vdpbf16ps), unlike PyTorch's CPU flash kernel (whose bf16 backward ran at ~60 GFLOP/s here).
//
// Precision, as flash attention's: scores, softmax, dP = dO V^T and dS in fp32; P and dS rounded to bf16 as the
// operands of P V, P^T dO, dS K and dS^T Q; every product summed in fp32; outputs rounded once to bf16.
// Backward recomputes P from the saved log-sum-exp (no M x T tensor kept between the passes).
#include "kernels.h"

namespace hybridrl {
namespace {

#if defined(__AVX512BF16__)
// C (M x N, fp32, ldc) = A (M x K bf16 row-major, lda; K even) x B (K x N in pairs: B[k/2][n][2], N % 16 == 0).
// Register blocks of up to 4 rows x 4 vectors of 16 columns.
template <int RB, int NB>
inline void gemm_block(const uint16_t* A, int64_t lda, const uint16_t* B, int64_t N, int64_t K, float* C,
                       int64_t ldc) {
  __m512 acc[RB][NB];
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < NB; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 2) {
    __m512bh b[NB];
    for (int c = 0; c < NB; ++c) b[c] = (__m512bh)_mm512_loadu_si512(B + (k / 2) * N * 2 + 32 * c);
    for (int r = 0; r < RB; ++r) {
      uint32_t pair;
      std::memcpy(&pair, A + r * lda + k, 4);
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
      for (int c = 0; c < NB; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], a, b[c]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int c = 0; c < NB; ++c) _mm512_storeu_ps(C + r * ldc + 16 * c, acc[r][c]);
}

template <int RB>
inline void gemm_rows(const uint16_t* A, int64_t lda, const uint16_t* B, int64_t N, int64_t K, float* C, int64_t ldc) {
  int64_t n = 0;
  for (; n + 64 <= N; n += 64) gemm_block<RB, 4>(A, lda, B + 2 * n, N, K, C + n, ldc);
  for (; n < N; n += 16) gemm_block<RB, 1>(A, lda, B + 2 * n, N, K, C + n, ldc);
}

void gemm(const uint16_t* A, int64_t lda, const uint16_t* B, int64_t M, int64_t N, int64_t K, float* C, int64_t ldc) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) gemm_rows<4>(A + m * lda, lda, B, N, K, C + m * ldc, ldc);
  for (; m < M; ++m) gemm_rows<1>(A + m * lda, lda, B, N, K, C + m * ldc, ldc);
}

// src rows (R x C, lds) -> pairs over rows: dst[r/2][c][2] for r < Rp (even; rows >= R are zeros), c < Cp (>= C:
// zeros). As a GEMM's B it is the R x C matrix src; with src = K (T x D) that is B = K for dS K.
void pairs_over_rows(const uint16_t* src, int64_t lds, int64_t R, int64_t C, int64_t Rp, int64_t Cp, uint16_t* dst) {
  for (int64_t r = 0; r < Rp; r += 2)
    for (int64_t c = 0; c < Cp; ++c) {
      dst[(r / 2) * Cp * 2 + 2 * c] = (r < R && c < C) ? src[r * lds + c] : 0;
      dst[(r / 2) * Cp * 2 + 2 * c + 1] = (r + 1 < R && c < C) ? src[(r + 1) * lds + c] : 0;
    }
}

// src rows (R x C, lds) -> its transpose in pairs: dst[c/2][r][2] = src[r][c] (C even, r < Rp, zero beyond R).
// As a GEMM's B it is src^T (C x R): with src = K (T x D), B = K^T for Q K^T.
void pairs_transposed(const uint16_t* src, int64_t lds, int64_t R, int64_t C, int64_t Rp, uint16_t* dst) {
  for (int64_t c = 0; c < C; c += 2)
    for (int64_t r = 0; r < Rp; ++r) {
      const bool in = r < R;
      dst[(c / 2) * Rp * 2 + 2 * r] = in ? src[r * lds + c] : 0;
      dst[(c / 2) * Rp * 2 + 2 * r + 1] = in ? src[r * lds + c + 1] : 0;
    }
}

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

struct Shapes {
  int64_t B, H, KVH, G, q, T, D, M, Tp, Mp;
  Shapes(const at::Tensor& query, const at::Tensor& key) {
    B = query.size(0), H = query.size(1), q = query.size(2), D = query.size(3);
    KVH = key.size(1), T = key.size(2), G = H / KVH, M = G * q;
    Tp = round_up(T, 32), Mp = round_up(M, 2);
  }
};

// Which keys query i of batch row b sees, 16 at a time from key t: mask (Bm, q, T) uint8 (Bm 1 or B), or empty =
// causal (the last q of the T positions). Keys >= T are never visible.
struct Visible {
  const uint8_t* m = nullptr;
  int64_t bstride = 0, q = 0, T = 0;
  Visible(const at::Tensor& mask, int64_t q_, int64_t T_) : q(q_), T(T_) {
    if (mask.numel()) m = mask.data_ptr<uint8_t>(), bstride = mask.size(0) == 1 ? 0 : q * T;
  }
  __mmask16 operator()(int64_t b, int64_t i, int64_t t) const {
    const __mmask16 in = T - t >= 16 ? 0xffff : T - t <= 0 ? 0 : (__mmask16)((1u << (T - t)) - 1);
    if (!m) {
      const int64_t last = T - q + i;  // keys t .. last
      return last < t ? 0 : last - t >= 15 ? in : (__mmask16)(in & ((1u << (last - t + 1)) - 1));
    }
    return _mm_mask_cmpneq_epi8_mask(in, _mm_maskz_loadu_epi8(in, m + b * bstride + i * T + t), _mm_setzero_si128());
  }
};

// Scores of one job scaled, masked and turned into probabilities P = exp(s - lse) in place (M x Tp fp32, zeros where
// masked and beyond T). With ``lse_in`` (backward) the saved log-sum-exp is used; else it is computed into ``lse_out``.
void probabilities(float* S, const Shapes& s, const Visible& vis, int64_t b, double scale, const float* lse_in,
                   float* lse_out) {
  const __m512 sc = _mm512_set1_ps(static_cast<float>(scale)), ninf = _mm512_set1_ps(-INFINITY);
  for (int64_t r = 0; r < s.M; ++r) {
    float* row = S + r * s.Tp;
    const int64_t i = r % s.q;
    for (int64_t t = 0; t < s.Tp; t += 16)
      _mm512_storeu_ps(row + t, _mm512_mask_mul_ps(ninf, vis(b, i, t), _mm512_loadu_ps(row + t), sc));
    float lse;
    if (lse_in) {
      lse = lse_in[r];
    } else {
      __m512 mx = ninf;
      for (int64_t t = 0; t < s.Tp; t += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(row + t));
      const float row_max = _mm512_reduce_max_ps(mx);
      if (row_max == -INFINITY) {  // no visible key (a padding query): no weight anywhere, output 0, gradient 0
        lse = INFINITY;
      } else {
        __m512 sum = _mm512_setzero_ps();
        const __m512 mv = _mm512_set1_ps(row_max);
        for (int64_t t = 0; t < s.Tp; t += 16) sum = _mm512_add_ps(sum, exp512(_mm512_sub_ps(_mm512_loadu_ps(row + t), mv)));
        lse = row_max + std::log(_mm512_reduce_add_ps(sum));
      }
      lse_out[r] = lse;
    }
    const __m512 lv = _mm512_set1_ps(lse);
    for (int64_t t = 0; t < s.Tp; t += 16)
      _mm512_storeu_ps(row + t, exp512(_mm512_min_ps(_mm512_sub_ps(_mm512_loadu_ps(row + t), lv), _mm512_setzero_ps())));
  }
}

// The job's query-head rows of a (B, q, H, D) tensor (the layout attention outputs take) as M x D rows, or back.
void gather_rows(const uint16_t* x, const Shapes& s, int64_t b, int64_t kvh, uint16_t* rows) {
  for (int64_t g = 0; g < s.G; ++g)
    for (int64_t i = 0; i < s.q; ++i)
      std::memcpy(rows + (g * s.q + i) * s.D, x + ((b * s.q + i) * s.H + kvh * s.G + g) * s.D, 2 * s.D);
}
#endif

}  // namespace

#if defined(__AVX512BF16__)
std::tuple<at::Tensor, at::Tensor> train_attention_fwd(const at::Tensor& query, const at::Tensor& key,
                                                       const at::Tensor& value, const at::Tensor& mask, double scale) {
  const Shapes s(query, key);
  TORCH_CHECK(query.scalar_type() == at::kBFloat16 && query.is_contiguous() && key.is_contiguous() &&
                  value.is_contiguous() && s.D % 32 == 0 && s.H % s.KVH == 0,
              "train_attention_fwd: contiguous bf16 (B, H, q, D) / (B, KVH, T, D), D % 32 == 0");
  auto out = at::empty({s.B, s.q, s.H, s.D}, query.options());
  auto lse = at::empty({s.B, s.H, s.q}, query.options().dtype(at::kFloat));
  const Visible vis(mask, s.q, s.T);
  const auto* Q = reinterpret_cast<const uint16_t*>(query.data_ptr());
  const auto* K = reinterpret_cast<const uint16_t*>(key.data_ptr());
  const auto* V = reinterpret_cast<const uint16_t*>(value.data_ptr());
  auto* O = reinterpret_cast<uint16_t*>(out.data_ptr());
  float* L = lse.data_ptr<float>();
  at::parallel_for(0, s.B * s.KVH, 1, [&](int64_t j0, int64_t j1) {
    std::vector<float> S(s.M * s.Tp), Of(s.M * s.D);
    std::vector<uint16_t> Kt(s.D * s.Tp), Vp(s.Tp * s.D), P(s.M * s.Tp);
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t b = j / s.KVH, kvh = j % s.KVH;
      const uint16_t* Kj = K + j * s.T * s.D;
      const uint16_t* Vj = V + j * s.T * s.D;
      pairs_transposed(Kj, s.D, s.T, s.D, s.Tp, Kt.data());
      gemm(Q + (b * s.H + kvh * s.G) * s.q * s.D, s.D, Kt.data(), s.M, s.Tp, s.D, S.data(), s.Tp);  // Q K^T
      probabilities(S.data(), s, vis, b, scale, nullptr, L + (b * s.H + kvh * s.G) * s.q);
      cast_bf16(S.data(), P.data(), s.M * s.Tp);
      pairs_over_rows(Vj, s.D, s.T, s.D, s.Tp, s.D, Vp.data());
      gemm(P.data(), s.Tp, Vp.data(), s.M, s.D, s.Tp, Of.data(), s.D);                                // P V
      for (int64_t g = 0; g < s.G; ++g)
        for (int64_t i = 0; i < s.q; ++i)
          cast_bf16(Of.data() + (g * s.q + i) * s.D, O + ((b * s.q + i) * s.H + kvh * s.G + g) * s.D, s.D);
    }
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> train_attention_bwd(const at::Tensor& grad_out, const at::Tensor& query,
                                                                   const at::Tensor& key, const at::Tensor& value,
                                                                   const at::Tensor& out, const at::Tensor& lse,
                                                                   const at::Tensor& mask, double scale) {
  const Shapes s(query, key);
  TORCH_CHECK(grad_out.scalar_type() == at::kBFloat16 && grad_out.is_contiguous() && out.is_contiguous(),
              "train_attention_bwd: contiguous bf16 grad_out and out (B, q, H, D)");
  auto dq = at::empty_like(query), dk = at::empty_like(key), dv = at::empty_like(value);
  const Visible vis(mask, s.q, s.T);
  const auto* Q = reinterpret_cast<const uint16_t*>(query.data_ptr());
  const auto* K = reinterpret_cast<const uint16_t*>(key.data_ptr());
  const auto* V = reinterpret_cast<const uint16_t*>(value.data_ptr());
  const auto* O = reinterpret_cast<const uint16_t*>(out.data_ptr());
  const auto* dO = reinterpret_cast<const uint16_t*>(grad_out.data_ptr());
  auto* dQ = reinterpret_cast<uint16_t*>(dq.data_ptr());
  auto* dK = reinterpret_cast<uint16_t*>(dk.data_ptr());
  auto* dV = reinterpret_cast<uint16_t*>(dv.data_ptr());
  const float* L = lse.data_ptr<float>();
  at::parallel_for(0, s.B * s.KVH, 1, [&](int64_t j0, int64_t j1) {
    std::vector<float> P(s.M * s.Tp), dP(s.M * s.Tp), Di(s.M), acc(std::max(s.M, s.D) * std::max(s.Tp, s.D));
    std::vector<uint16_t> Kt(s.D * s.Tp), Vt(s.D * s.Tp), Kp(s.Tp * s.D), dOr(s.M * s.D), Or(s.M * s.D),
        dOt(s.D * s.Mp), Qt(s.D * s.Mp), Pp(s.Mp * s.Tp), dSb(s.M * s.Tp), dSp(s.Mp * s.Tp), Pb(s.M * s.Tp);
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t b = j / s.KVH, kvh = j % s.KVH;
      const uint16_t* Kj = K + j * s.T * s.D;
      const uint16_t* Vj = V + j * s.T * s.D;
      const uint16_t* Qj = Q + (b * s.H + kvh * s.G) * s.q * s.D;
      // P again, from the saved log-sum-exp
      pairs_transposed(Kj, s.D, s.T, s.D, s.Tp, Kt.data());
      gemm(Qj, s.D, Kt.data(), s.M, s.Tp, s.D, P.data(), s.Tp);
      probabilities(P.data(), s, vis, b, scale, L + (b * s.H + kvh * s.G) * s.q, nullptr);
      // dP = dO V^T; Di = rowsum(dO * O); dS = P (dP - Di)
      gather_rows(dO, s, b, kvh, dOr.data());
      gather_rows(O, s, b, kvh, Or.data());
      pairs_transposed(Vj, s.D, s.T, s.D, s.Tp, Vt.data());
      gemm(dOr.data(), s.D, Vt.data(), s.M, s.Tp, s.D, dP.data(), s.Tp);
      for (int64_t r = 0; r < s.M; ++r) {
        float d = 0.f;
        for (int64_t c = 0; c < s.D; ++c) d += bf16_to_f32(dOr[r * s.D + c]) * bf16_to_f32(Or[r * s.D + c]);
        const __m512 dv_ = _mm512_set1_ps(d);
        for (int64_t t = 0; t < s.Tp; t += 16) {
          const __m512 p = _mm512_loadu_ps(&P[r * s.Tp + t]);
          _mm512_storeu_ps(&dP[r * s.Tp + t], _mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(&dP[r * s.Tp + t]), dv_)));
        }
      }
      cast_bf16(P.data(), Pb.data(), s.M * s.Tp);
      cast_bf16(dP.data(), dSb.data(), s.M * s.Tp);
      // dV = P^T dO and dK = scale dS^T Q, computed transposed (D x T): B = P or dS in pairs over rows
      pairs_over_rows(Pb.data(), s.Tp, s.M, s.Tp, s.Mp, s.Tp, Pp.data());
      pairs_over_rows(dSb.data(), s.Tp, s.M, s.Tp, s.Mp, s.Tp, dSp.data());
      for (int64_t c = 0; c < s.D; ++c)
        for (int64_t r = 0; r < s.Mp; ++r) {
          dOt[c * s.Mp + r] = r < s.M ? dOr[r * s.D + c] : 0;
          Qt[c * s.Mp + r] = r < s.M ? Qj[r * s.D + c] : 0;
        }
      gemm(dOt.data(), s.Mp, Pp.data(), s.D, s.Tp, s.Mp, acc.data(), s.Tp);
      for (int64_t t = 0; t < s.T; ++t)
        for (int64_t c = 0; c < s.D; ++c) dV[(j * s.T + t) * s.D + c] = f32_to_bf16(acc[c * s.Tp + t]);
      gemm(Qt.data(), s.Mp, dSp.data(), s.D, s.Tp, s.Mp, acc.data(), s.Tp);
      for (int64_t t = 0; t < s.T; ++t)
        for (int64_t c = 0; c < s.D; ++c)
          dK[(j * s.T + t) * s.D + c] = f32_to_bf16(static_cast<float>(scale) * acc[c * s.Tp + t]);
      // dQ = scale dS K
      pairs_over_rows(Kj, s.D, s.T, s.D, s.Tp, s.D, Kp.data());
      gemm(dSb.data(), s.Tp, Kp.data(), s.M, s.D, s.Tp, acc.data(), s.D);
      uint16_t* dQj = dQ + (b * s.H + kvh * s.G) * s.q * s.D;
      for (int64_t r = 0; r < s.M * s.D; ++r) dQj[r] = f32_to_bf16(static_cast<float>(scale) * acc[r]);
    }
  });
  return {dq, dk, dv};
}
#else
std::tuple<at::Tensor, at::Tensor> train_attention_fwd(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                       const at::Tensor&, double) {
  TORCH_CHECK(false, "train_attention_fwd: built without AVX512-BF16");
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> train_attention_bwd(const at::Tensor&, const at::Tensor&,
                                                                   const at::Tensor&, const at::Tensor&,
                                                                   const at::Tensor&, const at::Tensor&,
                                                                   const at::Tensor&, double) {
  TORCH_CHECK(false, "train_attention_bwd: built without AVX512-BF16");
}
#endif

}  // namespace hybridrl
