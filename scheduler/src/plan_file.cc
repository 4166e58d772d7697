#include "ember/scheduler/plan_file.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ember/common/error.h"
#include "ember/common/fs.h"

namespace ember::scheduler {

const char* treatment_name(Treatment t) {
  switch (t) {
    case Treatment::kCache:
      return "cache";
    case Treatment::kReplicated:
      return "replicated";
    case Treatment::kUncached:
      return "uncached";
  }
  return "?";
}

Treatment parse_treatment(const std::string& s) {
  for (Treatment t : {Treatment::kCache, Treatment::kReplicated, Treatment::kUncached}) {
    if (s == treatment_name(t)) return t;
  }
  throw ConfigError("unknown treatment '" + s + "' (cache, replicated, uncached)");
}

void write_plan(const std::filesystem::path& path, const PlanFile& plan) {
  nlohmann::ordered_json j;
  j["format"] = kPlanFormat;
  j["cache_rows"] = plan.cache_rows;
  if (plan.batch_per_worker > 0) j["batch_per_worker"] = plan.batch_per_worker;
  auto& arr = j["tables"] = nlohmann::ordered_json::array();
  for (std::size_t t = 0; t < plan.names.size(); ++t) {
    arr.push_back({{"name", plan.names[t]}, {"rows", plan.rows[t]}, {"treatment", treatment_name(plan.treatments[t])}});
    if (t < plan.cache_shares.size() && plan.cache_shares[t] > 0) arr.back()["cache_share"] = plan.cache_shares[t];
  }
  write_file_atomic(path, j.dump(1) + "\n");
}

PlanFile read_plan(const std::filesystem::path& path, const data::Dataset& ds) {
  std::ifstream in(path);
  if (!in) throw IoError("cannot read plan " + path.string());
  const std::string p = "plan " + path.string();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(p + " is not JSON: " + std::string(e.what()));
  }
  PlanFile plan;
  try {
    if (j.at("format").get<int>() != kPlanFormat) {
      throw ConfigError(p + " has format " + j.at("format").dump() + ", this ember reads " + std::to_string(kPlanFormat));
    }
    plan.cache_rows = j.at("cache_rows").get<std::uint32_t>();
    plan.batch_per_worker = j.value("batch_per_worker", std::uint32_t{0});
    for (const auto& t : j.at("tables")) {
      plan.names.push_back(t.at("name").get<std::string>());
      plan.rows.push_back(t.at("rows").get<std::uint64_t>());
      plan.treatments.push_back(parse_treatment(t.at("treatment").get<std::string>()));
      plan.cache_shares.push_back(t.value("cache_share", std::uint32_t{0}));
    }
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(p + ": " + std::string(e.what()));
  }
  const auto& tables = ds.manifest().tables;
  for (std::size_t t = 0; t < std::max(tables.size(), plan.names.size()); ++t) {
    const std::string at = " (table " + std::to_string(t + 1) + ")";
    if (t >= plan.names.size()) throw ConfigError(p + " lacks the dataset's table " + tables[t].name + at);
    if (t >= tables.size()) throw ConfigError(p + " has table " + plan.names[t] + at + " that the dataset does not have");
    if (plan.names[t] != tables[t].name) {
      throw ConfigError(p + " names table " + plan.names[t] + at + " where the dataset has " + tables[t].name);
    }
    if (plan.rows[t] != tables[t].rows) {
      throw ConfigError(p + ": table " + plan.names[t] + " has " + std::to_string(plan.rows[t]) + " rows, the dataset's " +
                        std::to_string(tables[t].rows));
    }
  }
  const bool cached = std::find(plan.treatments.begin(), plan.treatments.end(), Treatment::kCache) != plan.treatments.end();
  if (cached && plan.cache_rows == 0) throw ConfigError(p + ": cache_rows is 0, and tables are to be cached");
  std::uint64_t shared = 0;
  for (std::size_t t = 0; t < plan.cache_shares.size(); ++t) {
    if (plan.cache_shares[t] > 0 && plan.treatments[t] != Treatment::kCache) {
      throw ConfigError(p + ": table " + plan.names[t] + " has a cache share but is " + treatment_name(plan.treatments[t]));
    }
    shared += plan.cache_shares[t];
  }
  if (shared > 0 && shared >= plan.cache_rows) {
    throw ConfigError(p + ": the tables' cache shares (" + std::to_string(shared) + " rows) leave no pool in cache_rows " +
                      std::to_string(plan.cache_rows));
  }
  if (shared == 0) plan.cache_shares.clear();
  return plan;
}

}  // namespace ember::scheduler
