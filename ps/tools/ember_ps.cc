// ember-ps: one parameter-server shard serving pulls and pushes over TCP or RDMA. Reads
// the flags into a DaemonConfig and runs a PsDaemon (ps/src/daemon.h).
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "ember/common/cli.h"
#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/common/log.h"
#include "ember/common/main.h"
#include "ember/ps/checkpoints.h"
#include "ember/transport/job_connection.h"
#include "ps_options.h"

namespace {

using namespace ember;
using ps::Flags;
namespace fs = std::filesystem;

// The rows of all tables: a dataset of hashed ids (dynamic tables) has `slots_per_shard`
// on each shard.
std::uint64_t rows_of_dataset(const fs::path& dir, std::uint64_t slots_per_shard, std::uint32_t shards, bool& hashed) {
  auto path = dir / "manifest.json";
  try {
    auto j = nlohmann::json::parse(read_file(path));
    hashed = j.value("ids", std::string()) == "hash";
    if (hashed) return slots_per_shard * shards;
    std::uint64_t n = 0;
    for (const auto& t : j.at("tables")) n += t.at("rows").get<std::uint64_t>();
    return n;
  } catch (const nlohmann::json::exception& e) {
    throw DataError(path.string() + ": " + e.what());
  }
}

// --verify-checkpoint: no shard, only the files.
int verify_checkpoint(const std::string& dir) {
  const ps::RestorePlan plan = ps::plan_restore(dir);
  for (const std::string& why : plan.skipped) spdlog::warn("--verify-checkpoint: passing over {}", why);
  if (!plan.verified) {
    for (const fs::path& file : plan.files) ps::verify_checkpoint_file(file);
  }
  std::printf("%s\n", plan.dir.string().c_str());
  return 0;
}

// Checks the flags and resolves them into f.c: the token, the rows, the optimizer.
// `slots_given`: --slots-per-shard on the command line (or in the config file).
void resolve(Flags& f, bool slots_given) {
  ps::DaemonConfig& c = f.c;
  ps::StoreConfig& sc = c.store;
  if (c.token.empty() && c.token_file.empty()) throw ConfigError("a job token is required (--token or --token-file)");
  transport::resolve_token(c);
  if (!f.dataset.empty()) {
    sc.num_keys = rows_of_dataset(f.dataset, f.slots_per_shard, sc.shards, sc.hashed_ids);
  } else if (slots_given) {
    // Dynamic tables without a dataset (a job on a --stream): slots for hashed ids.
    if (sc.num_keys != 0) throw ConfigError("--slots-per-shard (dynamic tables) and --num-keys (fixed tables) exclude each other");
    sc.hashed_ids = true;
    sc.num_keys = f.slots_per_shard * sc.shards;
  }
  if (sc.num_keys == 0) throw ConfigError("give --num-keys or --dataset");
  if ((c.checkpoint_on_exit || c.checkpoint_every > 0 || c.checkpoint_every_s > 0) && c.checkpoint_dir.empty()) {
    throw ConfigError("--checkpoint-on-exit, --checkpoint-every and --checkpoint-every-s need --checkpoint-dir");
  }
  sc.dim = f.rows.dim;
  sc.optimizer.kind = ps::parse_optimizer(f.rows.optimizer);
  sc.optimizer.lr = f.rows.lr;
  c.optimizer_name = f.rows.optimizer;
  c.listen = ps::parse_address(f.listen);
  if (!c.coordinator.empty() && c.workers == 0) throw ConfigError("--coordinator needs --workers (the job's worker count)");
  if (sc.shard >= sc.shards)
    throw ConfigError("--shard " + std::to_string(sc.shard) + " is not below --shards " + std::to_string(sc.shards));
  if (f.allocate != "lazy" && f.allocate != "upfront") throw ConfigError("--allocate '" + f.allocate + "': choose lazy or upfront");
  sc.allocate_up_front = f.allocate == "upfront";
  if (f.store_dir.empty() != (f.ram_budget_mb == 0)) throw ConfigError("--store-dir and --ram-budget-mb go together");
  if (f.ram_budget_mb < 0 || f.ram_budget_mb > 1e9)
    throw ConfigError("--ram-budget-mb " + std::to_string(f.ram_budget_mb) + ": out of range");
  if (c.checkpoint_full_every == 0) c.checkpoint_full_every = f.store_dir.empty() ? 1 : 8;
  sc.track_changes = c.checkpoint_full_every > 1 && !c.checkpoint_dir.empty();
  if (c.serving_deltas && c.checkpoint_dir.empty())
    throw ConfigError("--serving-deltas needs --checkpoint-dir (they go beside checkpoints)");
  sc.serving_deltas = c.serving_deltas;
  if (!f.store_dir.empty()) {
    sc.tier.dir = f.store_dir;
    sc.tier.hints = !f.no_hints;
    sc.tier.ram_budget_bytes = static_cast<std::uint64_t>(f.ram_budget_mb * 1048576.0);
    // What the tier's file holds: another table's directory is refused (disk_tier.h).
    std::error_code ec;
    const fs::path data = f.dataset.empty() ? fs::path() : fs::weakly_canonical(f.dataset, ec);
    sc.tier.table = "dataset " + (data.empty() ? std::string("(none)") : data.string()) + ", " + std::to_string(sc.num_keys) +
                    " keys, dim " + std::to_string(sc.dim) + ", " + f.rows.optimizer;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ember-ps: a parameter-server shard (embedding rows + optimizer state) over TCP or RDMA"};
  Flags f;
  add_config_option(app);
  ps::add_ps_options(app, f);  // every flag, declared in ps_options.cc
  if (const int status = parse_command_line(app, argc, argv, "ember-ps"); status >= 0) return status;
  return guarded_main("ember-ps", [&] {
    setup_logging(f.log_level);
    if (!f.verify_dir.empty()) return verify_checkpoint(f.verify_dir);
    resolve(f, app.get_option("--slots-per-shard")->count() > 0);
    ps::PsDaemon daemon(std::move(f.c));
    return daemon.run();
  });
}
