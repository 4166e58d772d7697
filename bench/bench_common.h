// Shared helpers of ember-bench subcommands: medians and result printing.
#pragma once

#include <sys/resource.h>

#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ember::bench {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// CPU time (user + system, every thread) this process has used so far.
inline double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
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
