#include "job/job_options.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/common/hash.h"
#include "ember/worker/worker_options.h"

namespace ember::worker {

std::string dataset_identity(const data::Manifest& m) {
  std::string bytes;
  for (const auto& t : m.tables) bytes += std::to_string(t.rows) + ",";
  for (const auto& sh : m.shards[static_cast<int>(data::Split::kTrain)])
    bytes += std::to_string(sh.rows) + ":" + std::to_string(sh.checksum) + ",";
  return fmt::format("{} training rows, {} dense features, {} {}tables of {} rows, contents {:016x}", m.rows[0], m.dense_names.size(),
                     m.tables.size(), m.multi_hot ? "multi-hot " : "", m.total_table_rows(), fnv1a64(bytes));
}

OptionValues agreed_options(const TrainConfig& c, const std::string& dataset) {
  OptionValues v;
  for (const OptionDecl<TrainConfig>& o : worker_options()) {
    if (!o.agreed) continue;
    // The dataset agrees by what it holds, which its path does not say.
    v.emplace_back(o.flag, o.flag == "--dataset" ? dataset : o.value(c));
  }
  return v;
}

std::string options_to_json(const OptionValues& values) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& [flag, value] : values) j.push_back({flag, value});
  return j.dump();
}

OptionValues options_from_json(const std::string& text) {
  try {
    OptionValues v;
    for (const auto& e : nlohmann::json::parse(text)) v.emplace_back(e.at(0).get<std::string>(), e.at(1).get<std::string>());
    return v;
  } catch (const nlohmann::json::exception& e) {
    throw ProtocolError(std::string("worker 0 published malformed options: ") + e.what());
  }
}

std::string compare_options(const OptionValues& mine, const OptionValues& job) {
  std::string out;
  const auto add = [&out](const std::string& line) { out += (out.empty() ? "" : "; ") + line; };
  const auto find = [](const OptionValues& in, const std::string& flag) {
    return std::find_if(in.begin(), in.end(), [&](const auto& e) { return e.first == flag; });
  };
  for (const auto& [flag, value] : mine) {
    auto j = find(job, flag);
    if (j == job.end())
      add(flag + " " + value + ", the job does not say (worker 0 is an ember-worker of another build)");
    else if (j->second != value)
      add(flag + " " + value + ", the job has " + j->second);
  }
  for (const auto& [flag, value] : job) {
    if (find(mine, flag) == mine.end())
      add(flag + ": the job has " + value + ", an option this ember-worker does not know (another build)");
  }
  return out;
}

}  // namespace ember::worker
