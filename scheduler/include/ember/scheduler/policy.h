// Scheduling policies (docs/design.md "Row states and transmission accounting"). Each policy
// is one entry of the policy table (policy.cc), described by its traits; the scheduler
// and the simulator ask a policy's traits, never which policy it is.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ember::scheduler {

// Where each sample of a global batch is trained.
enum class Allocation : std::uint8_t {
  kRandom,  // seeded balanced random partition
  kLaia,    // Herald's Algorithm 1: the worker holding most of the sample's rows as latest
  kBrute,   // every assignment tried, the one moving fewest rows kept (Herald's Appendix C)
};

// When the rows trained in an iteration are brought back to the PS.
enum class Sync : std::uint8_t {
  kFullSet,           // every trained row's gradient is pushed at the end of its iteration
  kOnDemand,          // steps 1-3 of the contract: only what another worker needs (Algorithm 2)
  kBoundedStaleness,  // het:S: every gradient pushed; a cached copy serves while at most S versions behind
};

// What a policy is made of. The argument a policy takes follows from its traits:
// bounded staleness takes the bound S (het:S), hot-row replication the fraction F (fae:F).
struct PolicyTraits {
  std::string_view name;  // as written before any ':' argument
  Allocation allocation;
  Sync sync;
  bool replicates_frequent_rows;  // the hottest rows live on every worker, off the PS (FAE)
  bool simulator_only;            // too slow to train with; ember-sim only
};

// Every policy, in the order messages list them.
std::span<const PolicyTraits> policy_table();

class Policy {
 public:
  Policy();  // vanilla

  const std::string& name() const { return name_; }  // as written, e.g. "het:2"
  Allocation allocation() const { return traits_->allocation; }
  Sync sync() const { return traits_->sync; }
  bool replicates_frequent_rows() const { return traits_->replicates_frequent_rows; }
  bool simulator_only() const { return traits_->simulator_only; }
  std::uint32_t staleness() const { return staleness_; }               // het:S
  double replicated_fraction() const { return replicated_fraction_; }  // fae:F

 private:
  friend Policy parse_policy(const std::string& text);

  const PolicyTraits* traits_;  // an entry of policy_table()
  std::uint32_t staleness_ = 0;
  double replicated_fraction_ = 0;
  std::string name_;
};

// "vanilla", "laia", "plan", "herald", "het:S", "fae:F", "brute"; ConfigError otherwise.
Policy parse_policy(const std::string& text);
// Comma-separated list.
std::vector<Policy> parse_policies(const std::string& list);

// The policies training can run, as a message lists them: "vanilla, ..., het:S or fae:F".
std::string trainable_policies();

}  // namespace ember::scheduler
