// Dynamic tables' rows made and dropped per PS shard (KeyDirectory's counts) as JSON:
// ember-sim's "dynamic_rows" and a job's summary.json alike, so that the two compare key
// by key.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "ember/scheduler/key_directory.h"

namespace ember::scheduler {

template <class Json = nlohmann::ordered_json>
Json directory_counts_json(const DirectoryCounts& d) {
  return Json{{"live", d.live}, {"created", d.created}, {"refused", d.refused}, {"expired", d.expired}, {"capped", d.capped}};
}

// The totals, then "per_shard": each shard's.
template <class Json = nlohmann::ordered_json>
Json dynamic_rows_json(const std::vector<DirectoryCounts>& per_shard) {
  DirectoryCounts all;
  auto shards = Json::array();
  for (const DirectoryCounts& s : per_shard) {
    all += s;
    shards.push_back(directory_counts_json<Json>(s));
  }
  Json j = directory_counts_json<Json>(all);
  j["per_shard"] = std::move(shards);
  return j;
}

}  // namespace ember::scheduler
