// Bounded Zipf distribution: P(rank k) proportional to (k+1)^-s for k in [0, n).
#pragma once

#include <cstdint>

namespace ember::data {

// Small, fast, seedable generator (splitmix64): every synthetic stream is reproducible
// from (seed, stream id) whatever the thread count.
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform in [0, n).
  std::uint64_t below(std::uint64_t n) { return static_cast<std::uint64_t>(uniform() * static_cast<double>(n)); }
  // Standard normal (Box-Muller, one value per call).
  double normal();

 private:
  std::uint64_t state_;
};

// O(1) sampling by rejection-inversion (Hoermann and Derflinger, 1996): no tables, so
// it works for tables of millions of rows.
class ZipfSampler {
 public:
  ZipfSampler() = default;
  ZipfSampler(std::uint64_t n, double s);
  std::uint64_t operator()(SplitMix64& rng) const;
  std::uint64_t n() const { return n_; }
  double exponent() const { return s_; }

 private:
  double h(double x) const;  // integral of x^-s
  double h_inverse(double x) const;
  std::uint64_t n_ = 1;
  double s_ = 1.0;
  double h_x1_ = 0, h_n_ = 0, threshold_ = 0;
};

// Expected distinct ranks in `draws` independent draws from Zipf(n, s):
// sum_k 1 - (1 - p_k)^draws (exact over the head, integrated over the tail).
double zipf_expected_distinct(std::uint64_t n, double s, double draws);

// The exponent whose expected distinct count in `draws` draws is `distinct`
// (bisection on [0, 4]); clamps when the target is out of reach.
double fit_zipf_exponent(std::uint64_t n, double draws, double distinct);

}  // namespace ember::data
