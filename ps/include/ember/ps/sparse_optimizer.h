// Optimizers for embedding rows. One implementation serves the PS (rows trained by
// several workers: the summed gradient, applied once) and the workers (rows trained by
// one worker alone, applied to the cached copy): the same code gives the same bits, so
// a scheduled run trains the model BSP training gives.
//
// A row is `dim` floats of value plus state_floats(kind, dim) floats of state, stored
// beside it. Weight decay is L2: g <- g + decay * w.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

namespace ember::ps {

enum class OptimizerKind {
  kSgd,             // w -= lr g
  kAdagrad,         // s += g^2 (per element); w -= lr g / (sqrt(s) + eps)
  kRowWiseAdagrad,  // s += mean(g^2) (one float per row); w -= lr g / (sqrt(s) + eps)
  kAdam,            // lazy Adam: per-row step count; m, v per element, bias-corrected
};

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  float lr = 0.01f;
  float weight_decay = 0.0f;
  float eps = 1e-8f;
  float beta1 = 0.9f, beta2 = 0.999f;  // adam
  float initial_accumulator = 0.0f;    // adagrad variants
};

// "sgd", "adagrad", "rowwise-adagrad", "adam"; ConfigError otherwise.
OptimizerKind parse_optimizer(const std::string& name);
const char* optimizer_name(OptimizerKind kind);

// Floats of optimizer state per row.
std::uint32_t state_floats(OptimizerKind kind, std::uint32_t dim);

// Fills a fresh row's state (accumulators, moments, step count).
void init_state(const OptimizerConfig& c, std::uint32_t dim, float* state);

// One update of a row with gradient `grad` (already summed over every worker that
// trained the row in that iteration), at learning rate `lr` (the iteration's).
void apply(const OptimizerConfig& c, float lr, std::uint32_t dim, float* value, float* state, const float* grad);

// f(std::integral_constant<OptimizerKind, kind>{}): a loop over many rows picks the
// optimizer once, then runs apply_as<K> inline for each row (the PS's commit) instead of
// a call and a switch per row.
template <class F>
decltype(auto) with_kind(OptimizerKind kind, F&& f) {
  switch (kind) {
    case OptimizerKind::kAdagrad:
      return f(std::integral_constant<OptimizerKind, OptimizerKind::kAdagrad>{});
    case OptimizerKind::kRowWiseAdagrad:
      return f(std::integral_constant<OptimizerKind, OptimizerKind::kRowWiseAdagrad>{});
    case OptimizerKind::kAdam:
      return f(std::integral_constant<OptimizerKind, OptimizerKind::kAdam>{});
    case OptimizerKind::kSgd:
      break;
  }
  return f(std::integral_constant<OptimizerKind, OptimizerKind::kSgd>{});
}

// apply() for optimizer K (c.kind is not read). Every file that instantiates it is
// compiled without floating-point contraction (ps/CMakeLists.txt), so the PS's loop and
// apply() give the same bits whatever -march is.
template <OptimizerKind K>
inline void apply_as(const OptimizerConfig& c, float lr, std::uint32_t dim, float* __restrict w, float* __restrict s,
                     const float* __restrict grad) {
  // Gradients with weight decay, computed per element on the fly (no allocation).
  const float decay = c.weight_decay;
  auto g = [&](std::uint32_t i) { return grad[i] + decay * w[i]; };
  if constexpr (K == OptimizerKind::kSgd) {
    for (std::uint32_t i = 0; i < dim; ++i) w[i] -= lr * g(i);
  } else if constexpr (K == OptimizerKind::kAdagrad) {
    const float eps = c.eps;
    for (std::uint32_t i = 0; i < dim; ++i) {
      const float gi = g(i);
      s[i] += gi * gi;
      w[i] -= lr * gi / (std::sqrt(s[i]) + eps);
    }
  } else if constexpr (K == OptimizerKind::kRowWiseAdagrad) {
    float sum = 0;
    for (std::uint32_t i = 0; i < dim; ++i) sum += g(i) * g(i);
    s[0] += sum / static_cast<float>(dim);
    const float scale = lr / (std::sqrt(s[0]) + c.eps);
    for (std::uint32_t i = 0; i < dim; ++i) w[i] -= scale * g(i);
  } else {
    static_assert(K == OptimizerKind::kAdam);
    float* m = s;
    float* v = s + dim;
    float& step = s[2 * dim];
    step += 1.0f;
    const float beta1 = c.beta1, beta2 = c.beta2, eps = c.eps;
    const float bc1 = 1.0f - std::pow(beta1, step);
    const float bc2 = 1.0f - std::pow(beta2, step);
    for (std::uint32_t i = 0; i < dim; ++i) {
      const float gi = g(i);
      m[i] = beta1 * m[i] + (1.0f - beta1) * gi;
      v[i] = beta2 * v[i] + (1.0f - beta2) * gi * gi;
      w[i] -= lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps);
    }
  }
}

}  // namespace ember::ps
