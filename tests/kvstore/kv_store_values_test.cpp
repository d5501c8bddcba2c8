// The values a KV store holds and refuses: q8_0 codes and scales against the
// plain reference (kv_reference.h), hard groups and every lane on every
// Highway target, and the NaN, Inf and overflowing values each store type
// refuses, naming where, with nothing changed.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "error_message.h"
#include "hwy_target.h"
#include "kv_reference.h"
#include "../../kvstore/src/block_page.h"
#include "longctx/core/error.h"
#include "test_seed.h"

namespace longctx::kvstore {
namespace {

using namespace testref;
using RT = RepresentativeType;
using longctx::testing::ForcedHighwayTarget;

// What a q8_0 store holds, against the plain reference (kv_reference.h), and
// against the values appended: within half a scale each (the rounding of
// nearbyint), the scale within f16 rounding of max|x| / 127.
TEST(KVStore, Q8HoldsTheReferenceCodesAndDequantizesWithinHalfAScale) {
  std::mt19937 rng(test_seed(81));
  for (int head_dim : {32, 64, 128, 256}) {
    for (DType src : {DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(str_cat("head_dim ", head_dim, " from ", dtype_name(src)));
      TestStore ts = make_store({1, 2, head_dim}, small_config(16, DType::kQ8_0, RT::kQuest, 2, 100));
      const Input k = random_input(rng, 75, 2, head_dim, src, true);
      const Input v = random_input(rng, 75, 2, head_dim, src, false);
      RefLayer ref;
      for (int64_t t0 : {0, 1, 17, 40}) {  // partial blocks, odd chunks
        const int64_t t1 = t0 == 40 ? 75 : t0 == 0 ? 1 : t0 == 1 ? 17 : 40;
        ts.store->append(0, slice_tokens(k.view, t0, t1), slice_tokens(v.view, t0, t1));
        ref_append(ref, k, v, t0, t1, nullptr, DType::kQ8_0);
        ASSERT_TRUE(layer_matches(*ts.store, 0, ref));
      }
      const StoreLayout& L = ts.store->layout();
      std::vector<float> keys(size_t(head_dim) * 16), values(size_t(16) * head_dim);
      for (int h = 0; h < 2; ++h) {
        for (int64_t b = 0; b < ts.store->n_blocks(0); ++b) {
          const BlockView view = ts.store->block(0, h, b);
          read_keys_t(L, view, 0, view.n_filled, keys.data(), 16);
          read_values(L, view, 0, view.n_filled, values.data(), size_t(head_dim));
          for (int t = 0; t < view.n_filled; ++t) {
            const int64_t pos = b * 16 + t;
            for (int c0 = 0; c0 < head_dim; c0 += kQ8Group) {
              for (const bool is_key : {true, false}) {
                double amax = 0;
                for (int c = c0; c < c0 + kQ8Group; ++c)
                  amax = std::max(amax, std::fabs(double((is_key ? k : v).at(pos, h, c))));
                const double scale = amax / 127 * (1 + std::ldexp(1.0, -11)) + std::ldexp(1.0, -25);
                for (int c = c0; c < c0 + kQ8Group; ++c) {
                  const double x = (is_key ? k : v).at(pos, h, c);
                  const double got = is_key ? keys[size_t(c) * 16 + size_t(t)] : values[size_t(t) * head_dim + size_t(c)];
                  ASSERT_LE(std::fabs(got - x), 0.5 * scale + std::fabs(x) * std::ldexp(1.0, -11))
                      << (is_key ? "key" : "value") << " position " << pos << " head " << h << " channel " << c;
                }
              }
            }
          }
        }
      }
    }
  }
}

// A value a q8_0 store cannot hold (NaN, +-Inf, or so large that its group's
// scale overflows f16) is refused naming the layer, kv head, position and
// channel, and nothing changes.
TEST(KVStore, Q8RefusesValuesItCannotHoldAndStaysUnchanged) {
  TestStore ts = make_store({2, 3, 64}, small_config(16, DType::kQ8_0, RT::kQuest, 2, 100));
  KVStore& s = *ts.store;
  std::mt19937 rng(test_seed(5));
  const Input k = random_input(rng, 30, 3, 64, DType::kF32, false);
  const Input v = random_input(rng, 30, 3, 64, DType::kF32, false);
  s.append(1, slice_tokens(k.view, 0, 20), slice_tokens(v.view, 0, 20));
  const StoreBytes before = store_bytes(s);
  struct Bad {
    bool value;
    int64_t t;
    int head, channel;
    float x;
    const char* shown;
  };
  const Bad cases[] = {{false, 3, 2, 5, std::numeric_limits<float>::quiet_NaN(), "nan"},
                       {true, 0, 0, 63, std::numeric_limits<float>::infinity(), "inf"},
                       {false, 9, 1, 32, -std::numeric_limits<float>::infinity(), "-inf"},
                       {true, 7, 2, 40, 9e6f, "9e+06"}};
  for (const Bad& bad : cases) {
    SCOPED_TRACE(bad.shown);
    std::vector<float> kk(k.values.begin() + 20 * 3 * 64, k.values.end());
    std::vector<float> vv(v.values.begin() + 20 * 3 * 64, v.values.end());
    (bad.value ? vv : kk)[(size_t(bad.t) * 3 + size_t(bad.head)) * 64 + size_t(bad.channel)] = bad.x;
    expect_error([&] {
      s.append(1, make_view(kk.data(), DType::kF32, {10, 3, 64}), make_view(vv.data(), DType::kF32, {10, 3, 64}));
    }, ErrorCode::kInvalidArgument,
                 {"layer 1", str_cat(bad.value ? "value" : "key", " of kv head ", bad.head),
                  str_cat("position ", 20 + bad.t), str_cat("channel ", bad.channel), bad.shown});
    EXPECT_TRUE(before == store_bytes(s));
  }
  // 8e6 fits: its group's scale 8e6 / 127 is a finite f16.
  std::vector<float> kk(k.values.begin() + 20 * 3 * 64, k.values.end());
  kk[5] = 8e6f;
  s.append(1, make_view(kk.data(), DType::kF32, {10, 3, 64}),
           slice_tokens(v.view, 20, 30));
  EXPECT_EQ(s.n_tokens(1), 30);
}

// Groups that are hard to quantize, on every Highway target (the quantizer
// is vectorized): x / s exactly halfway between two codes (ties go to even),
// the f32 neighbours of those, scales that are f16 subnormals or round to 0,
// all zeros, and magnitudes up to the largest a q8_0 store holds. The store
// must hold the reference's codes and scales (kv_reference.h).
TEST(KVStore, Q8QuantizesHardGroupsAsTheReferenceOnEveryHighwayTarget) {
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    const ForcedHighwayTarget forced(target);
    std::mt19937 rng(test_seed(23));
    for (int head_dim : {32, 96, 256}) {
      SCOPED_TRACE(str_cat("head_dim ", head_dim));
      TestStore ts = make_store({1, 2, head_dim}, small_config(16, DType::kQ8_0, RT::kQuest, 2, 100));
      Input k = random_input(rng, 40, 2, head_dim, DType::kF32, false);
      Input v = random_input(rng, 40, 2, head_dim, DType::kF32, false);
      const float s = 0.0625f;  // the scale of 127 * s, exact in f16
      for (Input* in : {&k, &v}) {
        for (size_t g = 0; g < in->values.size() / kQ8Group; ++g) {
          float* x = in->values.data() + g * kQ8Group;
          for (int i = 0; i < kQ8Group; ++i) {
            const float tie = (float(int(rng() % 254) - 127) + 0.5f) * s;
            const float sign = rng() % 2 ? 1.f : -1.f;
            switch (g % 6) {
              case 0: x[i] = i == 0 ? 127 * s : tie; break;
              case 1: x[i] = i == 0 ? -127 * s : std::nextafter(tie, rng() % 2 ? 1e9f : -1e9f); break;
              case 2: x[i] = sign * float(rng() % 1000) * 1e-12f; break;                  // the scale rounds to 0
              case 3: x[i] = sign * float(rng() % 1000) * std::ldexp(1.f, -27); break;   // an f16 subnormal scale
              case 4: x[i] = 0.f; break;
              default: x[i] = sign * float(rng() % 8000001); break;                      // up to 8e6
            }
          }
        }
        std::memcpy(in->buffer.data(), in->values.data(), in->values.size() * sizeof(float));
      }
      RefLayer ref;
      for (const auto& [t0, t1] : {std::pair<int64_t, int64_t>{0, 1}, {1, 21}, {21, 40}}) {
        ts.store->append(0, slice_tokens(k.view, t0, t1), slice_tokens(v.view, t0, t1));
        ref_append(ref, k, v, t0, t1, nullptr, DType::kQ8_0);
        ASSERT_TRUE(layer_matches(*ts.store, 0, ref));
      }
    }
  }
}

// The vectorized check finds a value the store cannot hold in any lane of a
// row, on every Highway target, and refuses the append.
TEST(KVStore, Q8RefusesUnstorableValuesInEveryLaneOnEveryHighwayTarget) {
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    const ForcedHighwayTarget forced(target);
    TestStore ts = make_store({1, 1, 64}, small_config(16, DType::kQ8_0, RT::kQuest, 2, 100));
    std::mt19937 rng(test_seed(6));
    const Input k = random_input(rng, 1, 1, 64, DType::kF32, false);
    for (int channel = 0; channel < 64; ++channel) {
      for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity(), 9e6f}) {
        std::vector<float> row(k.values);
        row[size_t(channel)] = bad;
        const TensorView view = make_view(row.data(), DType::kF32, {1, 1, 64});
        expect_error([&] { ts.store->append(0, view, k.view); }, ErrorCode::kInvalidArgument,
                     {"key of kv head 0", str_cat("channel ", channel)});
        expect_error([&] { ts.store->append(0, k.view, view); }, ErrorCode::kInvalidArgument,
                     {"value of kv head 0", str_cat("channel ", channel)});
      }
    }
    EXPECT_EQ(ts.store->n_tokens(0), 0);
    ts.store->append(0, k.view, k.view);  // the row itself fits
    EXPECT_EQ(ts.store->n_tokens(0), 1);
  }
}

