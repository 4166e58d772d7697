#include "ember/planner/search.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>

#include "ember/common/error.h"

namespace ember::planner {

std::vector<TableShape> table_shapes(const Frequencies& f, const Topology& topo) {
  const double n = static_cast<double>(f.samples);
  const double b = topo.batch_per_worker, g = static_cast<double>(topo.workers) * topo.batch_per_worker;
  std::vector<TableShape> out;
  for (const auto& t : f.tables) {
    TableShape s;
    s.name = t.name;
    s.rows = t.rows;
    s.max_bag = t.max_bag;
    for (std::uint32_t c : t.counts) {
      if (c == 0) continue;
      const double l = std::log1p(-std::min(static_cast<double>(c) / n, 1.0 - 1e-15));
      s.distinct_per_worker += -std::expm1(b * l);
      s.distinct_global += -std::expm1(g * l);
    }
    out.push_back(std::move(s));
  }
  return out;
}

Placement::Placement(PlacementInput in) : in_(std::move(in)) {
  if (in_.workers < 1 || in_.shards < 1 || in_.batch_per_worker < 1) throw ConfigError("workers, shards and batch must be at least 1");
  for (const auto& t : in_.tables) total_rows_ += t.rows;
}

double Placement::slot_bytes() const { return 4.0 * (in_.row.dim + in_.row.state); }

double Placement::micro_batch_rows(const TableShape& t) const {
  return static_cast<double>(std::min<std::uint64_t>(t.rows, static_cast<std::uint64_t>(in_.batch_per_worker) * t.max_bag));
}

double Placement::replicated_bytes(std::size_t t) const { return static_cast<double>(in_.tables[t].rows) * slot_bytes(); }

std::uint64_t Placement::min_memory() const {
  // Replicating a table of r <= b rows costs r slots, the staging of one not replicated
  // min(b, r): the cheapest plan costs the sum of min(b, r) slots.
  double m = 0;
  for (const auto& t : in_.tables) m += micro_batch_rows(t) * slot_bytes();
  return static_cast<std::uint64_t>(std::ceil(m));
}

const CostEstimate* Placement::model_at(std::uint32_t cache_rows) {
  // Quantized down to a few sizes (the model run is the expensive part): a ratio of all
  // rows from a short grid, or below it a power of two of rows.
  static constexpr double kGrid[] = {1.0, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005, 0.002, 0.001};
  const double total = static_cast<double>(total_rows_);
  std::uint64_t rows = 0;
  for (double r : kGrid) {
    const auto q = static_cast<std::uint64_t>(std::ceil(r * total));
    if (q <= cache_rows) {
      rows = q;
      break;
    }
  }
  if (rows == 0) {
    rows = 1;
    while (rows * 2 <= cache_rows) rows *= 2;
  }
  for (const auto& [k, est] : cache_) {
    if (k == rows) return est ? &*est : nullptr;
  }
  // ceil(ratio x total) = rows (cache_rows_for), up to rounding: aim inside the interval.
  const double ratio = std::min(1.0, (static_cast<double>(rows) - 0.5) / total);
  std::optional<CostEstimate> est;
  try {
    est = in_.cache_model(ratio);
  } catch (const ConfigError&) {
    // The simulator refuses a cache smaller than a micro-batch's distinct rows (all
    // tables'): such a plan counts as infeasible.
  }
  cache_.emplace_back(rows, std::move(est));
  return cache_.back().second ? &*cache_.back().second : nullptr;
}

PlanCost Placement::evaluate(const std::vector<Treatment>& plan) {
  PlanCost pc;
  const double W = in_.workers, S = in_.shards;
  // As the worker allocates: the replicated tables whole, b staging slots per uncached
  // table, and the cache the cached tables share (at least a micro-batch's rows of each).
  double rep = 0, need = 0, cached_rows = 0, staging = 0;
  bool any_cache = false;
  for (std::size_t t = 0; t < plan.size(); ++t) {
    if (plan[t] == Treatment::kReplicated) {
      rep += replicated_bytes(t);
    } else if (plan[t] == Treatment::kUncached) {
      staging += static_cast<double>(in_.batch_per_worker) * in_.tables[t].max_bag;  // as SchedulerConfig::staging_rows
    } else {
      need += micro_batch_rows(in_.tables[t]);
      cached_rows += static_cast<double>(in_.tables[t].rows);
      any_cache = true;
    }
  }
  const double left = static_cast<double>(in_.memory) - rep - staging * slot_bytes();
  const double slots = left > 0 ? std::floor(left / slot_bytes()) : 0.0;
  pc.cache_rows = static_cast<std::uint32_t>(std::min({slots, cached_rows, 4e9}));
  pc.memory = static_cast<std::uint64_t>(std::ceil(rep + (pc.cache_rows + staging) * slot_bytes()));
  pc.feasible = left >= 0 && static_cast<double>(pc.cache_rows) >= need;
  pc.tables.resize(plan.size());
  auto infeasible = [&pc] {
    pc.feasible = false;
    pc.worker_link = pc.ps_link = pc.total = pc.worker_s = pc.ps_s = std::numeric_limits<double>::infinity();
    return pc;
  };
  if (!pc.feasible) return infeasible();
  const CostEstimate* est = nullptr;
  if (any_cache) {
    est = model_at(pc.cache_rows);
    if (est == nullptr) return infeasible();
    pc.modelled_cache = est->cache_rows;
  }
  const auto& f = in_.row;
  const double pull = static_cast<double>(scheduler::pull_bytes(1, f, false)), grad = static_cast<double>(scheduler::grad_bytes(1, f));
  for (std::size_t t = 0; t < plan.size(); ++t) {
    TableOutcome& o = pc.tables[t];
    const TableShape& sh = in_.tables[t];
    o.treatment = plan[t];
    switch (plan[t]) {
      case Treatment::kCache:
        cached_outcome(o, est->tables[t]);
        break;
      case Treatment::kUncached: {
        // Every worker pulls its E(b) rows and pushes their gradients; nothing stays.
        o.rows = 2 * W * sh.distinct_per_worker;
        o.bytes = W * sh.distinct_per_worker * (pull + grad);
        o.worker_link = o.bytes / W;
        o.ps_link = o.bytes / S;
        break;
      }
      case Treatment::kReplicated: {
        // Ring all-reduce of the gradients of the global batch's distinct rows, E(n) of
        // them: every worker knows which from the shared plan, so no keys travel, and it
        // is never more than the whole table dense. 2 (W - 1) / W of it per worker link.
        o.rows = sh.distinct_global;
        pc.allreduce_rows += sh.distinct_global * 4.0 * f.dim;
        o.worker_link = sh.distinct_global * 4.0 * f.dim * 2 * (W - 1) / W;
        o.bytes = o.worker_link * W;
        o.ps_link = 0;
        o.memory = replicated_bytes(t);
        break;
      }
    }
  }
  add_up(pc);
  return pc;
}

void Placement::cached_outcome(TableOutcome& o, const TableCost& tc) const {
  // The table's bytes from the PS + cache model, spread evenly over the W worker links
  // and the S shard links.
  o.rows = tc.pulls + tc.pushes();
  o.bytes = tc.bytes;
  o.worker_link = tc.bytes / in_.workers;
  o.ps_link = tc.bytes / in_.shards;
}

void Placement::add_up(PlanCost& c) const {
  c.worker_link = c.ps_link = c.total = 0;
  for (const TableOutcome& o : c.tables) {
    c.worker_link += o.worker_link;
    c.ps_link += o.ps_link;
    c.total += o.bytes;
  }
  c.worker_s = c.worker_link * 8 / (in_.worker_mbit * 1e6);
  c.ps_s = c.ps_link * 8 / (in_.ps_mbit * 1e6);
}

PlanCost Placement::with_cache_cost(PlanCost c, const CostEstimate& est) const {
  if (!c.feasible) return c;
  for (std::size_t t = 0; t < c.tables.size(); ++t) {
    if (c.tables[t].treatment == Treatment::kCache) cached_outcome(c.tables[t], est.tables[t]);
  }
  add_up(c);
  c.modelled_cache = c.cache_rows;
  return c;
}

ShareChoice choose_shares(const Placement& pl, const std::vector<Treatment>& plan, const PlanCost& c,
                          const std::function<CostEstimate(const std::vector<std::uint32_t>& shares)>& model) {
  const PlacementInput& in = pl.input();
  std::vector<std::size_t> cached;
  for (std::size_t t = 0; t < plan.size(); ++t) {
    if (plan[t] == Treatment::kCache) cached.push_back(t);
  }
  ShareChoice best;
  best.cost = pl.with_cache_cost(c, model({}));
  best.tried.emplace_back(best.label, best.cost);
  const double bar = 0.99 * best.cost.busiest_s();
  if (cached.size() < 2 || !c.feasible) return best;
  const double C = c.cache_rows;
  auto least = [&](std::size_t t) { return pl.micro_batch_rows(in.tables[t]); };
  auto try_shares = [&](const std::string& label, std::vector<std::uint32_t> shares) {
    // Each share, and the pool, must hold a micro-batch's rows of its tables (the pool a row
    // at least).
    double sum = 0, pool_need = 1;
    for (std::size_t t : cached) {
      if (shares[t] > 0 && shares[t] < least(t)) return;
      if (shares[t] == 0) pool_need += least(t);
      sum += shares[t];
    }
    if (C - sum < pool_need) return;
    PlanCost pc;
    try {
      pc = pl.with_cache_cost(c, model(shares));
    } catch (const ConfigError&) {
      return;  // the simulator refused it
    }
    best.tried.emplace_back(label, pc);
    if (pc.busiest_s() <= bar && better(pc, best.cost)) {
      best.cost = pc;
      best.shares = std::move(shares);
      best.label = label;
    }
  };
  // Every cached table a share of (C - 1) rows by a weight (the pool keeps one row).
  auto by_weight = [&](const std::string& label, const std::function<double(std::size_t)>& weight) {
    double total = 0;
    for (std::size_t t : cached) total += weight(t);
    std::vector<std::uint32_t> shares(plan.size(), 0);
    for (std::size_t t : cached) shares[t] = static_cast<std::uint32_t>(std::floor((C - 1) * weight(t) / total));
    try_shares(label, std::move(shares));
  };
  auto rows = [&](std::size_t t) { return static_cast<double>(in.tables[t].rows); };
  auto touched = [&](std::size_t t) { return in.workers * in.tables[t].distinct_per_worker; };
  by_weight("every cached table, by rows", rows);
  by_weight("every cached table, by rows touched", touched);
  by_weight("every cached table, by sqrt(rows x touched)", [&](std::size_t t) { return std::sqrt(rows(t) * touched(t)); });
  std::vector<std::size_t> big = cached;
  std::stable_sort(big.begin(), big.end(), [&](std::size_t a, std::size_t b) { return in.tables[a].rows > in.tables[b].rows; });
  for (double cap : {0.1, 0.2, 0.3}) {
    std::vector<std::uint32_t> shares(plan.size(), 0);
    for (std::size_t i = 0; i < 2; ++i) shares[big[i]] = static_cast<std::uint32_t>(std::floor(cap * C));
    try_shares("the two largest cached tables, " + std::to_string(static_cast<int>(cap * 100)) + "% each", std::move(shares));
  }
  return best;
}

bool better(const PlanCost& a, const PlanCost& b) {
  if (a.feasible != b.feasible) return a.feasible;
  if (!a.feasible) return false;
  const double x = a.busiest_s(), y = b.busiest_s();
  if (x < y * (1 - 1e-12)) return true;
  if (y < x * (1 - 1e-12)) return false;
  return a.total < b.total * (1 - 1e-12);
}

std::vector<std::size_t> Placement::order_by(const std::string& key) const {
  std::vector<double> v(in_.tables.size());
  for (std::size_t t = 0; t < v.size(); ++t) {
    const double rows = static_cast<double>(in_.tables[t].rows), touched = in_.workers * in_.tables[t].distinct_per_worker;
    if (key == "size") {
      v[t] = rows;
    } else if (key == "lookups") {
      v[t] = touched;
    } else if (key == "size_x_lookups") {
      v[t] = rows * touched;
    } else {
      throw ConfigError("unknown order '" + key + "'");
    }
  }
  std::vector<std::size_t> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return v[a] > v[b]; });
  return order;
}

