#include "batch_rows.h"

#include <algorithm>
#include <string>

#include "bits.h"
#include "ember/common/error.h"

namespace ember::scheduler {
namespace {

constexpr std::uint32_t kNoSlot = cache::LruIndex::kNone;

// ConfigError when a cache group of worker w cannot hold its rows of the micro-batch
// (kw: the worker's distinct rows).
void check_groups(const BatchRows& s, const WorkerCache& lru, std::uint32_t w, std::uint64_t iteration,
                  const std::vector<std::uint32_t>& kw) {
  // Each LRU of a worker holds its micro-batch's rows of that group's tables.
  std::vector<std::uint32_t> need(lru.groups(), 0);
  for (std::uint32_t d : kw) {
    if (!s.uncached_d[d]) ++need[lru.group(s.keys[d])];
  }
  for (std::uint32_t g = 0; g < need.size(); ++g) {
    if (need[g] > lru.group_capacity(g)) {
      throw ConfigError(std::string(g == 0 ? "the cache's pool" : "cache share " + std::to_string(g)) + " (" +
                        std::to_string(lru.group_capacity(g)) + " rows) cannot hold the " + std::to_string(need[g]) +
                        " distinct rows of its tables in worker " + std::to_string(w) + "'s micro-batch (iteration " +
                        std::to_string(iteration) + "); give it more rows");
    }
  }
}

}  // namespace

void index_batch(const SchedulerConfig& c, std::uint32_t tables, const GlobalBatch& batch, const cache::LocationMap& loc,
                 const KeyBits& seen, BatchRows& s) {
  const std::uint32_t n = batch.samples, T = batch.tables;
  if (T != tables)
    throw ConfigError("batch has " + std::to_string(T) + " tables; the scheduler was configured with " + std::to_string(tables));
  const bool replicates = c.replicates();
  const bool uncached = !c.uncached.empty();
  s.index.clear();
  // Sized by the last batch's distinct rows: a small table stays in L2 (it grows when
  // needed).
  s.index.reserve(2 * s.keys.size() + 1024);
  s.keys.clear();
  s.replicated_d.clear();
  s.uncached_d.clear();
  s.tables = T;
  s.dpos.resize(batch.keys.size());
  if (batch.multi_hot() ? batch.bags.size() != static_cast<std::size_t>(n) * T + 1 || batch.bags.back() != batch.keys.size()
                        : batch.keys.size() != static_cast<std::size_t>(n) * T) {
    throw ConfigError("batch " + std::to_string(batch.index) + ": its keys and bags do not match its " + std::to_string(n) +
                      " samples of " + std::to_string(T) + " tables");
  }
  for (std::size_t j = 0; j < s.dpos.size(); ++j) {
    const Key k = batch.keys[j];
    if (k >= c.num_keys)
      throw ConfigError("key " + std::to_string(k) + " is outside the " + std::to_string(c.num_keys) + " rows of the tables");
    auto [d, fresh] = s.index.try_emplace(k, static_cast<std::uint32_t>(s.keys.size()));
    if (fresh) {
      s.keys.push_back(k);
      s.replicated_d.push_back(replicates && c.replicated[k]);
      s.uncached_d.push_back(uncached && c.uncached[k]);
      loc.prefetch(k);
    }
    s.dpos[j] = *d;
  }
  const std::size_t D = s.keys.size();
  s.sstart.clear();
  s.srows.clear();
  if (batch.multi_hot()) {
    // Each sample's distinct rows: stamp[d] = the last sample (+ 1) that listed d.
    std::vector<std::uint32_t>& stamp = s.stamp;
    stamp.assign(D, 0);
    s.sstart.resize(n + 1);
    s.srows.reserve(batch.keys.size());
    for (std::uint32_t i = 0; i < n; ++i) {
      s.sstart[i] = static_cast<std::uint32_t>(s.srows.size());
      for (std::uint32_t j = batch.sample_begin(i), e = batch.sample_begin(i + 1); j < e; ++j) {
        const std::uint32_t d = s.dpos[j];
        if (stamp[d] == i + 1) continue;
        stamp[d] = i + 1;
        s.srows.push_back(d);
      }
    }
    s.sstart[n] = static_cast<std::uint32_t>(s.srows.size());
    for (std::uint32_t i = 0; i < n; ++i) {
      if (s.sstart[i + 1] - s.sstart[i] > UINT16_MAX) {
        throw ConfigError("batch " + std::to_string(batch.index) + ": sample " + std::to_string(i) + " has " +
                          std::to_string(s.sstart[i + 1] - s.sstart[i]) + " distinct rows; at most 65535 are supported");
      }
    }
  }
  s.owner_d.resize(D);
  s.partial_d.resize(D);
  s.cold_d.resize(D);
  for (std::size_t d = 0; d < D; ++d) {
    const Key k = s.keys[d];
    s.owner_d[d] = loc.owner(k);
    s.partial_d[d] = loc.has_partial(k);
    s.cold_d[d] = !seen.test(k);
  }
}

void index_trainers(const SchedulerConfig& c, std::uint64_t iteration, const GlobalBatch& /*batch*/, const std::vector<StepPlan>& plans,
                    const WorkerCache& shape, BatchRows& s) {
  const std::uint32_t W = c.workers;
  const bool replicates = c.replicates();
  const std::uint32_t D = s.size();
  s.replicated_rows.clear();
  if (replicates) {
    for (std::uint32_t d = 0; d < D; ++d) {
      if (s.replicated_d[d]) s.replicated_rows.push_back(d);
    }
  }
  // Each worker's distinct rows in micro-batch order, and how many trainers each row has.
  s.kw.resize(W);
  s.kpos.resize(W);
  s.stamp.assign(D, 0);
  s.tstart.assign(D + 1, 0);
  for (std::uint32_t w = 0; w < W; ++w) {
    auto& kw = s.kw[w];
    kw.clear();
    std::size_t staged = 0;
    for (std::uint32_t i : plans[w].samples) {
      for (std::uint32_t d : s.sample_rows(i)) {
        if (s.stamp[d] == w + 1 || (replicates && s.replicated_d[d])) continue;
        s.stamp[d] = w + 1;
        kw.push_back(d);
        ++s.tstart[d + 1];
        staged += s.uncached_d[d];
      }
    }
    if (shape.groups() > 1) check_groups(s, shape, w, iteration, kw);
    if (kw.size() - staged > shape.capacity()) {
      throw ConfigError("the cache of " + std::to_string(shape.capacity()) + " rows cannot hold the " + std::to_string(kw.size() - staged) +
                        " distinct rows of worker " + std::to_string(w) + "'s micro-batch (iteration " + std::to_string(iteration) +
                        "); raise --cache-ratio or lower --batch-per-worker");
    }
  }
  // Who trains each row: its entries, filled worker by worker (so in increasing order).
  for (std::uint32_t d = 0; d < D; ++d) s.tstart[d + 1] += s.tstart[d];
  s.tw.resize(s.tstart[D]);
  std::vector<std::uint32_t>& next = s.stamp;
  std::copy(s.tstart.begin(), s.tstart.end() - 1, next.begin());
  for (std::uint32_t w = 0; w < W; ++w) {
    const auto& kw = s.kw[w];
    auto& kpos = s.kpos[w];
    kpos.resize(kw.size());
    for (std::size_t j = 0; j < kw.size(); ++j) {
      const std::uint32_t e = next[kw[j]]++;
      s.tw[e] = static_cast<std::uint16_t>(w);
      kpos[j] = e;
    }
  }
  s.tslot.assign(s.tw.size(), kNoSlot);
  s.per_worker.assign(W, TrafficCounts{});
  s.evicted.resize(W);
  s.work.resize(W);
  for (auto& e : s.evicted) e.clear();
  s.peer_d.clear();
}

void index_ids(const GlobalBatch& batch, std::uint32_t w, BatchRows& s, StepPlan& plan) {
  s.row_of_d.resize(s.size());
  const auto& kw = s.kw[w];
  for (std::size_t j = 0; j < kw.size(); ++j) s.row_of_d[kw[j]] = static_cast<std::uint32_t>(j);
  for (std::size_t j = 0; j < s.replicated_rows.size(); ++j)
    s.row_of_d[s.replicated_rows[j]] = StepPlan::kReplicatedRow | static_cast<std::uint32_t>(j);
  plan.id_rows.clear();
  for (std::uint32_t i : plan.samples) {
    for (std::uint32_t j = batch.sample_begin(i), e = batch.sample_begin(i + 1); j < e; ++j) plan.id_rows.push_back(s.row_of_d[s.dpos[j]]);
  }
}

}  // namespace ember::scheduler