// Every store type refuses what it cannot hold, naming the kv head, position
// and channel, and nothing changes: NaN and +-Inf (one NaN key makes every
// later score of its head NaN), and for f16 and bf16 the values that round
// to Inf in them (65520 and 3.3961e38 are the ties that do; the f32 just
// below each is kept as their largest). Sources of each dtype, head_dim 8
// and 24 (not whole vectors of the widest target), every Highway target.
TEST(KVStore, RefusesNonFiniteAndOverflowingValuesInEveryStoreType) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    const ForcedHighwayTarget forced(target);
    for (const DType kv_type : {DType::kF32, DType::kF16, DType::kBF16}) {
      SCOPED_TRACE(dtype_name(kv_type));
      const float tie = kv_type == DType::kF16 ? 65520.f : std::bit_cast<float>(0x7f7f8000u);
      for (const int head_dim : {8, 24}) {
        TestStore ts = make_store({1, 2, head_dim}, small_config(16, kv_type, RT::kQuest, 2, 100));
        std::mt19937 rng(test_seed(7));
        const Input v = random_input(rng, 3, 2, head_dim, DType::kF32, false);
        std::vector<float> bad_values = {nan, inf, -inf};
        if (kv_type != DType::kF32) bad_values.insert(bad_values.end(), {tie, -tie});
        for (const DType source : {DType::kF32, DType::kF16, DType::kBF16}) {
          for (const float bad : bad_values) {
            if (source != DType::kF32 && std::isfinite(bad)) continue;  // a 16-bit source cannot hold the ties
            SCOPED_TRACE(str_cat(dtype_name(source), " source, ", bad));
            for (const int channel : {0, head_dim - 1}) {
              std::vector<float> row(v.values);
              row[size_t(2 * head_dim + channel)] = bad;  // token 1, kv head 0
              std::vector<uint16_t> half(row.size());
              if (source != DType::kF32) convert(row.data(), DType::kF32, half.data(), source, row.size());
              const TensorView k_view =
                  source == DType::kF32 ? make_view(row.data(), DType::kF32, {3, 2, head_dim})
                                        : make_view(half.data(), source, {3, 2, head_dim});
              expect_error([&] { ts.store->append(0, k_view, v.view); }, ErrorCode::kInvalidArgument,
                           {"key of kv head 0 at position 1", str_cat("channel ", channel), "nothing was appended"});
              EXPECT_EQ(ts.store->n_tokens(0), 0);
            }
          }
        }
        // Rows apart in memory (a slice of wider rows): checked row by row.
        std::vector<float> wide(size_t(3 * 2 * (head_dim + 8)), 0.5f);
        wide[size_t((2 + 1) * (head_dim + 8) + 3)] = nan;  // token 1, kv head 1, channel 3
        TensorView strided = make_view(wide.data(), DType::kF32, {3, 2, head_dim});
        strided.strides[0] = 2 * (head_dim + 8), strided.strides[1] = head_dim + 8;
        expect_error([&] { ts.store->append(0, v.view, strided); }, ErrorCode::kInvalidArgument,
                     {"value of kv head 1 at position 1", "channel 3", "nan"});
        EXPECT_EQ(ts.store->n_tokens(0), 0);
        // The largest values that stay finite are kept.
        std::vector<float> row(v.values);
        row[0] = kv_type == DType::kF32 ? std::numeric_limits<float>::max() : std::nextafter(tie, 0.f);
        ts.store->append(0, make_view(row.data(), DType::kF32, {3, 2, head_dim}), v.view);
        EXPECT_EQ(ts.store->n_tokens(0), 3);
      }
    }
  }
}