std::vector<Treatment> Placement::greedy(const std::vector<std::size_t>& order) {
  std::vector<Treatment> plan(in_.tables.size(), Treatment::kCache);
  PlanCost cur = evaluate(plan);
  for (std::size_t t : order) {
    for (Treatment tr : {Treatment::kReplicated, Treatment::kUncached, Treatment::kCache}) {
      if (tr == plan[t]) continue;
      std::vector<Treatment> cand = plan;
      cand[t] = tr;
      PlanCost c = evaluate(cand);
      if (better(c, cur)) {
        plan = std::move(cand);
        cur = std::move(c);
      }
    }
  }
  return plan;
}

std::vector<Treatment> Placement::search(const std::vector<Treatment>& seed, std::size_t beam) {
  constexpr Treatment kAll[] = {Treatment::kCache, Treatment::kReplicated, Treatment::kUncached};
  const std::size_t T = in_.tables.size();
  // Beam: tables by size x lookups, each expanded with the three treatments (the tables
  // not decided yet cached), the `beam` best kept.
  std::vector<std::pair<std::vector<Treatment>, PlanCost>> states;
  {
    std::vector<Treatment> all(T, Treatment::kCache);
    PlanCost c = evaluate(all);
    states.emplace_back(std::move(all), std::move(c));
  }
  for (std::size_t t : order_by("size_x_lookups")) {
    std::vector<std::pair<std::vector<Treatment>, PlanCost>> next;
    for (const auto& [plan, cost] : states) {
      for (Treatment tr : kAll) {
        std::vector<Treatment> cand = plan;
        cand[t] = tr;
        PlanCost c = tr == plan[t] ? cost : evaluate(cand);
        if (c.feasible) next.emplace_back(std::move(cand), std::move(c));
      }
    }
    std::stable_sort(next.begin(), next.end(), [](const auto& a, const auto& b) { return better(a.second, b.second); });
    if (next.size() > beam) next.resize(beam);
    if (!next.empty()) states = std::move(next);
  }
  // Local moves (one table's treatment, then two tables' at once) from the beam's best
  // and from the seed, until none improves.
  auto improve = [&](std::vector<Treatment> plan) {
    PlanCost cur = evaluate(plan);
    for (bool moved = true; moved;) {
      moved = false;
      for (std::size_t t = 0; t < T && !moved; ++t) {
        for (Treatment tr : kAll) {
          if (tr == plan[t]) continue;
          std::vector<Treatment> cand = plan;
          cand[t] = tr;
          PlanCost c = evaluate(cand);
          if (better(c, cur)) {
            plan = std::move(cand), cur = std::move(c), moved = true;
            break;
          }
        }
      }
      for (std::size_t a = 0; a < T && !moved; ++a) {
        for (std::size_t b = a + 1; b < T && !moved; ++b) {
          for (Treatment ta : kAll) {
            for (Treatment tb : kAll) {
              if (moved || ta == plan[a] || tb == plan[b]) continue;
              std::vector<Treatment> cand = plan;
              cand[a] = ta;
              cand[b] = tb;
              PlanCost c = evaluate(cand);
              if (better(c, cur)) plan = std::move(cand), cur = std::move(c), moved = true;
            }
          }
        }
      }
    }
    return std::make_pair(plan, cur);
  };
  auto x = improve(states.front().first);
  auto y = improve(seed);
  return better(y.second, x.second) ? y.first : x.first;
}

