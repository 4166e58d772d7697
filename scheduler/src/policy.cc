#include "ember/scheduler/policy.h"

#include <array>
#include <cstdlib>

#include "ember/common/error.h"

namespace ember::scheduler {
namespace {

// docs/design.md: vanilla, laia, plan and herald are Herald's Table 2 breakdown (allocation x
// sync); het and fae are the HET- and FAE-style baselines; brute is Appendix C.
constexpr std::array<PolicyTraits, 7> kPolicies{{
    {"vanilla", Allocation::kRandom, Sync::kFullSet, false, false},
    {"laia", Allocation::kLaia, Sync::kFullSet, false, false},
    {"plan", Allocation::kRandom, Sync::kOnDemand, false, false},
    {"herald", Allocation::kLaia, Sync::kOnDemand, false, false},
    {"het", Allocation::kRandom, Sync::kBoundedStaleness, false, false},
    {"fae", Allocation::kRandom, Sync::kFullSet, true, false},
    {"brute", Allocation::kBrute, Sync::kOnDemand, false, true},
}};

bool takes_staleness(const PolicyTraits& t) { return t.sync == Sync::kBoundedStaleness; }
bool takes_replicated_fraction(const PolicyTraits& t) { return t.replicates_frequent_rows; }

// The policy as messages write it: "het:S", "fae:F", "vanilla".
std::string usage(const PolicyTraits& t) {
  std::string u(t.name);
  if (takes_staleness(t)) u += ":S";
  if (takes_replicated_fraction(t)) u += ":F";
  return u;
}

}  // namespace

std::span<const PolicyTraits> policy_table() { return kPolicies; }

Policy::Policy() : traits_(&kPolicies[0]), name_(kPolicies[0].name) {}

Policy parse_policy(const std::string& text) {
  Policy p;
  p.name_ = text;
  auto colon = text.find(':');
  std::string head = text.substr(0, colon);
  std::string arg = colon == std::string::npos ? "" : text.substr(colon + 1);
  const PolicyTraits* traits = nullptr;
  for (const PolicyTraits& t : kPolicies) {
    if (t.name == head) traits = &t;
  }
  if (traits == nullptr) {
    std::string all;
    for (const PolicyTraits& t : kPolicies) all += (all.empty() ? "" : ", ") + usage(t);
    throw ConfigError("unknown policy '" + text + "' (" + all + ")");
  }
  p.traits_ = traits;
  if (takes_staleness(*traits)) {
    char* end = nullptr;
    long s = std::strtol(arg.c_str(), &end, 10);
    if (arg.empty() || *end != '\0' || s < 0) throw ConfigError("policy '" + text + "': het:S needs a staleness S >= 0");
    p.staleness_ = static_cast<std::uint32_t>(s);
  } else if (takes_replicated_fraction(*traits)) {
    char* end = nullptr;
    double f = std::strtod(arg.c_str(), &end);
    if (arg.empty() || *end != '\0' || !(f >= 0 && f < 1))
      throw ConfigError("policy '" + text + "': fae:F needs a hot fraction F in [0, 1)");
    p.replicated_fraction_ = f;
  } else if (colon != std::string::npos) {
    throw ConfigError("policy '" + text + "' takes no argument");
  }
  return p;
}

std::vector<Policy> parse_policies(const std::string& list) {
  std::vector<Policy> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    std::size_t comma = list.find(',', start);
    std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(parse_policy(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (out.empty()) throw ConfigError("no policy given");
  return out;
}

std::string trainable_policies() {
  std::vector<std::string> names;
  for (const PolicyTraits& t : kPolicies) {
    if (!t.simulator_only) names.push_back(usage(t));
  }
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += names[i];
  }
  return out;
}

}  // namespace ember::scheduler
