// The integer q8_0 kernels of decode attention (attention_kernel.h) against
// scalar emulations of their contracts, bit for bit: the scores of the AVX2,
// AVX-VNNI and AVX512-VNNI kernels and the P.V of the AVX-VNNI and
// AVX512-VNNI ones, each skipped with the reason where the CPU lacks its
// instructions; and the prefetch walk those kernels step. Whole decode
// attention, on every path, is checked against the fp64 reference in
// attention_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "longctx/core/dtype.h"
#include "longctx/kvstore/kv_store.h"
#include "../../cpu/src/attention_kernel.h"
#include "test_seed.h"

namespace longctx::cpu {
namespace {

// The integer q8_0 score kernels (AVX2: vpmaddubsw; AVX-VNNI and AVX512-VNNI:
// vpdpbusd)
// against a scalar emulation of their contract (attention_kernel.h): per
// group of 32 channels the exact integer sum of the code products, then
// acc = fma(sum, k_scale * q_scale, acc) in f32. Bit for bit, over head_dim
// 32-512, 1-8 query heads, partial tiles, codes at +-127 and offsets into
// the page.
using Q8ScoreKernel = void (*)(const detail::PieceArgs&, const int8_t*, const uint16_t*, int, float*, int,
                              detail::LinePrefetch&);

void expect_q8_scores_match_their_contract(Q8ScoreKernel kernel, int max_n) {
  std::mt19937 rng(test_seed(77));
  std::uniform_int_distribution<int> code(-127, 127), extreme(0, 9);
  std::uniform_real_distribution<float> magnitude(0.001f, 3.f);
  for (const int dim : {32, 64, 96, 128, 256, 512}) {
    for (const int g : {1, 2, 3, 4, 5, 8}) {
      for (const int n : {1, 7, 8, 9, 31, 64, max_n}) {
        if (n > max_n) continue;
        const int block_size = 128 + 16, t = block_size - n - int(rng() % 8);  // n tokens from offset t
        const int groups = dim / 32;
        // 0 or +-127 one time in ten: the ends of the codes' range.
        const auto draw = [&] {
          const int e = extreme(rng);
          return int8_t(e == 0 ? 127 : e == 1 ? -127 : e == 2 ? 0 : code(rng));
        };
        std::vector<int8_t> k(size_t(dim) * block_size), q(size_t(g) * dim);
        for (auto& x : k) x = draw();
        for (auto& x : q) x = draw();
        std::vector<float> k_scale_f(size_t(groups) * block_size), q_scales(size_t(g) * groups);
        for (auto& x : k_scale_f) x = magnitude(rng);
        for (auto& x : q_scales) x = magnitude(rng);
        std::vector<uint16_t> k_scales(k_scale_f.size());
        convert(k_scale_f.data(), DType::kF32, k_scales.data(), DType::kF16, k_scales.size());
        convert(k_scales.data(), DType::kF16, k_scale_f.data(), DType::kF32, k_scales.size());  // as stored
        std::vector<int32_t> q_sums(size_t(g) * groups, 0);
        for (int i = 0; i < g; ++i)
          for (int c = 0; c < dim; ++c) q_sums[size_t(i) * groups + size_t(c / 32)] += q[size_t(i) * dim + c];
        detail::PieceArgs args;
        args.q_codes = q.data(), args.q_scales = q_scales.data(), args.q_code_sums = q_sums.data();
        args.g = g, args.head_dim = dim, args.block_size = block_size, args.kv_type = DType::kQ8_0;
        const int stride = 160;
        std::vector<float> scores(size_t(g) * stride, -7.f);
        detail::LinePrefetch no_prefetch;
        kernel(args, k.data() + kvstore::q8_key_code_offset(block_size, 0, t), k_scales.data() + t, n,
               scores.data(), stride, no_prefetch);
        for (int i = 0; i < g; ++i) {
          for (int j = 0; j < stride; ++j) {
            const float got = scores[size_t(i) * stride + size_t(j)];
            if (j >= n) {
              ASSERT_EQ(got, -7.f) << "wrote past its n = " << n << " tokens: head " << i << ", slot " << j;
              continue;
            }
            float expected = 0.f;
            for (int grp = 0; grp < groups; ++grp) {
              int32_t sum = 0;
              for (int c = 32 * grp; c < 32 * (grp + 1); ++c)
                sum += int32_t(q[size_t(i) * dim + c]) * k[kvstore::q8_key_code_offset(block_size, c, t + j)];
              const float scale =
                k_scale_f[size_t(grp) * block_size + size_t(t + j)] * q_scales[size_t(i) * groups + grp];
              expected = std::fma(float(sum), scale, expected);
            }
            ASSERT_EQ(got, expected) << "head_dim " << dim << ", " << g << " heads, n " << n << ": head " << i
                                     << ", token " << j;
          }
        }
      }
    }
  }
}

TEST(Q8DecodeKernels, Q8ScoresOnAvx2MatchTheirContractBitForBit) {
  if (!detail::has_q8_avx2_kernels()) GTEST_SKIP() << "no AVX2/FMA/F16C here";
  expect_q8_scores_match_their_contract(detail::score_q8_avx2, 128);
}

TEST(Q8DecodeKernels, Q8ScoresOnAvxVnniMatchTheirContractBitForBit) {
  if (!detail::has_q8_avx_vnni_kernels()) GTEST_SKIP() << "no AVX-VNNI here";
  expect_q8_scores_match_their_contract(detail::score_q8_avx_vnni, 128);
}

TEST(Q8DecodeKernels, Q8ScoresOnAvx512VnniMatchTheirContractBitForBit) {
  if (!detail::has_q8_vnni_kernels()) GTEST_SKIP() << "no AVX512-VNNI here";
  expect_q8_scores_match_their_contract(detail::score_q8_avx512_vnni, detail::kQ8VnniTokens);
}

// The integer q8_0 P.V kernels (AVX-VNNI and AVX512-VNNI: vpdpbusd) against
// a scalar emulation of their contract (attention_kernel.h): per head and
// group of 32 channels, the weights p * v_scale as 16-bit codes against
// their max, the exact integer sums of code * v, then
// acc = fma(sum, max / 65535, acc) in f32. Bit for bit, over head_dim 32-512,
// 1-8 query heads, 1-128 tokens after a lead of 0-3 in their first quad,
// codes at +-127 and -128 in the quads' slots that are not the chunk's, and
// groups whose scales are all 0.
using Q8AccumulateKernel = void (*)(const detail::PieceArgs&, const float*, int, int, int, const int8_t*,
                                   const uint16_t*, float*, detail::LinePrefetch&);

void expect_q8_pv_matches_its_contract(Q8AccumulateKernel kernel) {
  std::mt19937 rng(test_seed(78));
  std::uniform_int_distribution<int> code(-127, 127), extreme(0, 9);
  std::uniform_real_distribution<float> magnitude(0.001f, 3.f), weight(0.f, 1.f);
  for (const int dim : {32, 64, 96, 128, 256, 512}) {
    for (const int g : {1, 2, 3, 4, 5, 8}) {
      for (const int n : {1, 3, 7, 8, 9, 31, 64, 125, 128}) {
        const int lead = int(rng() % 4), groups = dim / 32, quads = (lead + n + 3) / 4, p_stride = 136;
        std::vector<int8_t> v(size_t(quads) * dim * 4);
        for (size_t k = 0; k < v.size(); ++k) {
          const int slot = int(k % 4) + 4 * int(k / (size_t(dim) * 4));
          const bool ours = slot >= lead && slot < lead + n;
          const int e = extreme(rng);
          v[k] = int8_t(!ours && e < 3 ? -128 : e == 0 ? 127 : e == 1 ? -127 : e == 2 ? 0 : code(rng));
        }
        std::vector<float> scale_f(size_t(n) * groups);
        const int zero_group = int(rng() % (2 * groups));  // a group with all scales 0, half the time
        for (size_t k = 0; k < scale_f.size(); ++k) scale_f[k] = int(k % groups) == zero_group ? 0.f : magnitude(rng);
        std::vector<uint16_t> v_scales(scale_f.size());
        convert(scale_f.data(), DType::kF32, v_scales.data(), DType::kF16, v_scales.size());
        convert(v_scales.data(), DType::kF16, scale_f.data(), DType::kF32, v_scales.size());  // as stored
        std::vector<float> p(size_t(g) * p_stride, -5.f);  // -5: not a weight the kernel may read
        for (int i = 0; i < g; ++i) {
          for (int j = 0; j < n; ++j) p[size_t(i) * p_stride + j] = weight(rng);
          p[size_t(i) * p_stride + rng() % n] = 1.f;  // the max's token
        }
        std::vector<float> acc(size_t(g) * dim + 8);
        for (auto& x : acc) x = magnitude(rng) - 1.5f;
        std::vector<float> expected = acc;
        for (int i = 0; i < g; ++i) {
          for (int grp = 0; grp < groups; ++grp) {
            std::vector<float> w(static_cast<size_t>(n));
            float max = 0.f;
            for (int j = 0; j < n; ++j) {
              w[j] = p[size_t(i) * p_stride + j] * scale_f[size_t(j) * groups + grp];
              max = std::max(max, w[j]);
            }
            const float inverse = max > 0.f ? 65535.f / max : 0.f;
            std::vector<int64_t> w_codes(static_cast<size_t>(n));
            for (int j = 0; j < n; ++j) w_codes[j] = std::min<int64_t>(std::lrint(w[j] * inverse), 65535);
            for (int c = 32 * grp; c < 32 * (grp + 1); ++c) {
              int64_t sum = 0;
              for (int j = 0; j < n; ++j) sum += w_codes[j] * v[kvstore::q8_value_code_offset(dim, c, lead + j)];
              float& out = expected[size_t(i) * dim + c];
              out = std::fma(float(sum), max / 65535.f, out);
            }
          }
        }
        detail::PieceArgs args;
        args.g = g, args.head_dim = dim, args.kv_type = DType::kQ8_0;
        detail::LinePrefetch no_prefetch;
        kernel(args, p.data(), p_stride, n, lead, v.data(), v_scales.data(), acc.data(), no_prefetch);
        for (size_t k = 0; k < acc.size(); ++k) {
          ASSERT_EQ(acc[k], expected[k]) << "head_dim " << dim << ", " << g << " heads, n " << n << ", lead " << lead
                                         << ": head " << k / dim << ", channel " << k % dim
                                         << (k >= size_t(g) * dim ? " (past the rows)" : "");
        }
      }
    }
  }
}

TEST(Q8DecodeKernels, Q8PvOnAvxVnniMatchesItsContractBitForBit) {
  if (!detail::has_q8_avx_vnni_kernels()) GTEST_SKIP() << "no AVX-VNNI here";
  expect_q8_pv_matches_its_contract(detail::accumulate_q8_avx_vnni);
}

TEST(Q8DecodeKernels, Q8PvOnAvx512VnniMatchesItsContractBitForBit) {
  if (!detail::has_q8_vnni_kernels()) GTEST_SKIP() << "no AVX512-VNNI here";
  expect_q8_pv_matches_its_contract(detail::accumulate_q8_avx512_vnni);
}

// prefetch_step counts its lines before it issues them; the walk must stand
// where a line-by-line walk would (64 bytes of credit per line, up to the
// line that holds end - 1), over random step sizes, spans and alignments.
TEST(Q8DecodeKernels, PrefetchWalkStepsAsALineByLineWalk) {
  std::mt19937 rng(test_seed(91));
  std::vector<char> buffer(16384);
  for (int trial = 0; trial < 500; ++trial) {
    const size_t begin = rng() % 128, span = rng() % 8192;
    detail::LinePrefetch walk{buffer.data() + begin, buffer.data() + begin + span, 0};
    detail::LinePrefetch expected = walk;
    for (int step = 0; step < 64; ++step) {
      const size_t bytes = rng() % 400;
      detail::prefetch_step(walk, bytes);
      for (expected.credit += bytes; expected.credit >= 64 && expected.at < expected.end;
           expected.credit -= 64, expected.at += 64) {
      }
      ASSERT_EQ(walk.at - buffer.data(), expected.at - buffer.data()) << "trial " << trial << ", step " << step;
      ASSERT_EQ(walk.credit, expected.credit) << "trial " << trial << ", step " << step;
    }
  }
}

}  // namespace
}  // namespace longctx::cpu
