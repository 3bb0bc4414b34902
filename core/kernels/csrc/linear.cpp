// bf16 linear y = x W^T + b on weights packed once for AVX512-BF16 dot products (see core/rollout/packed.py).
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
//
// Without AVX512-BF16 (`emulated`): the same layout and the same sums in vdpbf16ps's documented order -- per k pair
// the odd product, then the even one, each added to the fp32 sum (a bf16 x bf16 product is exact in fp32, so each
// addition is the only rounding) -- on 16-lane GCC vectors (zmm on AVX-512, ymm pairs on AVX2): a row's outputs are
// the same numbers whatever the batch, as on the native path. Subnormals aside (vdpbf16ps flushes them; this keeps
// them), the two paths give the same bits.
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
#else
// 16 fp32 / int32 lanes as GCC vectors (one zmm on AVX-512, two ymm on AVX2)
typedef float vf16 __attribute__((vector_size(64)));
typedef uint32_t vu16 __attribute__((vector_size(64)));
#if defined(__AVX512F__)
constexpr int64_t kRowsEmulated = 8;  // 8 rows x 48 columns of sums: 24 of the 32 zmm
constexpr int kColsEmulated = 3;      // 16-column groups per block: a whole tile
#else
constexpr int64_t kRowsEmulated = 6;  // 6 rows x 16 columns of sums: 12 of AVX2's 16 ymm
constexpr int kColsEmulated = 1;
#endif

// block<MR, NB> without vdpbf16ps, over NB of the tile's `groups` 16-column groups (from the tile's column 16 g0):
// the odd, then the even product of each k pair added to the fp32 sums
template <int MR, int NB>
inline void emulated_block(const uint16_t* x, int64_t K, const uint16_t* tile, int64_t groups, int64_t g0, uint16_t* y,
                           int64_t N, int64_t cols, const float* bias) {
  vf16 acc[MR][NB] = {};
  const vu16 high = vu16{} + 0xffff0000u;
  for (int64_t kp = 0; kp < K / 2; ++kp) {
    vf16 even[NB], odd[NB];
    for (int j = 0; j < NB; ++j) {
      vu16 w;
      std::memcpy(&w, tile + (kp * groups + g0 + j) * 32, 64);
      even[j] = (vf16)(w << 16);
      odd[j] = (vf16)(w & high);
    }
    for (int r = 0; r < MR; ++r) {
      const float x_even = bf16_to_f32(x[r * K + 2 * kp]), x_odd = bf16_to_f32(x[r * K + 2 * kp + 1]);
      for (int j = 0; j < NB; ++j) {
        acc[r][j] = acc[r][j] + x_odd * odd[j];
        acc[r][j] = acc[r][j] + x_even * even[j];
      }
    }
  }
  const int64_t c0 = 16 * g0, n = std::min<int64_t>(16 * NB, cols - c0);
  for (int r = 0; r < MR; ++r)
    for (int64_t c = 0; c < n; ++c)
      y[r * N + c0 + c] = f32_to_bf16(acc[r][c / 16][c % 16] + (bias ? bias[c0 + c] : 0.f));
}

