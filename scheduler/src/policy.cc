#include "ember/scheduler/policy.h"

#include <cstdlib>

#include "ember/common/error.h"

namespace ember::scheduler {

Policy parse_policy(const std::string& text) {
  Policy p;
  p.name = text;
  auto colon = text.find(':');
  std::string head = text.substr(0, colon);
  std::string arg = colon == std::string::npos ? "" : text.substr(colon + 1);
  auto no_arg = [&] {
    if (colon != std::string::npos) throw ConfigError("policy '" + text + "' takes no argument");
  };
  if (head == "vanilla") { no_arg(); p.kind = PolicyKind::kVanilla; }
  else if (head == "laia") { no_arg(); p.kind = PolicyKind::kLaia; }
  else if (head == "plan") { no_arg(); p.kind = PolicyKind::kPlan; }
  else if (head == "herald") { no_arg(); p.kind = PolicyKind::kHerald; }
  else if (head == "brute") { no_arg(); p.kind = PolicyKind::kBrute; }
  else if (head == "het") {
    char* end = nullptr;
    long s = std::strtol(arg.c_str(), &end, 10);
    if (arg.empty() || *end != '\0' || s < 0) throw ConfigError("policy '" + text + "': het:S needs a staleness S >= 0");
    p.kind = PolicyKind::kHet;
    p.staleness = static_cast<std::uint32_t>(s);
  } else if (head == "fae") {
    char* end = nullptr;
    double f = std::strtod(arg.c_str(), &end);
    if (arg.empty() || *end != '\0' || !(f >= 0 && f < 1)) throw ConfigError("policy '" + text + "': fae:F needs a hot fraction F in [0, 1)");
    p.kind = PolicyKind::kFae;
    p.hot_fraction = f;
  } else {
    throw ConfigError("unknown policy '" + text + "' (vanilla, laia, plan, herald, het:S, fae:F, brute)");
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

}  // namespace ember::scheduler