// read_keys_t of a q8_0 page (a Highway kernel) against the rule written
// out: the code of channel c, token t (q8_key_code_offset) times its group's
// f16 scale, bit for bit, on every Highway target: whole and partial blocks,
// windows [t0, t0 + n) of every length, ld past n, blocks of 40 and 128
// tokens (whole and partial vectors), head_dim 32 to 256.
TEST(KVStore, Q8KeysReadBackAsCodeTimesScaleOnEveryHighwayTarget) {
  std::mt19937 rng(test_seed(83));
  for (const int block_size : {40, 128}) {
    for (const int head_dim : {32, 128, 256}) {
      TestStore ts = make_store({1, 1, head_dim}, small_config(block_size, DType::kQ8_0, RT::kQuest, 2, 1024));
      const int64_t n_tokens = block_size + block_size / 2 + 3;
      const Input k = random_input(rng, n_tokens, 1, head_dim, DType::kF32, false);
      ts.store->append(0, k.view, k.view);
      const StoreLayout& L = ts.store->layout();
      for (int64_t b = 0; b < ts.store->n_blocks(0); ++b) {
        const BlockView view = ts.store->block(0, 0, b);
        const auto* codes = reinterpret_cast<const int8_t*>(view.k_t);
        for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
          const ForcedHighwayTarget forced(target);
          for (int trial = 0; trial < 6; ++trial) {
            const int t0 = int(rng() % uint32_t(view.n_filled));
            const int n = 1 + int(rng() % uint32_t(view.n_filled - t0));
            const size_t ld = size_t(n) + rng() % 5;
            SCOPED_TRACE(str_cat(hwy::TargetName(target), ", block ", block_size, " of ", view.n_filled,
                                 " tokens, head_dim ", head_dim, ", tokens [", t0, ", ", t0 + n, "), ld ", ld));
            std::vector<float> got(size_t(head_dim) * ld, -1.f);
            read_keys_t(L, view, t0, n, got.data(), ld);
            for (int c = 0; c < head_dim; ++c)
              for (int i = 0; i < n; ++i) {
                const int t = t0 + i;
                const float want = float(codes[q8_key_code_offset(block_size, c, t)]) *
                                   f16_bits_to_f32(view.k_scales[size_t(c / kQ8Group) * size_t(block_size) + size_t(t)]);
                ASSERT_EQ(std::bit_cast<uint32_t>(got[size_t(c) * ld + size_t(i)]), std::bit_cast<uint32_t>(want))
                    << "channel " << c << ", token " << t;
              }
            for (int c = 0; c < head_dim; ++c)  // nothing written past n in a row
              for (size_t i = size_t(n); i < ld; ++i) ASSERT_EQ(got[size_t(c) * ld + i], -1.f);
          }
        }
      }
    }
  }
}