// rows [0, mr) of x against a tile of `groups` 16-column groups
template <int NB>
void emulated_rows(int64_t mr, const uint16_t* x, int64_t K, const uint16_t* tile, int64_t groups, uint16_t* y,
                   int64_t N, int64_t cols, const float* bias) {
  for (int64_t g0 = 0; g0 < groups && 16 * g0 < cols; g0 += NB) switch (mr) {
#define HYBRIDRL_ROWS(R) \
  case R: if constexpr (R <= kRowsEmulated) emulated_block<R, NB>(x, K, tile, groups, g0, y, N, cols, bias); break;
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

namespace {
#if defined(__AVX2__)
// r[i] <- column i of the 8 x 8 matrix of 32-bit words whose row i was r[i] (bit patterns moved, not read as floats):
// unpack pairs of rows, shuffle quadruples, swap 128-bit halves
inline void transpose8(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int h = 0; h < 8; h += 4) {
    r[h] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
    t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
  }
  for (int i = 0; i < 8; ++i) r[i] = t[i];
}
#endif

#if defined(__AVX512BF16__)
// 16 fp32 -> 8 words of bf16 pairs, rounded exactly as f32_to_bf16 (subnormals kept: a weight as torch casts it)
inline __m256 bf16_words(const float* p) { return _mm256_castsi256_ps(bf16x16<true>(_mm512_loadu_ps(p))); }
#endif

// Rows [row0, row0 + n) of an (N, K) weight into the packed layout of the whole weight: tiles of `tile` columns over
// N rounded up to 16, tile t at word offset t * tile * KW holding [KW][wd][1 word] (KW words per row: a bf16 (k, k+1)
// pair per 32-bit word, or one fp32) -- a transpose of each tile's (wd x KW) word matrix, done in 8 x 8 blocks where
// AVX2 is built (the remainders word by word). Padding columns are not written: zero from pack_linear.
struct RowPack {
  uint32_t* dst;
  const uint32_t* src;  // the n rows, KW words each
  int64_t row0, n, N, KW, tile;

  int64_t first_tile() const { return row0 / tile; }
  int64_t end_tile() const { return (row0 + n - 1) / tile + 1; }
  // the rows of tile t that are among the n: [r0, r0 + rows)
  std::pair<int64_t, int64_t> rows_of(int64_t t) const {
    const int64_t c0 = t * tile, r0 = std::max(row0, c0);
    return {r0, std::min(row0 + n, c0 + std::min(tile, padded(N) - c0)) - r0};
  }
  void tile_at(int64_t t) const { tile_from(t, src + (rows_of(t).first - row0) * KW); }
  // tile t's rows from `in` (its first row, KW words a row)
  void tile_from(int64_t t, const uint32_t* in) const {
    tile_by(t, [&](int64_t q, int64_t kw) { return in[q * KW + kw]; }
#if defined(__AVX2__)
            , [&](int64_t q, int64_t kw) { return _mm256_loadu_ps(reinterpret_cast<const float*>(in + q * KW + kw)); }
#endif
    );
  }
  // tile t's rows from fp32 rows `in` (its first row, 2 KW floats a row), cast to bf16 pairs on the way (exactly as
  // torch casts them): the rows are read once and no bf16 copy of them is written anywhere
  void tile_cast_from(int64_t t, const float* in) const {
    const int64_t K = 2 * KW;
    auto word = [&](int64_t q, int64_t kw) {
      return static_cast<uint32_t>(f32_to_bf16(in[q * K + 2 * kw])) |
             static_cast<uint32_t>(f32_to_bf16(in[q * K + 2 * kw + 1])) << 16;
    };
#if defined(__AVX512BF16__)
    tile_by(t, word, [&](int64_t q, int64_t kw) { return bf16_words(in + q * K + 2 * kw); });
#elif defined(__AVX2__)
    tile_by(t, word, [&](int64_t q, int64_t kw) {
      alignas(32) uint32_t w[8];
      for (int i = 0; i < 8; ++i) w[i] = word(q, kw + i);
      return _mm256_load_ps(reinterpret_cast<const float*>(w));
    });
#else
    tile_by(t, word);
#endif
  }
  // tile t's rows into its [KW][wd] words: word kw of the tile's row q (counted from its first row) is word(q, kw);
  // with AVX2, eight(q, kw) gives words kw..kw+7 as a ymm, and 8 x 8 blocks are transposed in registers
  template <class Word, class... Eight>
  void tile_by(int64_t t, Word word, Eight... eight) const {
    const int64_t c0 = t * tile, wd = std::min(tile, padded(N) - c0);
    const auto [r0, rows] = rows_of(t);
    uint32_t* out = dst + c0 * KW + (r0 - c0);
    int64_t k8 = 0, r8 = 0;
#if defined(__AVX2__)
    if constexpr (sizeof...(Eight) == 1) {
      auto load = [&](int64_t q, int64_t kw) { return (eight(q, kw), ...); };
      k8 = KW / 8 * 8, r8 = rows / 8 * 8;
      int64_t r = 0;
      // 16 rows at a time: 8 whole 64-byte lines of the tile per 8 words, stored past the caches (write-allocating
      // the packed weight's lines made a sync ~1.5x a plain copy; streamed, the same as one)
      if (reinterpret_cast<uintptr_t>(out) % 64 == 0)
        for (; r < rows / 16 * 16; r += 16)
          for (int64_t kw = 0; kw < k8; kw += 8) {
            __m256 a[8], b[8];
            for (int i = 0; i < 8; ++i) a[i] = load(r + i, kw), b[i] = load(r + 8 + i, kw);
            transpose8(a);
            transpose8(b);
            for (int i = 0; i < 8; ++i) {
              float* o = reinterpret_cast<float*>(out + (kw + i) * wd + r);
              _mm256_stream_ps(o, a[i]);
              _mm256_stream_ps(o + 8, b[i]);
            }
          }
      for (; r < r8; r += 8)
        for (int64_t kw = 0; kw < k8; kw += 8) {
          __m256 a[8];
          for (int i = 0; i < 8; ++i) a[i] = load(r + i, kw);
          transpose8(a);
          for (int i = 0; i < 8; ++i) _mm256_storeu_ps(reinterpret_cast<float*>(out + (kw + i) * wd + r), a[i]);
        }
      _mm_sfence();  // the streamed stores ordered before whatever reads the weight next, on any thread
    }
#endif
    for (int64_t kw = 0; kw < k8; ++kw)  // the rows past the last whole block of 8
      for (int64_t q = r8; q < rows; ++q) out[kw * wd + q] = word(q, kw);
    for (int64_t kw = k8; kw < KW; ++kw)  // the words past the last whole block of 8 (all of them without AVX2)
      for (int64_t q = 0; q < rows; ++q) out[kw * wd + q] = word(q, kw);
  }
};

// Rows [row0, row0 + n) of an (N, K) weight of the packed weight's dtype, read from `src` (n x K, or nullptr when
// each tile's rows are handed to tile_from)
RowPack row_pack(at::Tensor& packed, int64_t n, int64_t K, const void* src, int64_t row0, int64_t N, const char* op) {
  const bool f32 = packed.scalar_type() == at::kFloat;
  TORCH_CHECK(packed.dim() == 1 && (f32 || packed.scalar_type() == at::kBFloat16) && packed.is_contiguous(), op,
              ": a packed bf16 or fp32 weight");
  TORCH_CHECK(f32 || K % 2 == 0, op, ": in_features must be even, got ", K);
  TORCH_CHECK(row0 >= 0 && row0 + n <= N && packed.numel() == padded(N) * K, op, ": rows ", row0, "..", row0 + n,
              " of ", N, " x ", K, " do not fit a packed weight of ", packed.numel(), " elements");
  return {reinterpret_cast<uint32_t*>(packed.data_ptr()), static_cast<const uint32_t*>(src), row0, n, N,
          f32 ? K : K / 2, f32 ? kPackTileF32 : kTile};
}

RowPack row_pack(at::Tensor& packed, const at::Tensor& weight, int64_t row0, int64_t N, const char* op) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == packed.scalar_type() && weight.is_contiguous(), op,
              ": a contiguous 2-D weight of the packed weight's dtype");
  return row_pack(packed, weight.size(0), weight.size(1), weight.data_ptr(), row0, N, op);
}

}  // namespace

