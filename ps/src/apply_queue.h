// ShardStore's apply queue (its third job): the applier threads that apply committed
// batches, and what readers waiting for an apply watch. Private to the store's sources.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "ember/common/process.h"
#include "ember/ps/shard_store.h"

namespace ember::ps {

// The threads that apply committed batches, and what waiters watch: `in_flight` counts
// batches taken by commits and not applied yet; `applied` changes (and wakes waiters)
// each time one is, or batches are parked. Apart from the store so that a store can be
// moved while idle. Each job is one batch (one receiving thread's rows), so with several
// threads the rows of several connections are applied at once.
struct ShardStore::Applier {
  std::atomic<std::uint32_t> in_flight{0};
  std::atomic<std::uint32_t> applied{0};
  // Held shared while a batch is applied; save() holds it exclusively.
  std::shared_mutex gate;
  std::mutex mu;  // guards the rest
  std::condition_variable cv;
  struct Job {
    ShardStore* store;
    Batch batch;
  };
  std::deque<Job> jobs;
  bool stop = false;
  std::vector<std::thread> threads;

  explicit Applier(std::uint32_t count) {
    for (std::uint32_t i = 0; i < count; ++i) {
      threads.emplace_back([this, i] {
        name_this_thread("ps-apply-" + std::to_string(i));
        std::unique_lock<std::mutex> lock(mu);
        while (true) {
          cv.wait(lock, [&] { return stop || !jobs.empty(); });
          if (jobs.empty()) return;  // stopping, nothing left
          Job job = std::move(jobs.front());
          jobs.pop_front();
          lock.unlock();
          job.store->finish_batch(job.batch);
          lock.lock();
        }
      });
    }
  }
  // Queues a commit's batches, a job each.
  void submit(ShardStore* store, std::vector<Batch> batches) {
    {
      std::lock_guard<std::mutex> lock(mu);
      for (Batch& b : batches) jobs.push_back(Job{store, std::move(b)});
    }
    if (batches.size() == 1) {
      cv.notify_one();
    } else {
      cv.notify_all();
    }
  }
  ~Applier() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    for (auto& t : threads) t.join();
  }
  // Something changed for waiters: a batch was applied (or a commit took none), or
  // batches were parked (that a waiter may apply).
  void done() {
    in_flight.fetch_sub(1, std::memory_order_acq_rel);
    applied.fetch_add(1, std::memory_order_release);
    applied.notify_all();
  }
};

}  // namespace ember::ps
