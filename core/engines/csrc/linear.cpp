// bf16 linear y = x W^T + b on weights packed once for AVX512-BF16 dot products (see core/engines/packed.py).
//
// Layout: W (N, K) is split into tiles of up to 48 output columns (N rounded up to 16 with zero columns). A tile
// at column c0, width w, is stored at element offset c0 * K as [K/2][w][2]: for each pair of k, the w columns'
// two weights side by side, so one 64-byte load gives 16 columns' (k, k+1) pairs -- the operand vdpbf16ps wants.
//
// Kernel: 8 rows x 48 columns of fp32 accumulators (24 zmm) per block; per k pair, 3 weight loads, 8 broadcasts
// of x's (k, k+1) pair, 24 vdpbf16ps. Each thread owns a contiguous run of tiles (its weight stream is
// sequential); a tile is reused by every 8-row block of x (from L2) and, while it is used, the thread's next tile
// is prefetched into L2 spread evenly over the blocks -- a decode step's weights (270 MB for SmolLM2) do not fit
// in L3, and without the prefetch the matmuls wait on DRAM (64 rows: 26 ms -> 19 ms a step, oneDNN 26 ms).
// Rounding: fp32 sums (vdpbf16ps: no intermediate rounding of the products), plus the bias, rounded once to bf16
// (ties to even) -- as oneDNN and F.linear, up to the order of the fp32 additions.
#include "kernels.h"

namespace hybridrl {
namespace {

constexpr int64_t kTile = 48;   // output columns per tile (3 zmm of fp32)
constexpr int64_t kRows = 8;    // rows of x per register block
constexpr int64_t kChunk = 256; // rows of x per pass over the weights (its 8-row blocks stay in L2)

int64_t padded(int64_t n) { return (n + 15) / 16 * 16; }

#if defined(__AVX512BF16__)
template <int MR, int NB>
inline void block(const uint16_t* x, int64_t K, const uint16_t* tile, uint16_t* y, int64_t N, int64_t cols,
                  const float* bias, const char* pf, int64_t pf_lines) {
  __m512 acc[MR][NB];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_setzero_ps();
  int64_t credit = 0;  // Bresenham: pf_lines prefetches spread over the K/2 steps
  for (int64_t kp = 0; kp < K / 2; ++kp) {
    __m512bh w[NB];
    for (int j = 0; j < NB; ++j) w[j] = (__m512bh)_mm512_loadu_si512(tile + (kp * NB + j) * 32);
    for (credit += pf_lines; credit >= K / 2; credit -= K / 2, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
    for (int r = 0; r < MR; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * K + 2 * kp, 4);
      const __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
      for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], a, w[j]);
    }
  }
  for (int j = 0; j < NB && j * 16 < cols; ++j) {
    const __mmask16 m = cols - j * 16 >= 16 ? 0xffff : static_cast<__mmask16>((1u << (cols - j * 16)) - 1);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(m, bias + j * 16) : _mm512_setzero_ps();
    for (int r = 0; r < MR; ++r) {
      const __m512i v = _mm512_castps_si512(round_bf16(_mm512_add_ps(acc[r][j], b)));
      _mm256_mask_storeu_epi16(y + r * N + j * 16, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
    }
  }
}

template <int NB>
void rows(int64_t mr, const uint16_t* x, int64_t K, const uint16_t* tile, uint16_t* y, int64_t N, int64_t cols,
          const float* bias, const char* pf, int64_t pf_lines) {
  switch (mr) {
#define HYBRIDRL_ROWS(R) \
  case R: block<R, NB>(x, K, tile, y, N, cols, bias, pf, pf_lines); break;
    HYBRIDRL_ROWS(1) HYBRIDRL_ROWS(2) HYBRIDRL_ROWS(3) HYBRIDRL_ROWS(4)
    HYBRIDRL_ROWS(5) HYBRIDRL_ROWS(6) HYBRIDRL_ROWS(7) HYBRIDRL_ROWS(8)
#undef HYBRIDRL_ROWS
  }
}
#endif

}  // namespace

bool linear_native() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