at::Tensor pack_linear(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && (weight.scalar_type() == at::kBFloat16 || weight.scalar_type() == at::kFloat),
              "pack_linear: a 2-D bf16 or fp32 weight");
  TORCH_CHECK(weight.scalar_type() == at::kFloat || weight.size(1) % 2 == 0,
              "pack_linear: in_features must be even, got ", weight.size(1));
  // padding columns (N rounded up to 16) must read zero; with none, every value is written below: no zero-fill
  const bool pad = weight.size(0) % 16 != 0;
  auto out = pad ? at::zeros({padded(weight.size(0)) * weight.size(1)}, weight.options())
                 : at::empty({weight.size(0) * weight.size(1)}, weight.options());
  if (weight.size(0) > 0) pack_linear_into(out, weight, 0, weight.size(0));
  return out;
}

void pack_linear_into(at::Tensor& packed, const at::Tensor& weight, int64_t row0, int64_t N) {
  const auto w = weight.contiguous();
  const RowPack rp = row_pack(packed, w, row0, N, "pack_linear_into");
  if (rp.n == 0) return;
  at::parallel_for(rp.first_tile(), rp.end_tile(), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) rp.tile_at(t);
  });
}

void load_linear_rows(at::Tensor& packed, const std::optional<at::Tensor>& param, const at::Tensor& src, int64_t row0,
                      int64_t N) {
  if (param) {  // the weight kept in the model too (e.g. tied to the embedding): each tile's rows written into it
    auto p = *param;  // (cast or copied) and packed from it while they are in cache
    TORCH_CHECK(p.sizes() == src.sizes(), "load_linear_rows: the engine's weight is ", p.sizes(), ", sent ", src.sizes());
    const bool cast = p.scalar_type() == at::kBFloat16 && src.scalar_type() == at::kFloat;
    if (!(cast || p.scalar_type() == src.scalar_type()) || !p.is_contiguous()) {
      p.copy_(src);  // another cast: torch's, then the rows packed from the parameter
      pack_linear_into(packed, p, row0, N);
      return;
    }
    const RowPack rp = row_pack(packed, p, row0, N, "load_linear_rows");
    if (rp.n == 0) return;
    const auto s = src.contiguous();
    const auto* in = static_cast<const char*>(s.data_ptr());
    auto* out = static_cast<char*>(p.data_ptr());
    const int64_t K = p.size(1), in_row = K * s.element_size(), out_row = K * p.element_size();
    at::parallel_for(rp.first_tile(), rp.end_tile(), 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const auto [r0, rows] = rp.rows_of(t);
        const char* from = in + (r0 - row0) * in_row;
        char* to = out + (r0 - row0) * out_row;
        if (cast)
          cast_bf16<true>(reinterpret_cast<const float*>(from), reinterpret_cast<uint16_t*>(to), rows * K);
        else
          std::memcpy(to, from, rows * out_row);
        rp.tile_at(t);
      }
    });
    return;
  }
  // the packed copy is the engine's only copy: rows of its dtype packed straight from `src`, fp32 rows into bf16 cast
  // in registers on the way (tile_cast_from)
  const bool cast = packed.scalar_type() == at::kBFloat16 && src.scalar_type() == at::kFloat;
  const auto s = cast ? src.contiguous() : src.to(packed.scalar_type()).contiguous();
  TORCH_CHECK(s.dim() == 2, "load_linear_rows: a 2-D weight, got ", s.sizes());
  const RowPack rp = row_pack(packed, s.size(0), s.size(1), cast ? nullptr : s.data_ptr(), row0, N, "load_linear_rows");
  if (rp.n == 0) return;
  const int64_t K = s.size(1);
  const auto* in = static_cast<const float*>(s.data_ptr());
  at::parallel_for(rp.first_tile(), rp.end_tile(), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      cast ? rp.tile_cast_from(t, in + (rp.rows_of(t).first - row0) * K) : rp.tile_at(t);
  });
}

