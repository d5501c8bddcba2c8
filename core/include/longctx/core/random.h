// SplitMix64 (Steele, Lea & Flood 2014): a Weyl sequence through a 64-bit
// finalizer. Fast, statistically strong and the same on every platform, so
// generated workloads, test models and documents are reproducible from a seed.
#pragma once

#include <cstdint>

namespace longctx {

constexpr uint64_t splitmix64_finalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() { return splitmix64_finalize(state_ += kGamma); }
  // Skips n outputs at once (the state is a Weyl sequence), so that threads
  // can each generate their own part of one stream.
  void discard(uint64_t n) { state_ += n * kGamma; }
  uint64_t operator()() { return next(); }
  // 53 random bits as a double in [0, 1), or in (0, 1) (safe for log()).
  double uniform() { return double(next() >> 11) * 0x1p-53; }
  double uniform_open() { return (double(next() >> 11) + 0.5) * 0x1p-53; }
  // In [0, n); the modulo bias (< n / 2^64) is irrelevant for generators.
  uint64_t below(uint64_t n) { return next() % n; }

 private:
  static constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;
  uint64_t state_;
};

}  // namespace longctx
