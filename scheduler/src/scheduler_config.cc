#include "ember/scheduler/scheduler_config.h"

#include <algorithm>
#include <cmath>

#include "ember/common/error.h"
#include "ember/common/types.h"
#include "ember/scheduler/fae_profile.h"
#include "ember/scheduler/global_batch.h"

namespace ember::scheduler {

Eviction parse_eviction(const std::string& text) {
  if (text == "lru") return Eviction::kLru;
  if (text == "lookahead") return Eviction::kLookahead;
  if (text == "belady") return Eviction::kBelady;
  throw ConfigError("unknown --eviction '" + text + "' (lru, lookahead, belady)");
}

Admission parse_admission(const std::string& text) {
  if (text == "none") return Admission::kNone;
  if (text == "tinylfu") return Admission::kTinyLfu;
  throw ConfigError("unknown --cache-admission '" + text + "' (none, tinylfu)");
}

const char* admission_name(Admission a) { return a == Admission::kTinyLfu ? "tinylfu" : "none"; }

const char* eviction_name(Eviction e) {
  switch (e) {
    case Eviction::kLru:
      return "lru";
    case Eviction::kLookahead:
      return "lookahead";
    case Eviction::kBelady:
      return "belady";
  }
  return "?";
}

void check_lookahead(const SchedulerConfig& c) {
  if (c.eviction != Eviction::kLru && c.lookahead == 0) {
    throw ConfigError("--eviction " + std::string(eviction_name(c.eviction)) + " needs --lookahead L >= 1");
  }
  if ((c.lookahead > 0 || c.eviction != Eviction::kLru) && c.policy.sync() == Sync::kBoundedStaleness) {
    throw ConfigError((c.lookahead > 0 && c.eviction != Eviction::kBelady ? std::string("--lookahead")
                                                                          : "--eviction " + std::string(eviction_name(c.eviction))) +
                      " does not apply to " + c.policy.name() + ": its stale copies are kept by version, not by next use");
  }
  if (c.prefetch && c.policy.sync() == Sync::kBoundedStaleness) {
    throw ConfigError("--prefetch does not apply to " + c.policy.name() + ": its pulls refresh stale copies by version");
  }
}

namespace {

// What dynamic tables do not support yet, refused in one line each.
void check_dynamic_tables(const SchedulerOptions& o, const Policy& p) {
  if (o.dynamic_slots == 0) throw ConfigError("a dataset of hashed ids needs its dynamic tables' slots (KeyDirectory)");
  const char* refused = o.lookahead > 0                                                ? "--lookahead"
                        : o.eviction != "auto" && o.eviction != "lru"                  ? "--eviction by next use"
                        : !o.placement.empty() || !o.placement_plan.treatments.empty() ? "--placement"
                        : o.scheduler_per_host                                         ? "--scheduler-per-host"
                        : o.prefetch                                                   ? "--prefetch"
                        : o.peer_sync                                                  ? "--peer-sync"
                                                                                       : nullptr;
  if (refused != nullptr) throw ConfigError(std::string(refused) + " does not apply to dynamic tables (hashed ids) yet");
  if (p.replicates_frequent_rows() || p.sync() == Sync::kBoundedStaleness) {
    throw ConfigError("--policy " + p.name() + " does not apply to dynamic tables (hashed ids) yet");
  }
}

}  // namespace

SchedulerConfig make_scheduler_config(const data::Dataset& ds, const SchedulerOptions& o) {
  SchedulerConfig c;
  static_cast<SchedulerCommon&>(c) = o;  // the settings that pass as they are, at once
  c.policy = parse_policy(o.policy);
  if (!o.stream.empty()) {
    // A stream's order is its files' (every worker reads the same), and what comes
    // later is not there to look at.
    if (o.shuffle) throw ConfigError("--shuffle does not apply to --stream: a stream is read in its files' order");
    if (o.lookahead > 0) throw ConfigError("--lookahead does not apply to --stream: later batches are not there yet");
  }
  if (ds.manifest().hashed_ids) {
    check_dynamic_tables(o, c.policy);
    // Every table's keys are slots of one space (KeyDirectory).
    c.table_offsets.assign(ds.manifest().tables.size(), 0);
    c.num_keys = o.dynamic_slots;
  } else {
    c.table_offsets = key_space(ds, o.table_rows);
    c.num_keys = c.table_offsets.back();
    c.table_offsets.pop_back();
  }
  if (ds.manifest().multi_hot) {
    for (const auto& t : ds.manifest().tables) c.bag_bound.push_back(t.max_bag);
  }
  c.cache_rows = cache_rows_for(o.cache_ratio, c.num_keys);
  if (o.for_training && c.policy.simulator_only()) {
    throw ConfigError("--policy " + c.policy.name() + " is simulator-only (ember-sim); training runs " + trainable_policies());
  }
  c.lookahead = o.lookahead;
  c.eviction = o.eviction == "auto" ? (o.lookahead > 0 ? Eviction::kLookahead : Eviction::kLru) : parse_eviction(o.eviction);
  c.admission = parse_admission(o.cache_admission);
  if (c.eviction == Eviction::kBelady) {
    if (o.for_training) throw ConfigError("--eviction belady needs the whole future (ember-sim only); training runs lru or lookahead");
    c.lookahead = static_cast<std::uint32_t>(o.iterations);  // the whole run
  } else if (c.lookahead > 0 && c.lookahead >= o.iterations) {
    throw ConfigError("--lookahead " + std::to_string(c.lookahead) + " reaches past the job's " + std::to_string(o.iterations) +
                      " iterations");
  }
  check_lookahead(c);
  if (o.eval_every > 0 && !ds.manifest().hashed_ids) c.evaluated_rows = validation_rows(ds, o.eval_samples);
  c.evaluation_flushes_all = ds.manifest().hashed_ids;
  c.hand_evaluated_rows = !o.scheduler_per_host;
  if (c.policy.replicates_frequent_rows()) c.replicated = profile_replicated_rows(ds, o, c.policy.replicated_fraction());
  if (!o.placement.empty()) {
    configure_placement(read_plan(o.placement, ds), "--placement " + o.placement, c);
  } else if (!o.placement_plan.treatments.empty()) {
    configure_placement(o.placement_plan, "the plan", c);
  }
  return c;
}

void configure_placement(const PlanFile& plan, const std::string& what, SchedulerConfig& c) {
  if (c.policy.sync() == Sync::kBoundedStaleness) {
    throw ConfigError(what + " does not apply to " + c.policy.name() + ": its copies are kept by version, not by treatment");
  }
  if (plan.batch_per_worker > 0 && plan.batch_per_worker != c.batch_per_worker) {
    throw ConfigError(what + " was made for --batch-per-worker " + std::to_string(plan.batch_per_worker) + "; the job runs " +
                      std::to_string(c.batch_per_worker) + " (its staging and cache depend on it: plan again)");
  }
  if (plan.treatments.size() != c.table_offsets.size()) {
    throw ConfigError(what + " has " + std::to_string(plan.treatments.size()) + " tables, the job " +
                      std::to_string(c.table_offsets.size()));
  }
  c.treatments = plan.treatments;
  c.cache_shares = plan.cache_shares;
  if (plan.cache_rows > 0) c.cache_rows = plan.cache_rows;
  for (std::size_t t = 0; t < c.treatments.size(); ++t) {
    if (c.treatments[t] == Treatment::kReplicated) {
      if (c.replicated.empty()) c.replicated.assign(c.num_keys, 0);
      std::ranges::fill(c.in_table(c.replicated, t), 1);
    } else if (c.treatments[t] == Treatment::kUncached) {
      if (c.uncached.empty()) c.uncached.assign(c.num_keys, 0);
      std::ranges::fill(c.in_table(c.uncached, t), 1);
    }
  }
  // fae's replicated rows of an uncached table stay replicated.
  if (!c.uncached.empty() && !c.replicated.empty()) {
    for (Key k = 0; k < c.num_keys; ++k) c.uncached[k] &= static_cast<std::uint8_t>(c.replicated[k] == 0);
  }
}

std::uint32_t SchedulerConfig::staging_rows() const {
  // A micro-batch stages at most its samples' ids of each uncached table.
  std::uint64_t n = 0;
  for (std::size_t t = 0; t < treatments.size(); ++t) {
    if (treatments[t] == Treatment::kUncached) n += static_cast<std::uint64_t>(batch_per_worker) * (bag_bound.empty() ? 1 : bag_bound[t]);
  }
  if (admission != Admission::kNone) n += cache_rows;
  if (n > UINT32_MAX / 2) throw ConfigError("the uncached tables' staging would need " + std::to_string(n) + " rows per worker");
  return static_cast<std::uint32_t>(n);
}

std::vector<std::uint64_t> key_space(const data::Dataset& ds, const std::vector<std::uint64_t>& table_rows) {
  const auto& tables = ds.manifest().tables;
  if (!table_rows.empty() && table_rows.size() != tables.size()) {
    throw ConfigError("table_rows has " + std::to_string(table_rows.size()) + " entries for " + std::to_string(tables.size()) + " tables");
  }
  std::vector<std::uint64_t> off;
  std::uint64_t acc = 0;
  for (std::size_t t = 0; t < tables.size(); ++t) {
    off.push_back(acc);
    acc += table_rows.empty() ? tables[t].rows : std::max(tables[t].rows, table_rows[t]);
  }
  off.push_back(acc);
  return off;
}

std::uint32_t cache_rows_for(double ratio, std::uint64_t total_rows) {
  if (!(ratio > 0 && ratio <= 1)) throw ConfigError("--cache-ratio must be in (0, 1]");
  double rows = std::ceil(ratio * static_cast<double>(total_rows));
  if (rows > 4e9) throw ConfigError("cache of " + std::to_string(rows) + " rows exceeds 2^32");
  return static_cast<std::uint32_t>(rows);
}

void set_hosts(SchedulerConfig& c, const SchedulerOptions& o, const std::vector<std::uint32_t>& host_of, std::uint32_t my_host) {
  if (c.host_allocation || c.peer_sync || o.scheduler_per_host) c.host_of = host_of;  // the same map on every worker
  if (o.scheduler_per_host) c.model_host = static_cast<int>(my_host);
}

data::BatchReader global_batch_reader(const data::Dataset& ds, const SchedulerOptions& o) {
  const std::uint64_t n = static_cast<std::uint64_t>(o.workers) * o.batch_per_worker;
  const data::SplitData& train = ds.split(data::Split::kTrain);
  if (n > train.rows()) {
    throw ConfigError("a global batch of " + std::to_string(n) + " samples (workers x batch-per-worker) exceeds the " +
                      std::to_string(train.rows()) + " training rows");
  }
  return data::BatchReader(train, {static_cast<std::size_t>(n), o.shuffle, o.seed, true});
}

}  // namespace ember::scheduler
