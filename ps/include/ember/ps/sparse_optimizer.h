// Optimizers for embedding rows. One implementation serves the PS (rows trained by
// several workers: the summed gradient, applied once) and the workers (rows trained by
// one worker alone, applied to the cached copy): the same code gives the same bits, so
// a scheduled run trains the model BSP training gives.
//
// A row is `dim` floats of value plus state_floats(kind, dim) floats of state, stored
// beside it. Weight decay is L2: g <- g + decay * w.
#pragma once

#include <cstdint>
#include <string>

namespace ember::ps {

enum class OptimizerKind {
  kSgd,              // w -= lr g
  kAdagrad,          // s += g^2 (per element); w -= lr g / (sqrt(s) + eps)
  kRowWiseAdagrad,   // s += mean(g^2) (one float per row); w -= lr g / (sqrt(s) + eps)
  kAdam,             // lazy Adam: per-row step count; m, v per element, bias-corrected
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

}  // namespace ember::ps
