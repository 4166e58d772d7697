#include "ember/data/zipf.h"

#include <algorithm>
#include <cmath>

namespace ember::data {
namespace {

// log1p(x)/x and expm1(x)/x, accurate near 0 (the s -> 1 limit).
double log1p_over_x(double x) { return std::abs(x) > 1e-8 ? std::log1p(x) / x : 1.0 - x / 2.0; }
double expm1_over_x(double x) { return std::abs(x) > 1e-8 ? std::expm1(x) / x : 1.0 + x / 2.0; }

}  // namespace

double SplitMix64::normal() {
  double u1 = uniform();
  double u2 = uniform();
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

ZipfSampler::ZipfSampler(std::uint64_t n, double s) : n_(std::max<std::uint64_t>(n, 1)), s_(s) {
  h_x1_ = h(1.5) - 1.0;
  h_n_ = h(static_cast<double>(n_) + 0.5);
  threshold_ = 2.0 - h_inverse(h(2.5) - std::pow(2.0, -s_));
}

double ZipfSampler::h(double x) const {
  double lx = std::log(x);
  return expm1_over_x((1.0 - s_) * lx) * lx;
}

double ZipfSampler::h_inverse(double x) const {
  double t = std::max(-1.0, x * (1.0 - s_));
  return std::exp(log1p_over_x(t) * x);
}

std::uint64_t ZipfSampler::operator()(SplitMix64& rng) const {
  if (n_ == 1) return 0;
  while (true) {
    double u = h_n_ + rng.uniform() * (h_x1_ - h_n_);
    double x = h_inverse(u);
    double k = std::floor(x + 0.5);
    if (k < 1) k = 1;
    if (k > static_cast<double>(n_)) k = static_cast<double>(n_);
    if (k - x <= threshold_ || u >= h(k + 0.5) - std::pow(k, -s_)) return static_cast<std::uint64_t>(k) - 1;
  }
}

double zipf_expected_distinct(std::uint64_t n, double s, double draws) {
  // Normalizer: exact head plus integral tail.
  const std::uint64_t head = std::min<std::uint64_t>(n, 20000);
  auto tail_integral = [&](double a, double b, auto&& f) {
    // Integrate f over [a, b] on a log-spaced grid (the integrand is smooth in log x).
    const int steps = 2000;
    double la = std::log(a), lb = std::log(b), sum = 0;
    for (int i = 0; i < steps; ++i) {
      double x0 = std::exp(la + (lb - la) * i / steps), x1 = std::exp(la + (lb - la) * (i + 1) / steps);
      double xm = 0.5 * (x0 + x1);
      sum += f(xm) * (x1 - x0);
    }
    return sum;
  };
  double norm = 0;
  for (std::uint64_t k = 1; k <= head; ++k) norm += std::pow(static_cast<double>(k), -s);
  if (n > head) {
    norm += tail_integral(static_cast<double>(head) + 0.5, static_cast<double>(n) + 0.5, [&](double x) { return std::pow(x, -s); });
  }
  double distinct = 0;
  for (std::uint64_t k = 1; k <= head; ++k) {
    double p = std::pow(static_cast<double>(k), -s) / norm;
    distinct += -std::expm1(draws * std::log1p(-std::min(p, 1.0 - 1e-16)));
  }
  if (n > head) {
    distinct += tail_integral(static_cast<double>(head) + 0.5, static_cast<double>(n) + 0.5, [&](double x) {
      double p = std::pow(x, -s) / norm;
      return -std::expm1(draws * std::log1p(-p));
    });
  }
  return distinct;
}

double fit_zipf_exponent(std::uint64_t n, double draws, double distinct) {
  // Expected distinct falls as s grows.
  double lo = 0.0, hi = 4.0;
  if (zipf_expected_distinct(n, lo, draws) <= distinct) return lo;
  if (zipf_expected_distinct(n, hi, draws) >= distinct) return hi;
  for (int i = 0; i < 40; ++i) {
    double mid = 0.5 * (lo + hi);
    if (zipf_expected_distinct(n, mid, draws) > distinct)
      lo = mid;
    else
      hi = mid;
  }
  return 0.5 * (lo + hi);
}

}  // namespace ember::data
