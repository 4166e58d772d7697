// Scheduling policies (DESIGN.md "Row states and transmission accounting").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ember::scheduler {

enum class PolicyKind {
  kVanilla,  // random balanced allocation, full-set sync every iteration
  kLaia,     // LAIA allocation, full-set sync
  kPlan,     // random allocation, on-demand sync (the communication plan)
  kHerald,   // LAIA allocation, on-demand sync
  kHet,      // HET-style: random allocation, cached copies usable while at most S versions behind
  kFae,      // FAE-style: hottest fraction F of rows replicated on every worker
  kBrute,    // exhaustive best allocation per batch (tiny configurations), on-demand sync
};

struct Policy {
  PolicyKind kind = PolicyKind::kVanilla;
  std::uint32_t staleness = 0;  // het:S
  double hot_fraction = 0;      // fae:F
  std::string name;             // as written, e.g. "het:2"

  bool laia() const { return kind == PolicyKind::kLaia || kind == PolicyKind::kHerald; }
  // On-demand sync (steps 1-3 of the contract) rather than full-set sync.
  bool on_demand() const { return kind == PolicyKind::kPlan || kind == PolicyKind::kHerald || kind == PolicyKind::kBrute; }
};

// "vanilla", "laia", "plan", "herald", "het:S", "fae:F", "brute"; ConfigError otherwise.
Policy parse_policy(const std::string& text);
// Comma-separated list.
std::vector<Policy> parse_policies(const std::string& list);

}  // namespace ember::scheduler