// read_keys_t of f32, f16 and bf16 pages: every window, the whole block into
// a buffer of its layout (one conversion) among them, gives what the page
// holds at [c * block_size + t], widened.
TEST(KVStore, KeysReadBackAsStoredForEveryWindow) {
  std::mt19937 rng(test_seed(84));
  for (const DType kv : {DType::kF32, DType::kF16, DType::kBF16}) {
    const int block_size = 24, head_dim = 32;
    TestStore ts = make_store({1, 1, head_dim}, small_config(block_size, kv, RT::kQuest, 2, 1024));
    const Input k = random_input(rng, 2 * block_size, 1, head_dim, DType::kF32, false);
    ts.store->append(0, k.view, k.view);
    const StoreLayout& L = ts.store->layout();
    const BlockView view = ts.store->block(0, 0, 1);
    for (int t0 = 0; t0 < block_size; t0 += 5) {
      for (const int n : {block_size - t0, 1, (block_size - t0 + 1) / 2}) {
        for (const size_t ld : {size_t(block_size), size_t(n) + 3}) {
          SCOPED_TRACE(str_cat(dtype_name(kv), ", tokens [", t0, ", ", t0 + n, "), ld ", ld));
          std::vector<float> got(size_t(head_dim) * std::max(ld, size_t(block_size)), -1.f);
          read_keys_t(L, view, t0, n, got.data(), ld);
          for (int c = 0; c < head_dim; ++c)
            for (int i = 0; i < n; ++i) {
              float want = 0.f;
              convert(view.k_t + (size_t(c) * block_size + size_t(t0 + i)) * dtype_size(kv), kv, &want, DType::kF32, 1);
              ASSERT_EQ(got[size_t(c) * ld + size_t(i)], want) << "channel " << c << ", token " << t0 + i;
            }
        }
      }
    }
  }
}

