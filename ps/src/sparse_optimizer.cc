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
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdagrad:
      return "adagrad";
    case OptimizerKind::kRowWiseAdagrad:
      return "rowwise-adagrad";
    case OptimizerKind::kAdam:
      return "adam";
  }
  return "?";
}

std::uint32_t state_floats(OptimizerKind kind, std::uint32_t dim) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return 0;
    case OptimizerKind::kAdagrad:
      return dim;
    case OptimizerKind::kRowWiseAdagrad:
      return 1;
    case OptimizerKind::kAdam:
      return 2 * dim + 1;  // m, v, step count
  }
  return 0;
}

void init_state(const OptimizerConfig& c, std::uint32_t dim, float* state) {
  const std::uint32_t n = state_floats(c.kind, dim);
  const float init = (c.kind == OptimizerKind::kAdagrad || c.kind == OptimizerKind::kRowWiseAdagrad) ? c.initial_accumulator : 0.0f;
  for (std::uint32_t i = 0; i < n; ++i) state[i] = init;
}

void apply(const OptimizerConfig& c, float lr, std::uint32_t dim, float* value, float* state, const float* grad) {
  with_kind(c.kind, [&](auto kind) { apply_as<decltype(kind)::value>(c, lr, dim, value, state, grad); });
}

}  // namespace ember::ps
