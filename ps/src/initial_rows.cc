#include "ember/ps/initial_rows.h"

#include <cmath>

namespace ember::ps {

void initial_row(std::uint64_t seed, Key key, std::uint32_t dim, float* out) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(dim));
  std::uint64_t state = mix64(seed * 0x9e3779b97f4a7c15ULL ^ mix64(key));
  for (std::uint32_t i = 0; i < dim; ++i) {
    state = mix64(state + 0x632be59bd9b4e019ULL);
    double u = static_cast<double>(state >> 11) * 0x1.0p-53;  // [0, 1)
    out[i] = static_cast<float>((2.0 * u - 1.0) * bound);
  }
}

}  // namespace ember::ps
