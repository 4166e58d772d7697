// Shared helpers of ember-bench subcommands: medians and result printing.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

namespace ember::bench {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A benchmark prints a readable table, or with --json one object per line.
struct Output {
  bool json = false;
  void row(const nlohmann::ordered_json& j) const {
    if (json) std::cout << j.dump() << std::endl;
  }
  void text(const std::string& s) const {
    if (!json) std::cout << s << std::flush;
  }
};

}  // namespace ember::bench