at::Tensor unpack_linear(const at::Tensor& packed, int64_t row0, int64_t n, int64_t N, int64_t K) {
  TORCH_CHECK(n >= 0, "unpack_linear: ", n, " rows");
  auto packed_ = packed;  // row_pack's checks and layout; nothing is written
  const RowPack rp = row_pack(packed_, n, K, nullptr, row0, N, "unpack_linear");
  const int64_t KW = rp.KW, tile = rp.tile;
  auto out = at::empty({n, K}, packed.options());
  const auto* P = reinterpret_cast<const uint32_t*>(packed.data_ptr());
  auto* O = reinterpret_cast<uint32_t*>(out.data_ptr());
  at::parallel_for(row0, row0 + n, 16, [&](int64_t a, int64_t b) {
    for (int64_t r = a; r < b; ++r) {  // row r sits in tile r / tile at column (r % tile) of [KW][wd]
      const int64_t c0 = r / tile * tile, wd = std::min(tile, padded(N) - c0);
      for (int64_t kw = 0; kw < KW; ++kw) O[(r - row0) * KW + kw] = P[c0 * KW + kw * wd + (r - c0)];
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
        for (int64_t m = m0; m < m1; m += kRowsEmulated) {
          const int64_t mr = std::min(kRowsEmulated, m1 - m);
          const float* bt = b ? b + c0 : nullptr;
          const int64_t groups = wd / 16;
          if constexpr (kColsEmulated == 1) {
            emulated_rows<1>(mr, X + m * K, K, tile, groups, Y + m * N + c0, N, cols, bt);
          } else {
            if (groups == 1) emulated_rows<1>(mr, X + m * K, K, tile, groups, Y + m * N + c0, N, cols, bt);
            else if (groups == 2) emulated_rows<2>(mr, X + m * K, K, tile, groups, Y + m * N + c0, N, cols, bt);
            else emulated_rows<3>(mr, X + m * K, K, tile, groups, Y + m * N + c0, N, cols, bt);
          }
        }
#endif
      }
    }
  });
  return y;
}

}  // namespace hybridrl
