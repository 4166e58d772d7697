#include "ember/ps/job_config.h"

#include <nlohmann/json.hpp>

#include "ember/common/error.h"

namespace ember::ps {

using json = nlohmann::json;

std::string JobConfig::to_json() const {
  const json j = {{"num_keys", num_keys},
                  {"dim", dim},
                  {"optimizer", optimizer_name(optimizer.kind)},
                  {"lr", optimizer.lr},
                  {"weight_decay", optimizer.weight_decay},
                  {"seed", seed},
                  {"shards", shards},
                  {"transport", transport},
                  {"checkpoint_every", checkpoint_every},
                  {"checkpoints", checkpoints},
                  {"restored_iteration", restored_iteration},
                  {"row_tier", disk_tier}};  // the key's old name: workers of other builds read it
  return j.dump();
}

JobConfig JobConfig::from_json(const std::string& text) {
  const std::string malformed = "the PS published a malformed configuration: ";
  try {
    const json j = json::parse(text);
    JobConfig c;
    c.num_keys = j.at("num_keys");
    c.dim = j.at("dim");
    c.optimizer.kind = parse_optimizer(j.at("optimizer"));
    c.optimizer.lr = j.at("lr");
    c.optimizer.weight_decay = j.at("weight_decay");
    c.seed = j.at("seed");
    c.shards = j.value("shards", std::uint32_t{1});
    c.transport = j.value("transport", "tcp");
    c.checkpoint_every = j.value("checkpoint_every", std::uint64_t{0});
    c.checkpoints = j.value("checkpoints", c.checkpoint_every > 0);
    c.restored_iteration = j.value("restored_iteration", std::int64_t{-1});
    c.disk_tier = j.value("row_tier", false);
    return c;
  } catch (const json::exception& e) {
    throw ProtocolError(malformed + e.what());
  } catch (const ConfigError& e) {  // an optimizer this build does not know
    throw ProtocolError(malformed + e.what());
  }
}

std::string checkpoint_record_key(std::int64_t iteration, std::uint32_t shard) {
  return "checkpoint/" + std::to_string(iteration) + "/" + std::to_string(shard);
}
std::string shards_whole_key(std::int64_t iteration) { return "whole/" + std::to_string(iteration); }
std::string restored_key(std::uint32_t shard) { return "restored/" + std::to_string(shard); }

std::optional<std::string> restored_disagree(const std::function<std::string(const std::string&)>& lookup, std::uint32_t shards) {
  auto said = [](const std::string& it) { return it == "-1" ? std::string("nothing") : "iteration " + it; };
  const std::string first = lookup(restored_key(0));
  std::string why;
  for (std::uint32_t s = 1; s < shards; ++s) {
    const std::string it = lookup(restored_key(s));
    if (it != first) why += (why.empty() ? "" : ", ") + ("shard " + std::to_string(s) + " restored " + said(it));
  }
  if (why.empty()) return std::nullopt;
  return "the shards restored different checkpoints: shard 0 restored " + said(first) + ", " + why +
         " (restore every shard from the same checkpoint: ember_launch.py --resume picks one that verifies for all)";
}
std::string dense_state_key(std::int64_t iteration, std::uint32_t worker) {
  return "dense/" + std::to_string(iteration) + "/" + std::to_string(worker);
}

bool dense_states_ok(const std::function<std::optional<std::string>(const std::string&)>& lookup, std::int64_t iteration,
                     std::uint32_t workers) {
  bool ok = true;
  // Every key is asked for (not just up to the first unknown): a lookup that does not
  // wait asks the coordinator once, and the answers arrive for the next call.
  for (std::uint32_t w = 0; w < workers; ++w) {
    const auto state = lookup(dense_state_key(iteration, w));
    ok = ok && state && (*state == "written" || *state == "none");
  }
  return ok;
}

}  // namespace ember::ps