at::Tensor pack_linear(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && (weight.scalar_type() == at::kBFloat16 || weight.scalar_type() == at::kFloat),
              "pack_linear: a 2-D bf16 or fp32 weight");
  if (weight.scalar_type() == at::kFloat) return pack_linear_f32(weight);
  TORCH_CHECK(weight.size(1) % 2 == 0, "pack_linear: in_features must be even, got ", weight.size(1));
  const int64_t N = weight.size(0), K = weight.size(1), Np = padded(N);
  const auto w = weight.contiguous();
  auto out = at::empty({Np * K}, weight.options());
  const auto* src = reinterpret_cast<const uint16_t*>(w.data_ptr());
  auto* dst = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, (Np + kTile - 1) / kTile, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t c0 = t * kTile, wd = std::min(kTile, Np - c0);
      // a (k, k+1) pair moves as one 32-bit word: the tile is the (wd x K/2) word matrix transposed
      uint32_t* tile = reinterpret_cast<uint32_t*>(dst + c0 * K);
      for (int64_t j = 0; j < wd; ++j) {
        if (c0 + j >= N) {
          for (int64_t kp = 0; kp < K / 2; ++kp) tile[kp * wd + j] = 0;
          continue;
        }
        const auto* row = reinterpret_cast<const uint32_t*>(src + (c0 + j) * K);
        for (int64_t kp = 0; kp < K / 2; ++kp) tile[kp * wd + j] = row[kp];
      }
    }
  });
  return out;
}

at::Tensor linear_packed(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                         int64_t N) {
  if (x.scalar_type() == at::kFloat) return linear_packed_f32(x, packed, bias, N);
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16, "linear_packed: bf16 or fp32");
  const LinearCall c = linear_call(x, packed, bias, N);
  const int64_t K = c.K, M = c.M, Np = c.Np;
  const float* b = c.b;
  auto y = c.y;
  const auto& xc = c.x;
  const auto* X = reinterpret_cast<const uint16_t*>(xc.data_ptr());
  const auto* P = reinterpret_cast<const uint16_t*>(packed.data_ptr());
  auto* Y = reinterpret_cast<uint16_t*>(y.data_ptr());
  const int64_t tiles = (Np + kTile - 1) / kTile;
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t m0 = 0; m0 < M; m0 += kChunk) {
      const int64_t m1 = std::min(M, m0 + kChunk), blocks = (m1 - m0 + kRows - 1) / kRows;
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t c0 = t * kTile, wd = std::min(kTile, Np - c0), cols = std::min(kTile, N - c0);
        const uint16_t* tile = P + c0 * K;
#if defined(__AVX512BF16__)
        // the next tile of this thread, prefetched in `blocks` equal parts
        const int64_t next_lines = t + 1 < t1 ? (std::min(kTile, Np - c0 - kTile) * K * 2 + 63) / 64 : 0;
        for (int64_t i = 0; i < blocks; ++i) {
          const int64_t m = m0 + i * kRows, mr = std::min(kRows, m1 - m);
          const int64_t lo = next_lines * i / blocks, hi = next_lines * (i + 1) / blocks;
          const char* pf = next_lines ? reinterpret_cast<const char*>(P + (c0 + kTile) * K) + lo * 64 : nullptr;
          const float* bt = b ? b + c0 : nullptr;
          if (wd == 48) rows<3>(mr, X + m * K, K, tile, Y + m * N + c0, N, cols, bt, pf, hi - lo);
          else if (wd == 32) rows<2>(mr, X + m * K, K, tile, Y + m * N + c0, N, cols, bt, pf, hi - lo);
          else rows<1>(mr, X + m * K, K, tile, Y + m * N + c0, N, cols, bt, pf, hi - lo);
        }
#else
        for (int64_t m = m0; m < m1; ++m)  // scalar: the same fp32 sums, one output at a time
          for (int64_t j = 0; j < cols; ++j) {
            float s = 0.f;
            for (int64_t kp = 0; kp < K / 2; ++kp)
              s += bf16_to_f32(X[m * K + 2 * kp]) * bf16_to_f32(tile[(kp * wd + j) * 2]) +
                   bf16_to_f32(X[m * K + 2 * kp + 1]) * bf16_to_f32(tile[(kp * wd + j) * 2 + 1]);
            Y[m * N + c0 + j] = f32_to_bf16(s + (b ? b[c0 + j] : 0.f));
          }
#endif
      }
    }
  });
  return y;
}

}  // namespace hybridrl
