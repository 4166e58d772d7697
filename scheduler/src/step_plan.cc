#include "ember/scheduler/step_plan.h"

#include "ember/common/error.h"
#include "ember/scheduler/global_batch.h"

namespace ember::scheduler {

void StepPlan::clear() {
  samples.clear();
  push_grads.clear();
  push_values.clear();
  hand_values.clear();
  hand_grads.clear();
  pulls.clear();
  rows.clear();
  end_pushes.clear();
  drops.clear();
  replicated.clear();
  replicated_flush.clear();
  eval_hands.clear();
  id_rows.clear();
}

TrafficCounts& TrafficCounts::operator+=(const TrafficCounts& o) {
  pulls += o.pulls;
  push_grad += o.push_grad;
  push_value += o.push_value;
  push_evict += o.push_evict;
  hits += o.hits;
  hot_sync += o.hot_sync;
  cold_pulls += o.cold_pulls;
  not_admitted += o.not_admitted;
  pull_state += o.pull_state;
  prefetched += o.prefetched;
  evict_partial += o.evict_partial;
  flush_grad += o.flush_grad;
  flush_value += o.flush_value;
  hot_flush += o.hot_flush;
  eval_handed += o.eval_handed;
  peer_value += o.peer_value;
  peer_grad += o.peer_grad;
  return *this;
}

std::uint64_t pull_bytes(std::uint64_t n, RowFormat f, bool with_state) { return n * (8 + 4ull * (f.dim + (with_state ? f.state : 0))); }
std::uint64_t grad_bytes(std::uint64_t n, RowFormat f) { return n * (16 + 4ull * f.dim); }
std::uint64_t value_bytes(std::uint64_t n, RowFormat f) { return n * (8 + 4ull * (f.dim + f.state)); }

WireBytes wire_bytes(const TrafficCounts& c, RowFormat f) {
  WireBytes b;
  b.pull = pull_bytes(c.pull_state, f, true) + pull_bytes(c.pulls - c.pull_state, f, false);
  b.push_grad = grad_bytes(c.push_grad, f);
  b.push_value = value_bytes(c.push_value, f);
  b.push_evict = value_bytes(c.push_evict - c.evict_partial, f) + grad_bytes(c.evict_partial, f);
  b.flush = value_bytes(c.flush_value + c.hot_flush, f) + grad_bytes(c.flush_grad, f);
  b.peer = value_bytes(c.peer_value, f) + grad_bytes(c.peer_grad, f);
  return b;
}

void global_keys(const data::Batch& batch, std::size_t n, const std::vector<std::uint64_t>& offsets, std::vector<Key>& out,
                 std::vector<std::uint32_t>& bags) {
  const auto nt = static_cast<std::uint32_t>(offsets.size());
  bags.clear();
  if (n > 0 && batch.multi_hot()) {
    // Sample by sample, bag by bag: the sample-major order the shards store.
    out.clear();
    bags.reserve(n * nt + 1);
    for (std::size_t i = 0; i < n; ++i) {
      for (std::uint32_t t = 0; t < nt; ++t) {
        bags.push_back(static_cast<std::uint32_t>(out.size()));
        const std::uint64_t off = offsets[t];
        batch.for_each_id(static_cast<int>(t), i, [&](std::uint64_t id) { out.push_back(off + id); });
      }
    }
    if (out.size() > UINT32_MAX) throw ConfigError("a global batch of more than 2^32 - 1 ids; lower the batch size");
    bags.push_back(static_cast<std::uint32_t>(out.size()));
    return;
  }
  out.resize(n * nt);
  if (const data::Shard* sh = batch.contiguous_shard()) {
    // Zero-copy columns: read table by table.
    const std::uint64_t r0 = batch.first_row();
    for (std::uint32_t t = 0; t < nt; ++t) {
      const std::uint64_t off = offsets[t];
      for (std::size_t i = 0; i < n; ++i) out[i * nt + t] = off + sh->id(static_cast<int>(t), r0 + i);
    }
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    for (std::uint32_t t = 0; t < nt; ++t) out[i * nt + t] = offsets[t] + batch.id(static_cast<int>(t), i);
  }
}

void to_global_batch(const data::Batch& batch, const std::vector<std::uint64_t>& offsets, GlobalBatch& out) {
  out.index = batch.index();
  out.samples = static_cast<std::uint32_t>(batch.size());
  out.tables = static_cast<std::uint32_t>(offsets.size());
  global_keys(batch, batch.size(), offsets, out.keys, out.bags);
}

ValidationReader::ValidationReader(const data::Dataset& ds, std::uint64_t samples)
    : offsets_(ds.manifest().table_offsets()), samples_(samples) {
  const auto& val = ds.split(data::Split::kVal);
  if (val.rows() == 0) return;
  data::BatchOptions bo;
  bo.batch_size = kValidationBatch;
  bo.drop_last = false;
  reader_.emplace(val, bo);
}

bool ValidationReader::next(data::Batch& b, std::size_t& n, std::vector<Key>& keys, std::vector<std::uint32_t>& bags) {
  if (!reader_ || !reader_->next(b)) return false;
  n = b.size();
  if (samples_ > 0) n = static_cast<std::size_t>(std::min<std::uint64_t>(n, samples_ - read_));
  if (n == 0) return false;
  global_keys(b, n, offsets_, keys, bags);
  read_ += n;
  return true;
}

std::vector<Key> validation_rows(const data::Dataset& ds, std::uint64_t samples) {
  std::vector<Key> rows, keys;
  std::vector<std::uint32_t> bags;
  ValidationReader reader(ds, samples);
  data::Batch b;
  std::size_t n = 0;
  while (reader.next(b, n, keys, bags)) rows.insert(rows.end(), keys.begin(), keys.end());
  return rows;
}

}  // namespace ember::scheduler