Calibration read_calibration(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw IoError("cannot read calibration " + path.string());
  const std::string p = "calibration " + path.string();
  Calibration c;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    c.cpu_s = j.at("cpu_s").get<double>();
    c.cpu_s_per_ps_byte = j.at("cpu_s_per_ps_byte").get<double>();
    c.allreduce_s = j.at("allreduce_s").get<double>();
    c.allreduce_s_per_byte = j.at("allreduce_s_per_byte").get<double>();
    c.dense_allreduce_bytes = j.at("dense_allreduce_bytes").get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(p + ": " + std::string(e.what()));
  }
  return c;
}

double iteration_seconds(const PlanCost& c, const Calibration& cal) {
  if (!c.feasible) return std::numeric_limits<double>::infinity();
  return cal.cpu_s + cal.cpu_s_per_ps_byte * c.ps_link + cal.allreduce_s +
         cal.allreduce_s_per_byte * (cal.dense_allreduce_bytes + c.allreduce_rows) + c.busiest_s();
}

std::uint64_t parse_bytes(const std::string& s) {
  std::size_t end = 0;
  double v = 0;
  try {
    v = std::stod(s, &end);
  } catch (const std::exception&) {
    throw ConfigError("'" + s + "' is not a size (bytes, or with K, M, G)");
  }
  double mult = 1;
  const std::string suf = s.substr(end);
  if (suf.size() == 1) {
    switch (std::toupper(static_cast<unsigned char>(suf[0]))) {
      case 'K':
        mult = 1024.0;
        break;
      case 'M':
        mult = 1024.0 * 1024;
        break;
      case 'G':
        mult = 1024.0 * 1024 * 1024;
        break;
      default:
        throw ConfigError("'" + s + "' is not a size (bytes, or with K, M, G)");
    }
  } else if (!suf.empty()) {
    throw ConfigError("'" + s + "' is not a size (bytes, or with K, M, G)");
  }
  if (!(v >= 0) || v * mult > 1.8e19) throw ConfigError("'" + s + "' is not a size (bytes, or with K, M, G)");
  return static_cast<std::uint64_t>(v * mult);
}

}  // namespace ember::planner
