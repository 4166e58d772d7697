#include "report/held_rows.h"

#include <torch/torch.h>

#include <memory>
#include <string>

#include "ember/common/error.h"
#include "job/control_store.h"
#include "stages/ps_exchange.h"

namespace ember::worker {

namespace {

constexpr int kTag = 11;

torch::Tensor floats(std::vector<float>& v) { return torch::from_blob(v.data(), {static_cast<std::int64_t>(v.size())}, torch::kFloat32); }

// The values of `slots` (read_rows gives value then state; the evaluation needs the value).
std::vector<float> values_of(std::span<const std::uint32_t> slots, RowCache& cache, std::uint32_t dim) {
  std::vector<float> rows, out;
  if (slots.empty()) return out;
  cache.read_rows(slots, rows);
  const std::size_t width = rows.size() / slots.size();
  out.resize(slots.size() * dim);
  for (std::size_t i = 0; i < slots.size(); ++i) std::copy_n(rows.data() + i * width, dim, out.data() + i * dim);
  return out;
}

}  // namespace

RowHandover::RowHandover(const ConnectOptions& c, std::uint32_t workers, transport::ControlMember& control, std::uint32_t rank)
    : workers_(workers), rank_(rank) {
  if (workers < 2) return;
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<ControlStore>(control, "eval/", c.join_timeout);
  group_ = gloo_group(store, rank, workers, c, group_timeout(c));
}

HeldRows RowHandover::hand(const scheduler::StepPlan& plan, const std::vector<std::vector<Key>>& keys_of, RowCache& cache,
                           std::uint32_t dim) {
  HeldRows held;
  held.dim = dim;
  std::vector<float> mine = values_of(slots_of(plan.eval_hands), cache, dim);
  try {
    if (rank_ != 0) {
      if (!mine.empty()) {
        std::vector<torch::Tensor> t{floats(mine)};
        group_->send(t, 0, kTag)->wait();
      }
      return held;
    }
    // Worker 0: every worker's rows in rank order, each received straight into place.
    std::size_t total = 0;
    for (const auto& keys : keys_of) total += keys.size();
    held.values.resize(total * dim);
    std::vector<c10::intrusive_ptr<c10d::Work>> ops;
    std::vector<std::vector<torch::Tensor>> buffers;
    buffers.reserve(workers_);
    std::size_t at = 0;
    for (std::uint32_t w = 0; w < keys_of.size(); ++w) {
      float* into = held.values.data() + at * dim;
      const std::size_t n = keys_of[w].size();
      for (std::size_t j = 0; j < n; ++j) held.index.try_emplace(keys_of[w][j], static_cast<std::uint32_t>(at + j));
      if (w == 0) {
        if (mine.size() != n * dim) throw Error("RowHandover: worker 0's plan and its list of held rows disagree");
        std::copy(mine.begin(), mine.end(), into);
      } else if (n > 0) {
        buffers.push_back({torch::from_blob(into, {static_cast<std::int64_t>(n * dim)}, torch::kFloat32)});
        ops.push_back(group_->recv(buffers.back(), static_cast<int>(w), kTag));
      }
      at += n;
    }
    for (const auto& op : ops) op->wait();
  } catch (const c10::Error& e) {
    throw IoError(std::string("evaluation: handing held rows to worker 0 failed (a worker lost?): ") + e.what_without_backtrace());
  }
  return held;
}

}  // namespace ember::worker