// The q8_0 key kernel alone on buffers of exactly the size it may touch (a
// sanitized build then catches any read or write past them; pages come from
// slabs it cannot see into): every window of blocks of 1 to 41 tokens, both
// groups of 64 channels, ld = n, every Highway target, against code * scale.
TEST(KVStore, Q8KeyKernelStaysInsideItsBuffersOnEveryHighwayTarget) {
  std::mt19937 rng(test_seed(85));
  const int d = 64;
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    const ForcedHighwayTarget forced(target);
    for (const int bs : {1, 2, 3, 5, 7, 16, 17, 33, 41}) {
      std::vector<int8_t> codes(size_t(d) * size_t(bs));
      for (int8_t& x : codes) x = int8_t(int(rng() % 255) - 127);
      for (int t = 0; t < bs; ++t)
        for (int n = 1; t + n <= bs; n += 1 + n / 4) {
          std::vector<float> scales(static_cast<size_t>(n));
          for (float& x : scales) x = float(rng() % 1000) / 128.f;
          for (const int c0 : {0, 32}) {
            SCOPED_TRACE(str_cat(hwy::TargetName(target), ", block ", bs, ", tokens [", t, ", ", t + n, "), c0 ", c0));
            std::vector<float> dst(size_t(c0 + kQ8Group) * size_t(n));  // rows up to the group's last, ld = n
            detail::dequantize_q8_keys_t(codes.data(), scales.data(), bs, t, n, c0, dst.data(), size_t(n));
            for (int c = c0; c < c0 + kQ8Group; ++c)
              for (int i = 0; i < n; ++i)
                ASSERT_EQ(dst[size_t(c * n + i)], float(codes[q8_key_code_offset(bs, c, t + i)]) * scales[size_t(i)])
                    << "channel " << c << ", token " << t + i;
          }
        }
    }
  }
}

}  // namespace
}  // namespace longctx::kvstore
