#include "ember/worker/model_config.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/common/hash.h"

namespace ember::worker {

std::vector<std::int64_t> parse_layers(const std::string& text, const std::string& flag) {
  std::vector<std::int64_t> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t dash = text.find('-', pos);
    std::string part = text.substr(pos, dash == std::string::npos ? std::string::npos : dash - pos);
    try {
      std::size_t used = 0;
      long long v = std::stoll(part, &used);
      if (used != part.size() || v <= 0 || v > (1 << 20)) throw std::invalid_argument(part);
      out.push_back(v);
    } catch (const std::exception&) {
      throw ConfigError(flag + " '" + text + "': layer sizes are positive integers joined by '-' (e.g. 512-256-64)");
    }
    if (dash == std::string::npos) break;
    pos = dash + 1;
  }
  return out;
}

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ModelConfig, kind, num_dense, num_tables, dim, bottom, top, deep, cross_layers, cross_rank, file,
                                   file_identity, pooling)

void check_pooling(const std::string& pooling) {
  if (pooling != "sum" && pooling != "mean") throw ConfigError("--pooling must be sum or mean, not '" + pooling + "'");
}

std::string model_config_json(const ModelConfig& c) {
  nlohmann::json j(c);
  if (c.pooling == "sum") j.erase("pooling");  // the default: one-hot jobs write what they wrote before pooling existed
  return j.dump();
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& origin) {
  try {
    nlohmann::json j = nlohmann::json::parse(json_text);
    // Written before model files, dcnv2 and multi-hot pooling: their defaults.
    const ModelConfig defaults;
    if (!j.contains("cross_rank")) j["cross_rank"] = defaults.cross_rank;
    if (!j.contains("file")) j["file"] = "";
    if (!j.contains("file_identity")) j["file_identity"] = "";
    if (!j.contains("pooling")) j["pooling"] = defaults.pooling;
    return j.get<ModelConfig>();
  } catch (const nlohmann::json::exception& e) {
    throw DataError(origin + ": not a model configuration: " + e.what());
  }
}

std::string model_file_identity(const std::string& path) {
  if (path.empty()) return "none";
  const std::string bytes = read_file(path);
  return fmt::format("a TorchScript file of {} bytes, contents {:016x}", bytes.size(), fnv1a64(bytes));
}

}  // namespace ember::worker
