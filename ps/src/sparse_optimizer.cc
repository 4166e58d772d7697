#include "ember/ps/sparse_optimizer.h"

#include <cmath>

#include "ember/common/error.h"

namespace ember::ps {

OptimizerKind parse_optimizer(const std::string& name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "adagrad") return OptimizerKind::kAdagrad;
  if (name == "rowwise-adagrad") return OptimizerKind::kRowWiseAdagrad;
  if (name == "adam") return OptimizerKind::kAdam;
  throw ConfigError("unknown optimizer '" + name + "' (sgd, adagrad, rowwise-adagrad, adam)");
}

const char* optimizer_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kAdagrad: return "adagrad";
    case OptimizerKind::kRowWiseAdagrad: return "rowwise-adagrad";
    case OptimizerKind::kAdam: return "adam";
  }
  return "?";
}

std::uint32_t state_floats(OptimizerKind kind, std::uint32_t dim) {
  switch (kind) {
    case OptimizerKind::kSgd: return 0;
    case OptimizerKind::kAdagrad: return dim;
    case OptimizerKind::kRowWiseAdagrad: return 1;
    case OptimizerKind::kAdam: return 2 * dim + 1;  // m, v, step count
  }
  return 0;
}

void init_state(const OptimizerConfig& c, std::uint32_t dim, float* state) {
  const std::uint32_t n = state_floats(c.kind, dim);
  const float init = (c.kind == OptimizerKind::kAdagrad || c.kind == OptimizerKind::kRowWiseAdagrad) ? c.initial_accumulator : 0.0f;
  for (std::uint32_t i = 0; i < n; ++i) state[i] = init;
}

void apply(const OptimizerConfig& c, float lr, std::uint32_t dim, float* __restrict w, float* __restrict s, const float* __restrict grad) {
  // Gradients with weight decay, computed per element on the fly (no allocation).
  auto g = [&](std::uint32_t i) { return grad[i] + c.weight_decay * w[i]; };
  switch (c.kind) {
    case OptimizerKind::kSgd:
      for (std::uint32_t i = 0; i < dim; ++i) w[i] -= lr * g(i);
      break;
    case OptimizerKind::kAdagrad:
      for (std::uint32_t i = 0; i < dim; ++i) {
        float gi = g(i);
        s[i] += gi * gi;
        w[i] -= lr * gi / (std::sqrt(s[i]) + c.eps);
      }
      break;
    case OptimizerKind::kRowWiseAdagrad: {
      float sum = 0;
      for (std::uint32_t i = 0; i < dim; ++i) sum += g(i) * g(i);
      s[0] += sum / static_cast<float>(dim);
      const float scale = lr / (std::sqrt(s[0]) + c.eps);
      for (std::uint32_t i = 0; i < dim; ++i) w[i] -= scale * g(i);
      break;
    }
    case OptimizerKind::kAdam: {
      float* m = s;
      float* v = s + dim;
      float& step = s[2 * dim];
      step += 1.0f;
      const float bc1 = 1.0f - std::pow(c.beta1, step);
      const float bc2 = 1.0f - std::pow(c.beta2, step);
      for (std::uint32_t i = 0; i < dim; ++i) {
        float gi = g(i);
        m[i] = c.beta1 * m[i] + (1.0f - c.beta1) * gi;
        v[i] = c.beta2 * v[i] + (1.0f - c.beta2) * gi * gi;
        w[i] -= lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + c.eps);
      }
      break;
    }
  }
}

}  // namespace ember::ps
