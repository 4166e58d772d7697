#include "ember/ps/shard_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "../data/test_util.h"
#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/common/hash.h"
#include "ember/ps/checkpoints.h"
#include "ember/ps/initial_rows.h"
#include "ember/ps/protocol.h"
#include "ember/ps/serving_delta.h"

namespace ember::ps {
namespace {

constexpr std::uint32_t kDim = 4;
constexpr std::uint64_t kKeys = 500;

StoreConfig store_config(OptimizerKind kind, std::uint32_t shard, std::uint32_t shards) {
  StoreConfig c;
  c.num_keys = kKeys;
  c.dim = kDim;
  c.shard = shard;
  c.shards = shards;
  c.seed = 9;
  c.optimizer.kind = kind;
  c.optimizer.lr = 0.05f;
  c.optimizer.weight_decay = 0.001f;
  c.lr_at = [](std::uint64_t it) { return 0.05f / (1.0f + 0.1f * static_cast<float>(it)); };
  return c;
}

// A single-process reference: each iteration, every row's gradients summed over the
// workers and applied once, with that iteration's learning rate.
struct Reference {
  OptimizerConfig opt;
  std::map<Key, std::vector<float>> rows;  // value + state
  std::vector<float>& row(Key k) {
    auto it = rows.find(k);
    if (it == rows.end()) {
      std::vector<float> r(kDim + state_floats(opt.kind, kDim));
      initial_row(9, k, kDim, r.data());
      init_state(opt, kDim, r.data() + kDim);
      it = rows.emplace(k, r).first;
    }
    return it->second;
  }
};

class ShardStoreTest : public test::TempDirTest, public ::testing::WithParamInterface<OptimizerKind> {};

// Two PS shards fed by two workers for BSP rounds, against the reference; every
// optimizer.
TEST_P(ShardStoreTest, BspRoundsOverTwoShardsMatchOneProcess) {
  const OptimizerKind kind = GetParam();
  std::vector<ShardStore> shards;
  for (std::uint32_t s = 0; s < 2; ++s) shards.emplace_back(store_config(kind, s, 2));
  Reference ref;
  ref.opt = store_config(kind, 0, 1).optimizer;
  std::mt19937_64 rng(4);
  std::normal_distribution<float> g(0, 1);
  for (std::uint64_t it = 0; it < 30; ++it) {
    // Each worker trains a few rows; some rows are trained by both.
    std::map<Key, std::vector<std::vector<float>>> grads;
    for (int w = 0; w < 2; ++w) {
      for (int j = 0; j < 20; ++j) {
        Key k = rng() % 60;
        std::vector<float> gr(kDim);
        for (auto& x : gr) x = g(rng);
        grads[k].push_back(gr);
      }
    }
    for (auto& [k, list] : grads) {
      ShardStore& s = shards[owner_shard(k, 2)];
      for (auto& gr : list) {
        Key key = k;
        std::uint32_t trainers = static_cast<std::uint32_t>(list.size());
        s.push_grad(it, {&key, 1}, {&trainers, 1}, gr.data());
      }
      std::vector<float> sum(kDim, 0);
      for (auto& gr : list) {
        for (std::uint32_t j = 0; j < kDim; ++j) sum[j] += gr[j];
      }
      auto& r = ref.row(k);
      apply(ref.opt, 0.05f / (1.0f + 0.1f * static_cast<float>(it)), kDim, r.data(), r.data() + kDim, sum.data());
    }
    for (auto& s : shards) s.commit();
  }
  for (auto& [k, r] : ref.rows) {
    const float* got = shards[owner_shard(k, 2)].row(k);
    for (std::uint32_t j = 0; j < kDim + state_floats(kind, kDim); ++j) ASSERT_NEAR(got[j], r[j], 1e-5) << "key " << k << " float " << j;
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ShardStoreTest,
                         ::testing::Values(OptimizerKind::kSgd, OptimizerKind::kAdagrad, OptimizerKind::kRowWiseAdagrad,
                                           OptimizerKind::kAdam));

// A row trained by three or more workers gets the same update whatever order their
// pushes arrive in (summed in arrival order, 1e8 + 1 - 1e8 gives 0 one way and 1
// another); two contributions sum alike in either order.
TEST(ShardStore, AggregationsDoNotDependOnArrivalOrder) {
  for (std::uint32_t n : {2u, 3u, 4u, 5u}) {
    // Contributions whose float sums depend on their order.
    std::vector<std::vector<float>> contribution(n, std::vector<float>(kDim));
    const float big[5] = {1e8f, 1.0f, -1e8f, 3.0f, 0.5f};
    for (std::uint32_t c = 0; c < n; ++c) {
      for (std::uint32_t d = 0; d < kDim; ++d) contribution[c][d] = big[c] * static_cast<float>(d + 1) + 0.25f * static_cast<float>(c);
    }
    std::vector<std::uint32_t> order(n);
    for (std::uint32_t i = 0; i < n; ++i) order[i] = i;
    std::vector<float> first;
    std::set<std::vector<float>> sums_by_arrival;
    do {
      ShardStore s(store_config(OptimizerKind::kSgd, 0, 1));
      Key k = 9;
      std::vector<float> naive(kDim, 0);
      for (std::uint32_t c : order) {
        s.push_grad(2, {&k, 1}, {&n, 1}, contribution[c].data());
        for (std::uint32_t d = 0; d < kDim; ++d) naive[d] += contribution[c][d];
      }
      sums_by_arrival.insert(naive);
      s.commit();
      std::vector<float> row(s.row(k), s.row(k) + kDim);
      if (first.empty()) first = row;
      ASSERT_EQ(std::memcmp(row.data(), first.data(), kDim * sizeof(float)), 0) << n << " trainers";
    } while (std::next_permutation(order.begin(), order.end()));
    if (n >= 3) {
      EXPECT_GT(sums_by_arrival.size(), 1u) << "the arrival-order sums differ, so the test can tell";
    }
  }
  // More trainers than a row can have is refused.
  ShardStore s(store_config(OptimizerKind::kSgd, 0, 1));
  Key k = 1;
  std::uint32_t many = ShardStore::kMaxTrainers + 1;
  float g[kDim] = {};
  EXPECT_THROW(s.push_grad(0, {&k, 1}, {&many, 1}, g), ProtocolError);
}

TEST(ShardStore, PartialAggregationWaitsForEveryTrainerAndUsesItsIterationsRate) {
  ShardStore s(store_config(OptimizerKind::kSgd, 0, 1));
  Key k = 7;
  std::uint32_t two = 2;
  float g[kDim] = {1, 1, 1, 1};
  std::vector<float> before(s.row(k), s.row(k) + kDim);
  s.push_grad(3, {&k, 1}, {&two, 1}, g);  // one holder evicted its partial at iteration 3
  EXPECT_EQ(s.commit(), 0u);
  EXPECT_EQ(s.row(k)[0], before[0]);
  EXPECT_THROW(s.push_grad(4, {&k, 1}, {&two, 1}, g), ProtocolError);  // a different iteration
  s.push_grad(3, {&k, 1}, {&two, 1}, g);                               // the other holder, when the row is next needed
  EXPECT_EQ(s.commit(), 1u);
  const float lr3 = 0.05f / 1.3f;
  EXPECT_NEAR(s.row(k)[0], before[0] - lr3 * (2.0f + 0.001f * before[0]), 1e-6);
  EXPECT_EQ(s.pending(), 0u);
}

// Per-host aggregation: a host pushes one gradient that sums several of a row's
// trainers, with its share; the row completes once the shares reach its trainers, and
// the update equals the one from every trainer pushing alone.
TEST(ShardStore, HostSumsCountAsTheTrainersTheySum) {
  const std::vector<std::vector<float>> part = {{1, 2, 3, 4}, {0.5f, 0.25f, 1, 2}, {3, 1, 0, 1}, {2, 2, 2, 2}};
  std::vector<float> host_a(kDim), host_b(kDim);
  for (std::uint32_t d = 0; d < kDim; ++d) {
    host_a[d] = part[0][d] + part[1][d] + part[2][d];  // a host of three trainers
    host_b[d] = part[3][d];                            // one alone on its host
  }
  for (auto kind : {OptimizerKind::kSgd, OptimizerKind::kAdagrad}) {
    ShardStore alone(store_config(kind, 0, 1)), hosts(store_config(kind, 0, 1));
    Key k = 11;
    std::uint32_t four = 4, three = 3, one = 1;
    for (const auto& g : part) alone.push_grad(5, {&k, 1}, {&four, 1}, g.data());
    hosts.push_grad(5, {&k, 1}, {&four, 1}, host_a.data(), nullptr, {&three, 1});
    EXPECT_EQ(hosts.commit(), 0u) << "three of four trainers in: not complete";
    // One too many is refused, and so is a share above the trainers.
    std::uint32_t two = 2;
    EXPECT_THROW(hosts.push_grad(5, {&k, 1}, {&four, 1}, host_b.data(), nullptr, {&two, 1}), ProtocolError);
    Key k2 = 12;
    std::uint32_t five = 5;
    EXPECT_THROW(hosts.push_grad(5, {&k2, 1}, {&four, 1}, host_b.data(), nullptr, {&five, 1}), ProtocolError);
    hosts.push_grad(5, {&k, 1}, {&four, 1}, host_b.data(), nullptr, {&one, 1});
    EXPECT_EQ(alone.commit(), 1u);
    EXPECT_EQ(hosts.commit(), 1u);
    for (std::uint32_t d = 0; d < kDim; ++d) EXPECT_NEAR(hosts.row(k)[d], alone.row(k)[d], 1e-6) << d;
    // A sum of every trainer completes the row at once.
    hosts.push_grad(6, {&k, 1}, {&two, 1}, host_b.data(), nullptr, {&two, 1});
    EXPECT_EQ(hosts.commit(), 1u);
    EXPECT_EQ(hosts.pending(), 0u);
  }
}

// A host's gradients (one group) are summed first, then the hosts' sums: the same bits
// whether a host's two workers' gradients left it summed (a sync, a flush) or one by one
// (evictions), in any order of arrival. Which two share a host changes the rounding
// here, so the test can tell a grouping from none.
TEST(ShardStore, AHostsGradientsSumAlikeSummedThereOrPushedOneByOne) {
  std::vector<std::vector<float>> g(3, std::vector<float>(kDim));
  for (std::uint32_t d = 0; d < kDim; ++d) {
    g[0][d] = 1e8f * static_cast<float>(d + 1);
    g[1][d] = 3.0f + static_cast<float>(d);
    g[2][d] = -1e8f * static_cast<float>(d + 1);
  }
  Key k = 5;
  std::uint32_t three = 3, one = 1, two = 2;
  auto row_after = [&](const std::function<void(ShardStore&)>& pushes) {
    ShardStore s(store_config(OptimizerKind::kAdagrad, 0, 1));
    pushes(s);
    EXPECT_EQ(s.commit(), 1u);
    return std::vector<float>(s.row(k), s.row(k) + kDim);
  };
  std::set<std::vector<float>> by_pairing;
  for (int alone = 0; alone < 3; ++alone) {
    const int p = alone == 0 ? 1 : 0, q = alone == 2 ? 1 : 2;  // the host of two
    std::vector<float> pair(kDim);
    for (std::uint32_t d = 0; d < kDim; ++d) pair[d] = g[p][d] + g[q][d];
    const auto group_of = [&](int c) { return c == alone ? 2u : 1u; };
    const std::vector<float> summed = row_after([&](ShardStore& s) {
      s.push_grad(4, {&k, 1}, {&three, 1}, g[alone].data(), nullptr, {&one, 1}, 2);
      s.push_grad(4, {&k, 1}, {&three, 1}, pair.data(), nullptr, {&two, 1}, 1);
    });
    for (const std::vector<int>& order : {std::vector<int>{0, 1, 2}, {2, 1, 0}, {1, 2, 0}}) {
      const std::vector<float> apart = row_after([&](ShardStore& s) {
        for (int c : order) s.push_grad(4, {&k, 1}, {&three, 1}, g[c].data(), nullptr, {}, group_of(c));
      });
      EXPECT_EQ(std::memcmp(apart.data(), summed.data(), kDim * sizeof(float)), 0)
          << "alone " << alone << ", order " << order[0] << order[1] << order[2];
    }
    by_pairing.insert(summed);
  }
  EXPECT_GT(by_pairing.size(), 1u) << "every grouping rounds alike here: the test proves less";
}

// Gradients pushed with an owner (a TCP request's payload, lent by the transport) are
// applied from where they are: the store holds the owner until the rows are applied, then
// lets it go. Rows still aggregating copy theirs (the owner is not held).
TEST(ShardStore, LentGradientsAreHeldUntilAppliedThenLetGo) {
  ShardStore s(store_config(OptimizerKind::kSgd, 0, 1));
  const std::vector<Key> keys = {1, 2, 3};
  const std::vector<std::uint32_t> ones(keys.size(), 1);
  std::vector<std::vector<float>> before;
  for (Key k : keys) before.emplace_back(s.row(k), s.row(k) + kDim);
  auto grads = std::make_shared<std::vector<float>>(keys.size() * kDim);
  for (std::size_t i = 0; i < grads->size(); ++i) (*grads)[i] = 0.5f + static_cast<float>(i);
  const std::vector<float> sent = *grads;
  std::weak_ptr<std::vector<float>> watch = grads;
  s.push_grad(0, keys, ones, grads->data(), std::shared_ptr<const void>(grads, grads->data()));
  grads.reset();  // the store's copy of the owner is the last
  EXPECT_FALSE(watch.expired()) << "the store let go of gradients it has not applied";
  // Deferred: parked with this thread, still held until applied here.
  EXPECT_EQ(s.commit_deferred(), keys.size());
  EXPECT_FALSE(watch.expired());
  EXPECT_EQ(s.apply_deferred_here(), keys.size());
  EXPECT_TRUE(watch.expired()) << "applied rows still hold their push's payload";
  const float lr0 = 0.05f;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    for (std::uint32_t d = 0; d < kDim; ++d) {
      const float b = before[i][d];
      EXPECT_NEAR(s.row(keys[i])[d], b - lr0 * (sent[i * kDim + d] + 0.001f * b), 1e-6) << keys[i] << " " << d;
    }
  }
  // A row of two trainers aggregates: its contribution is copied, the owner not held.
  Key k = 9;
  std::uint32_t two = 2;
  auto partial = std::make_shared<std::vector<float>>(kDim, 1.0f);
  s.push_grad(1, {&k, 1}, {&two, 1}, partial->data(), std::shared_ptr<const void>(partial, partial->data()));
  EXPECT_EQ(partial.use_count(), 1);
  s.push_grad(1, {&k, 1}, {&two, 1}, partial->data(), std::shared_ptr<const void>(partial, partial->data()));
  EXPECT_EQ(partial.use_count(), 1);  // completed by the general path: copied once more
  partial.reset();
  EXPECT_EQ(s.commit(), 1u);
  EXPECT_EQ(s.pending(), 0u);
}

// Four handler threads at once (no store-wide lock): first touches of the same rows,
// overlapping gradient aggregation, pulls. The result equals one thread doing it all,
// up to float summation order.
// Run three times: commits applied on the committing threads, and every commit handed
// to the applier (one thread, then four sharing a commit's batches) and acknowledged at
// once, so the next round's pulls and pushes meet applies in flight.
class ConcurrentStoreTest : public ::testing::TestWithParam<std::uint32_t> {};  // applier threads; 0: inline

TEST_P(ConcurrentStoreTest, HandlersMatchOneThread) {
  const bool async = GetParam() > 0;
  constexpr int kThreads = 4;
  constexpr std::uint64_t kRounds = 5;
  auto grads_of = [](int t, std::uint64_t it, std::vector<Key>& keys, std::vector<float>& g) {
    keys.clear();
    g.clear();
    for (Key k = 0; k < kKeys; k += 1 + static_cast<Key>(t)) {
      keys.push_back(k);
      for (std::uint32_t d = 0; d < kDim; ++d) g.push_back(0.01f * static_cast<float>((k + d + it) % 7) - 0.03f);
    }
  };
  // Each key's trainer count: how many threads' key sets contain it.
  auto trainers_of = [](Key k) {
    std::uint32_t n = 0;
    for (int t = 0; t < kThreads; ++t) n += k % (1 + static_cast<Key>(t)) == 0;
    return n;
  };
  StoreConfig pc = store_config(OptimizerKind::kAdagrad, 0, 1);
  if (async) {
    pc.inline_apply_floats = 0;
    pc.apply_threads = GetParam();
  }
  ShardStore serial(store_config(OptimizerKind::kAdagrad, 0, 1)), parallel(pc);
  for (std::uint64_t it = 0; it < kRounds; ++it) {
    for (int t = 0; t < kThreads; ++t) {
      std::vector<Key> keys;
      std::vector<float> g;
      grads_of(t, it, keys, g);
      std::vector<std::uint32_t> tr;
      for (Key k : keys) tr.push_back(trainers_of(k));
      serial.push_grad(it, keys, tr, g.data());
    }
    serial.commit();
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::vector<Key> keys;
        std::vector<float> g, pulled(kKeys * 2 * kDim);
        grads_of(t, it, keys, g);
        parallel.pull_with_state(keys, pulled.data());
        std::vector<std::uint32_t> tr;
        for (Key k : keys) tr.push_back(trainers_of(k));
        parallel.push_grad(it, keys, tr, g.data());
      });
    }
    for (auto& th : threads) th.join();
    std::vector<std::thread> committers;  // every worker commits; each row is applied once
    for (int t = 0; t < kThreads; ++t) committers.emplace_back([&] { async ? parallel.commit_async() : parallel.commit(); });
    for (auto& th : committers) th.join();
  }
  EXPECT_EQ(parallel.pending(), 0u);
  EXPECT_EQ(parallel.initialized_rows(), serial.initialized_rows());
  for (Key k = 0; k < kKeys; ++k) {
    for (std::uint32_t j = 0; j < 2 * kDim; ++j) ASSERT_NEAR(parallel.row(k)[j], serial.row(k)[j], 1e-6) << "key " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Commits, ConcurrentStoreTest, ::testing::Values(0u, 1u, 4u), [](const ::testing::TestParamInfo<std::uint32_t>& i) {
  return i.param == 0 ? std::string("Inline") : "Async" + std::to_string(i.param) + "Appliers";
});

// A prefetch (rows served for iteration t before commit(t)) must get the row t gets: the
// store refuses one whose row has an update pending, and refuses any update of a
// prefetched row until commit(t) ends the lending.
TEST(ShardStore, PrefetchedRowsAreFinalUntilTheirIterationsCommit) {
  ShardStore s(store_config(OptimizerKind::kSgd, 0, 1));
  const std::vector<Key> a{1, 2}, b{3};
  const std::vector<std::uint32_t> one{1}, two{2};
  std::vector<float> g(kDim, 0.5f), row(s.row_floats(), 0.25f);
  // Key 3 has half of a two-trainer aggregation: its row is not final.
  s.push_grad(4, b, two, g.data());
  EXPECT_THROW(s.lend_ahead(b, 5), ProtocolError);
  s.push_grad(4, b, two, g.data());
  s.commit();
  EXPECT_NO_THROW(s.lend_ahead(b, 5));
  // Lent for iteration 5: no gradient and no write-back of 1, 2 or 3 until commit(5).
  s.lend_ahead(a, 5);
  EXPECT_THROW(s.push_grad(4, std::vector<Key>{2}, one, g.data()), ProtocolError);
  EXPECT_THROW(s.push_value(std::vector<Key>{3}, row.data()), ProtocolError);
  EXPECT_NO_THROW(s.push_grad(4, std::vector<Key>{7}, one, g.data()));  // not lent
  s.end_lending(4);                                                     // commit(4), late: not the one
  EXPECT_THROW(s.push_grad(5, std::vector<Key>{1}, one, g.data()), ProtocolError);
  s.end_lending(5);
  EXPECT_NO_THROW(s.push_grad(5, std::vector<Key>{1}, one, g.data()));
  EXPECT_NO_THROW(s.push_value(std::vector<Key>{3}, row.data()));
  EXPECT_EQ(s.commit(), 2u);  // keys 7 and 1
}

TEST(ShardStore, BadRequestsAreRefusedWithoutChangingAnything) {
  ShardStore s(store_config(OptimizerKind::kAdagrad, 1, 2));
  Key keys[2] = {3, 4};  // 4 belongs to shard 0
  std::uint32_t trainers[2] = {1, 1};
  float g[2 * kDim] = {};
  EXPECT_THROW(s.push_grad(0, keys, trainers, g), ProtocolError);
  EXPECT_EQ(s.pending(), 0u);  // key 3 was not half-applied
  Key far = kKeys + 1;
  float out[kDim];
  EXPECT_THROW(s.pull({&far, 1}, out), ProtocolError);
  Key k = 5;
  std::uint32_t one = 1;
  s.push_grad(0, {&k, 1}, {&one, 1}, g);
  EXPECT_THROW(s.push_grad(0, {&k, 1}, {&one, 1}, g), ProtocolError);  // more contributions than trainers
  EXPECT_EQ(s.commit(), 1u);
  // A key twice in one request, with one trainer (the common path) or beside a shared row
  // (the general path): refused before anything changes.
  Key twice[3] = {7, 9, 7};
  std::uint32_t ones[3] = {1, 1, 1}, mixed[3] = {1, 2, 1};
  float g3[3 * kDim] = {};
  EXPECT_THROW(s.push_grad(1, twice, ones, g3), ProtocolError);
  EXPECT_EQ(s.pending(), 0u);
  EXPECT_THROW(s.push_grad(1, twice, mixed, g3), ProtocolError);
  EXPECT_EQ(s.pending(), 0u);
  s.push_grad(1, std::span<const Key>(twice, 2), std::span<const std::uint32_t>(ones, 2), g3);  // 7 and 9 once: accepted
  EXPECT_EQ(s.commit(), 2u);
}

// commit_async() acknowledges before the rows are applied; whatever comes next waits for
// the rows it touches: a pull sees the update, a push of the next iteration is accepted
// (not refused as a second push), a checkpoint holds every committed update.
TEST_F(ShardStoreTest, WorkAfterAnAsyncCommitWaitsForItsRows) {
  StoreConfig c = store_config(OptimizerKind::kAdagrad, 0, 1);
  c.num_keys = 20000;
  ShardStore reference(c);
  // The applier looks up the learning rate once per batch: slowed down there, it is
  // still applying when the next call comes.
  auto lr = c.lr_at;
  c.lr_at = [lr](std::uint64_t it) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return lr(it);
  };
  ShardStore s(c);
  std::vector<Key> keys(c.num_keys);
  std::vector<std::uint32_t> trainers(keys.size(), 1);
  std::vector<float> grads(keys.size() * kDim, 0.02f), pulled(keys.size() * s.row_floats()), expected(pulled.size());
  for (Key k = 0; k < keys.size(); ++k) keys[k] = k;
  for (std::uint64_t it = 0; it < 4; ++it) {
    s.push_grad(it, keys, trainers, grads.data());  // iterations 1 and 3: right after the async commit
    reference.push_grad(it, keys, trainers, grads.data());
    EXPECT_EQ(s.commit_async(), keys.size());
    reference.commit();
    if (it % 2 == 0) continue;
    s.pull_with_state(keys, pulled.data());
    reference.pull_with_state(keys, expected.data());
    ASSERT_EQ(pulled, expected) << "iteration " << it;
  }
  s.push_grad(4, keys, trainers, grads.data());
  reference.push_grad(4, keys, trainers, grads.data());
  s.commit_async();
  reference.commit();
  s.save(dir_ / "async.ckpt");
  ShardStore loaded(c);
  loaded.load({dir_ / "async.ckpt"});
  loaded.pull_with_state(keys, pulled.data());
  reference.pull_with_state(keys, expected.data());
  EXPECT_EQ(pulled, expected);
  s.commit_async();  // nothing ready: acknowledged, nothing in flight
  EXPECT_EQ(s.pending(), 0u);
}

// commit_deferred() parks each thread's complete rows with that thread: the thread that
// received a row's gradient applies it (apply_deferred_here(); the daemon after its next
// ack), not the committing one. A thread that never comes back leaves its rows to
// whoever needs them: a reader, a checkpoint's wait. Whoever applies, each row once.
TEST_F(ShardStoreTest, DeferredRowsAreAppliedByTheirThreadOrByWhoeverNeedsThem) {
  StoreConfig c = store_config(OptimizerKind::kAdagrad, 0, 1);
  c.num_keys = 1000;
  ShardStore s(c), reference(c);
  std::vector<Key> keys(c.num_keys);
  std::vector<std::uint32_t> trainers(keys.size(), 1);
  std::vector<float> grads(keys.size() * kDim, 0.02f), pulled(keys.size() * s.row_floats()), expected(pulled.size());
  for (Key k = 0; k < keys.size(); ++k) keys[k] = k;
  auto reference_round = [&](std::uint64_t it) {
    reference.push_grad(it, keys, trainers, grads.data());
    reference.commit();
    reference.pull_with_state(keys, expected.data());
  };

  // The pushing thread applies its rows; the committing thread has none of its own.
  std::atomic<int> step{0};
  std::uint64_t applied_by_pusher = 0;
  std::thread pusher([&] {
    s.push_grad(0, keys, trainers, grads.data());
    step = 1;
    while (step.load() != 2) std::this_thread::yield();
    applied_by_pusher = s.apply_deferred_here();
  });
  while (step.load() != 1) std::this_thread::yield();
  std::uint64_t taken = 0, applied_by_committer = 1;
  bool committer_has_rows = true;
  std::thread([&] {
    taken = s.commit_deferred();
    committer_has_rows = s.deferred_here();
    applied_by_committer = s.apply_deferred_here();
  }).join();
  EXPECT_EQ(taken, keys.size());
  EXPECT_FALSE(committer_has_rows);
  EXPECT_EQ(applied_by_committer, 0u);
  step = 2;
  pusher.join();
  EXPECT_EQ(applied_by_pusher, keys.size());
  reference_round(0);
  s.pull_with_state(keys, pulled.data());
  EXPECT_EQ(pulled, expected);

  // The pushing thread is gone: a pull of its rows applies them.
  std::thread([&] { s.push_grad(1, keys, trainers, grads.data()); }).join();
  EXPECT_EQ(s.commit_deferred(), keys.size());
  EXPECT_FALSE(s.deferred_here());
  auto read = std::async(std::launch::async, [&] { s.pull_with_state(keys, pulled.data()); });
  if (read.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    ADD_FAILURE() << "a pull waited for parked rows that nobody else will apply";
    s.pending();  // unblocks it
  }
  read.get();
  reference_round(1);
  EXPECT_EQ(pulled, expected);

  // Gone again: pending() (a checkpoint's wait) applies them.
  std::thread([&] { s.push_grad(2, keys, trainers, grads.data()); }).join();
  EXPECT_EQ(s.commit_deferred(), keys.size());
  EXPECT_EQ(s.pending(), 0u);
  reference_round(2);
  s.pull_with_state(keys, pulled.data());
  EXPECT_EQ(pulled, expected);

  EXPECT_EQ(s.commit_deferred(), 0u);  // nothing ready: nothing parked, nothing in flight
  EXPECT_EQ(s.apply_deferred_here(), 0u);
  EXPECT_EQ(s.pending(), 0u);
}

// A commit large enough to be applied by several threads gives each row exactly what one
// apply() of its gradient gives.
TEST(ShardStore, LargeCommitSplitOverThreadsAppliesEachRowOnce) {
  StoreConfig c = store_config(OptimizerKind::kAdam, 0, 1);
  c.num_keys = 50000;
  ShardStore s(c);
  std::vector<Key> keys(c.num_keys);
  std::vector<std::uint32_t> trainers(keys.size(), 1);
  std::vector<float> grads(keys.size() * kDim), before(keys.size() * s.row_floats());
  for (Key k = 0; k < keys.size(); ++k) {
    keys[k] = k;
    for (std::uint32_t d = 0; d < kDim; ++d) grads[k * kDim + d] = 0.001f * static_cast<float>((k * 7 + d) % 13) - 0.006f;
  }
  s.pull_with_state(keys, before.data());
  s.push_grad(4, keys, trainers, grads.data());
  EXPECT_EQ(s.commit(), keys.size());
  for (Key k = 0; k < keys.size(); ++k) {
    float* w = &before[k * s.row_floats()];
    apply(c.optimizer, c.lr_at(4), kDim, w, w + kDim, &grads[k * kDim]);
    for (std::uint32_t j = 0; j < s.row_floats(); ++j) ASSERT_EQ(s.row(k)[j], w[j]) << "key " << k << " float " << j;
  }
}

TEST_F(ShardStoreTest, CheckpointOfTwoShardsLoadsIntoThree) {
  const OptimizerKind kind = OptimizerKind::kAdam;
  std::vector<ShardStore> two;
  for (std::uint32_t s = 0; s < 2; ++s) two.emplace_back(store_config(kind, s, 2));
  std::mt19937_64 rng(8);
  for (std::uint64_t it = 0; it < 10; ++it) {
    std::set<Key> trained;  // one worker, each row once per iteration
    for (int j = 0; j < 40; ++j) trained.insert(rng() % kKeys);
    for (Key k : trained) {
      std::uint32_t one = 1;
      float gr[kDim] = {0.01f * static_cast<float>(k), -0.2f, 0.3f, 0.0f};
      two[owner_shard(k, 2)].push_grad(it, {&k, 1}, {&one, 1}, gr);
    }
    for (auto& s : two) s.commit();
  }
  std::vector<std::filesystem::path> files = {dir_ / "shard-0.ckpt", dir_ / "shard-1.ckpt"};
  two[0].save(files[0], 9);
  two[1].save(files[1], 9);
  for (std::uint32_t s = 0; s < 3; ++s) {
    ShardStore three(store_config(kind, s, 3));
    EXPECT_EQ(three.load(files), 9);
    for (Key k = s; k < kKeys; k += 3) {
      const float* a = three.row(k);
      const float* b = two[owner_shard(k, 2)].row(k);
      for (std::uint32_t j = 0; j < kDim + state_floats(kind, kDim); ++j) ASSERT_EQ(a[j], b[j]) << k;
    }
  }
  // Corrupt and truncated files are refused, naming the file.
  std::string bytes = read_file(files[0]);
  std::string bad = bytes;
  bad[bad.size() / 2] ^= 0x10;
  write_file_atomic(dir_ / "bad.ckpt", bad);
  ShardStore fresh(store_config(kind, 0, 1));
  try {
    fresh.load({dir_ / "bad.ckpt", files[1]});
    ADD_FAILURE();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.ckpt: checksum mismatch"), std::string::npos) << e.what();
  }
  write_file_atomic(dir_ / "short.ckpt", bytes.substr(0, bytes.size() - 10));
  EXPECT_THROW(fresh.load({dir_ / "short.ckpt", files[1]}), DataError);
  ShardStore sgd(store_config(OptimizerKind::kSgd, 0, 1));
  EXPECT_THROW(sgd.load(files), DataError);  // written with Adam state
  // A shard with incomplete aggregations refuses to checkpoint.
  Key k = 0;
  std::uint32_t twoc = 2;
  float gr[kDim] = {};
  ShardStore busy(store_config(kind, 0, 1));
  busy.push_grad(0, {&k, 1}, {&twoc, 1}, gr);
  EXPECT_THROW(busy.save(dir_ / "busy.ckpt"), Error);
  // Or, asked to, writes the rows as of the last commit without it.
  EXPECT_EQ(busy.save(dir_ / "busy.ckpt", 4, ShardStore::Unapplied::kLeaveOut), 1u);  // key 0's aggregation
  ShardStore idle(store_config(kind, 0, 1));
  EXPECT_EQ(idle.load({dir_ / "busy.ckpt"}), 4);
  ShardStore untouched(store_config(kind, 0, 1));
  for (std::uint32_t j = 0; j < kDim; ++j) EXPECT_EQ(idle.row(0)[j], untouched.row(0)[j]);
  // Written again, the file is replaced whole, and nothing else is left beside it.
  busy.save(dir_ / "busy.ckpt", 5, ShardStore::Unapplied::kLeaveOut);
  EXPECT_EQ(ShardStore::check_checkpoint_set({dir_ / "busy.ckpt"}), 5);
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(name == "busy.ckpt" || name.rfind("busy.ckpt", 0) != 0) << name;
  }
}

// A restore takes one whole checkpoint: a shard's file missing (its rows would silently
// keep their initial values), a shard's file twice, or files of two checkpoints (another
// shard count or iteration, left in one directory) are refused, naming the files.
TEST_F(ShardStoreTest, OnlyAWholeCheckpointIsRestored) {
  auto write_checkpoint = [&](std::uint32_t shards, std::int64_t iteration, const std::string& tag) {
    std::vector<std::filesystem::path> files;
    for (std::uint32_t s = 0; s < shards; ++s) {
      ShardStore st(store_config(OptimizerKind::kSgd, s, shards));
      files.push_back(dir_ / (tag + "-" + std::to_string(s) + ".ckpt"));
      st.save(files.back(), iteration);
    }
    return files;
  };
  const auto two = write_checkpoint(2, 7, "two"), three = write_checkpoint(3, 7, "three"), later = write_checkpoint(2, 8, "later");
  auto refused = [&](const std::vector<std::filesystem::path>& files, const std::string& says) {
    ShardStore st(store_config(OptimizerKind::kSgd, 0, 1));
    try {
      st.load(files);
      ADD_FAILURE() << "loaded; expected: " << says;
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused({two[0]}, "without shard 1's file");
  refused({two[0], two[1], three[2]}, "are not one checkpoint");
  refused({two[0], later[1]}, "are not one checkpoint");
  refused({two[0], two[0], two[1]}, "both hold shard 0");
  ShardStore st(store_config(OptimizerKind::kSgd, 0, 1));
  EXPECT_EQ(st.load(three), 7);
  // Files of earlier versions still load: version 1 (a 48-byte header, no iteration),
  // version 2 (56 bytes: the iteration, no base) and version 3 (64 bytes: the base, no
  // flags), made from a version 4 file.
  ShardStore trained(store_config(OptimizerKind::kSgd, 0, 1));
  Key k = 3;
  std::uint32_t t1 = 1;
  float gr[kDim] = {1, 2, 3, 4};
  trained.push_grad(0, {&k, 1}, {&t1, 1}, gr);
  trained.commit();
  trained.save(dir_ / "v4.ckpt", 0);
  const std::string v4 = read_file(dir_ / "v4.ckpt");
  for (const std::uint32_t version : {1u, 2u, 3u}) {
    SCOPED_TRACE(version);
    const std::size_t header = version == 1 ? 48 : version == 2 ? 56 : 64;
    std::string old = v4.substr(0, header) + v4.substr(72, v4.size() - 72 - 8);
    std::memcpy(old.data() + 8, &version, sizeof version);
    const std::uint64_t sum = checksum64(old.data(), old.size());
    old.append(reinterpret_cast<const char*>(&sum), sizeof sum);
    const std::filesystem::path file = dir_ / ("v" + std::to_string(version) + ".ckpt");
    write_file_atomic(file, old);
    ShardStore from_old(store_config(OptimizerKind::kSgd, 0, 1));
    EXPECT_EQ(from_old.load({file}), version == 1 ? -1 : 0);
    for (std::uint32_t j = 0; j < kDim; ++j) EXPECT_EQ(from_old.row(k)[j], trained.row(k)[j]);
  }
}

// A checkpoint written while a worker whose commit was acknowledged reads on (pulls of
// rows never touched initialize them): every file is whole (its checksum holds) and
// holds the rows trained before it.
TEST_F(ShardStoreTest, CheckpointsWrittenWhileRowsAreFirstTouchedAreWhole) {
  StoreConfig c = store_config(OptimizerKind::kSgd, 0, 1);
  c.num_keys = 400000;
  c.dim = 16;
  ShardStore store(c);
  std::vector<Key> trained;
  for (Key k = 0; k < 2000; ++k) trained.push_back(k * 7);
  std::vector<std::uint32_t> ones(trained.size(), 1);
  std::vector<float> g(trained.size() * c.dim, 0.5f);
  store.push_grad(0, trained, ones, g.data());
  store.commit();
  std::vector<float> before(trained.size() * c.dim);
  store.pull(trained, before.data());
  std::atomic<bool> stop{false};
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t) + 3);
      std::vector<float> out(c.dim);
      while (!stop.load()) {
        const Key k = 20000 + rng() % 380000;  // never trained
        store.pull({&k, 1}, out.data());
      }
    });
  }
  std::vector<std::filesystem::path> files;
  for (int i = 0; i < 6; ++i) {
    files.push_back(dir_ / ("touched-" + std::to_string(i) + ".ckpt"));
    store.save(files.back());
  }
  stop = true;
  for (auto& th : readers) th.join();
  for (const auto& f : files) {
    ShardStore restored(c);
    ASSERT_NO_THROW(restored.load({f})) << f;
    std::vector<float> got(before.size());
    restored.pull(trained, got.data());
    ASSERT_EQ(got, before) << f;
  }
}

// A checkpoint written while rows are written back (a worker's write-backs racing a
// checkpoint, against the protocol) holds each row as it was before or after a write,
// never half of each.
TEST_F(ShardStoreTest, CheckpointsNeverHoldHalfAWrittenBackRow) {
  StoreConfig c = store_config(OptimizerKind::kSgd, 0, 1);
  c.num_keys = 1000;
  c.dim = 2048;  // 8 KiB rows: a copy long enough to be caught halfway
  ShardStore store(c);
  std::vector<Key> written;
  for (Key k = 0; k < 64; ++k) written.push_back(k);
  std::vector<float> rows(written.size() * c.dim, 0.0f);
  store.push_value(written, rows.data());
  std::atomic<bool> stop{false};
  std::thread writer([&] {  // all ones, all twos, in turn: always inside a write
    const std::vector<float> ones(rows.size(), 1.0f), twos(rows.size(), 2.0f);
    for (std::uint64_t i = 0; !stop.load(); ++i) store.push_value(written, (i % 2 ? twos : ones).data());
  });
  std::vector<std::filesystem::path> files;
  for (int i = 0; i < 120; ++i) {
    files.push_back(dir_ / ("written-" + std::to_string(i) + ".ckpt"));
    store.save(files.back());
  }
  stop = true;
  writer.join();
  for (const auto& f : files) {
    ShardStore restored(c);
    restored.load({f});
    for (Key k : written) {
      const float* r = restored.row(k);
      for (std::uint32_t j = 1; j < c.dim; ++j) ASSERT_EQ(r[j], r[0]) << f << ": row " << k << " torn at float " << j;
    }
  }
}

}  // namespace
}  // namespace ember::ps

namespace ember::ps {
namespace {

// Dynamic tables: a slot reset for a new id holds that id's initial row and a fresh
// state; an aggregation of its old id still waiting for trainers is discarded (the next
// id's pushes then aggregate afresh); kFreeSlot clears the slot.
TEST(ShardStore, ResetSlotsTakeTheirNewIdsRowAndDropTheOldIdsAggregation) {
  ShardStore s(store_config(OptimizerKind::kAdagrad, 0, 1));
  const Key slot = 7, other = 8;
  std::uint32_t two = 2, one = 1;
  float g[kDim] = {1, 1, 1, 1};
  s.push_grad(3, {&slot, 1}, {&two, 1}, g);  // one of two trainers: waits for the other
  s.push_grad(3, {&other, 1}, {&one, 1}, g);
  EXPECT_EQ(s.commit(), 1u);
  EXPECT_EQ(s.pending(), 1u);
  const std::uint64_t id = 0x0300000000abcdefULL;
  s.reset_rows(0, std::span<const Key>(&slot, 1), std::span<const std::uint64_t>(&id, 1));
  EXPECT_EQ(s.pending(), 0u) << "the old id's aggregation is gone";
  std::vector<float> want(kDim + state_floats(OptimizerKind::kAdagrad, kDim));
  initial_row(9, id, kDim, want.data());
  init_state(s.config().optimizer, kDim, want.data() + kDim);
  std::vector<float> got(want.size());
  s.pull_with_state(std::span<const Key>(&slot, 1), got.data());
  EXPECT_EQ(got, want);
  // The new id trains from there: one trainer, applied at the next commit.
  s.push_grad(4, {&slot, 1}, {&one, 1}, g);
  EXPECT_EQ(s.commit(), 1u);
  EXPECT_NE(s.row(slot)[0], want[0]);
  // Dropped: zeros and a fresh state; the other row is untouched.
  const std::vector<float> other_before(s.row(other), s.row(other) + kDim);
  const std::uint64_t free_slot = kFreeSlot;
  s.reset_rows(0, std::span<const Key>(&slot, 1), std::span<const std::uint64_t>(&free_slot, 1));
  for (std::uint32_t d = 0; d < kDim; ++d) EXPECT_EQ(s.row(slot)[d], 0.0f);
  EXPECT_EQ(std::vector<float>(s.row(other), s.row(other) + kDim), other_before);
  const Key outside = kKeys;
  EXPECT_THROW(s.reset_rows(0, std::span<const Key>(&outside, 1), std::span<const std::uint64_t>(&id, 1)), ProtocolError);
}

// Dynamic tables' checkpoints: each row names its id; the rows made by the checkpoint's
// own commit are written free (no part of the model before it: the resumed job makes
// them again), dropped rows are left out (an incremental file writes them free); a
// store of another shard count, or other slots, takes the ids shard_of_id() gives it,
// by ascending id, with their rows.
class HashedCheckpoints : public test::TempDirTest {
 protected:
  static constexpr std::uint64_t kSlots = 64;
  static StoreConfig hashed(std::uint32_t shard, std::uint32_t shards, std::uint64_t slots = kSlots) {
    StoreConfig c = store_config(OptimizerKind::kAdagrad, shard, shards);
    c.num_keys = slots * shards;
    c.hashed_ids = true;
    c.track_changes = true;
    return c;
  }
  // Each store's row of slot `key` (value and state).
  static std::vector<float> row_of(ShardStore& s, Key key) {
    std::vector<float> r(s.row_floats());
    s.pull_with_state(std::span<const Key>(&key, 1), r.data());
    return r;
  }
  // id -> row of every live slot of `stores` (one job's shards).
  static std::map<std::uint64_t, std::vector<float>> live(std::vector<ShardStore>& stores) {
    std::map<std::uint64_t, std::vector<float>> by_id;
    for (ShardStore& s : stores) {
      for (std::uint64_t j = 0; j < s.local_rows(); ++j) {
        const Key key = j * s.config().shards + s.config().shard;
        if (s.slot_id(key) != kNoId) {
          EXPECT_TRUE(by_id.emplace(s.slot_id(key), row_of(s, key)).second);
        }
      }
    }
    return by_id;
  }
  std::vector<std::filesystem::path> save_all(std::vector<ShardStore>& stores, std::int64_t it, std::optional<std::int64_t> base = {}) {
    std::vector<std::filesystem::path> files;
    for (ShardStore& s : stores) {
      files.push_back(checkpoint_dir(dir_, it) / checkpoint_file_name(s.config().shard, s.config().shards));
      std::filesystem::create_directories(files.back().parent_path());
      s.save(files.back(), it, ShardStore::Unapplied::kRefuse, base);
    }
    return files;
  }
  static std::vector<ShardStore> loaded(const std::vector<std::filesystem::path>& files, std::uint32_t shards, std::uint64_t slots) {
    std::vector<ShardStore> out;
    for (std::uint32_t s = 0; s < shards; ++s) {
      out.emplace_back(hashed(s, shards, slots));
      out.back().load(files);
    }
    return out;
  }
};

TEST_F(HashedCheckpoints, RowsGoWithTheirIdsToAnyShardCount) {
  std::vector<ShardStore> two;
  for (std::uint32_t s = 0; s < 2; ++s) two.emplace_back(hashed(s, 2));
  // Make 40 ids at iteration 5 (each on its shard's next slot) and train them.
  std::vector<std::uint32_t> next(2, 0);
  std::map<std::uint64_t, Key> slot_of;
  const auto make = [&](std::uint64_t it, std::uint64_t id) {
    const std::uint32_t s = shard_of_id(id, 2);
    const Key key = static_cast<Key>(next[s]++) * 2 + s;
    two[s].reset_rows(it, std::span<const Key>(&key, 1), std::span<const std::uint64_t>(&id, 1));
    slot_of[id] = key;
  };
  const auto drop = [&](std::uint64_t it, std::uint64_t id) {
    const Key key = slot_of.at(id);
    two[key % 2].reset_rows(it, std::span<const Key>(&key, 1), std::span<const std::uint64_t>(&kNoId, 1));
    slot_of.erase(id);
  };
  for (std::uint64_t n = 0; n < 40; ++n) make(5, mix64(n + 1));
  std::uint32_t one = 1;
  for (const auto& [id, key] : slot_of) {
    float g[kDim] = {0.5f, -0.25f, float(id % 7), 1};
    two[key % 2].push_grad(5, {&key, 1}, {&one, 1}, g);
  }
  for (ShardStore& s : two) s.commit();
  // Commit 7: one id dropped, one made: a checkpoint of 7 holds neither.
  const std::uint64_t gone = mix64(1), fresh = mix64(1000);
  drop(7, gone);
  make(7, fresh);
  auto trained = live(two);
  ASSERT_EQ(trained.size(), 40u);  // 40 made, one dropped, one made
  trained.erase(fresh);
  const auto at7 = save_all(two, 7);
  for (const std::uint32_t shards : {1u, 2u, 3u}) {
    SCOPED_TRACE(std::to_string(shards) + " shards");
    std::vector<ShardStore> back = loaded(at7, shards, 48);
    EXPECT_EQ(live(back), trained);
    for (ShardStore& s : back) {
      // Slots 0, 1, ... by ascending id.
      std::uint64_t last = 0;
      for (std::uint64_t j = 0; j < s.local_rows(); ++j) {
        const std::uint64_t id = s.slot_id(j * shards + s.config().shard);
        if (id == kNoId) break;
        EXPECT_EQ(shard_of_id(id, shards), s.config().shard);
        EXPECT_GT(id, last);
        last = id;
      }
    }
  }
  // Incremental on 7: another id dropped at 9; the chain leaves it out, and the row made
  // at 7 (written free then) is in, as trained.
  const std::uint64_t dropped_later = mix64(2);
  drop(9, dropped_later);
  const Key fresh_key = slot_of.at(fresh);
  float g[kDim] = {1, 1, 1, 1};
  two[fresh_key % 2].push_grad(8, {&fresh_key, 1}, {&one, 1}, g);
  for (ShardStore& s : two) s.commit();
  auto at9_rows = live(two);
  const auto at9 = save_all(two, 9, 7);
  EXPECT_TRUE(ShardStore::checkpoint_info(at9[0]).base.has_value());
  EXPECT_TRUE(ShardStore::checkpoint_info(at9[0]).hashed_ids);
  {
    std::vector<ShardStore> back = loaded(at9, 3, 48);
    EXPECT_EQ(live(back), at9_rows);
  }
  // Too few slots for a shard's ids: refused, naming the flag.
  try {
    loaded(at9, 1, 16);
    ADD_FAILURE() << "39 rows in 16 slots";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("--slots-per-shard"), std::string::npos) << e.what();
  }
  // A store of vocabulary ids refuses them.
  StoreConfig plain = store_config(OptimizerKind::kAdagrad, 0, 2);
  plain.num_keys = kSlots * 2;
  ShardStore p(plain);
  EXPECT_THROW(p.load(at7), DataError);
}

// Serving deltas: a follower holding checkpoint 3 (id -> row) that applies each later
// checkpoint's deltas in turn holds, at each, what that checkpoint restores (rows made
// by a checkpoint's own commit are free there; dropped ids gone; an id made anew on
// another slot), through incremental and whole checkpoints alike; the deltas hold the
// changed rows only; a flipped byte is refused.
TEST_F(HashedCheckpoints, ServingDeltasTakeEachCheckpointToTheNext) {
  std::vector<ShardStore> two;
  for (std::uint32_t s = 0; s < 2; ++s) {
    StoreConfig c = hashed(s, 2);
    c.serving_deltas = true;
    two.emplace_back(c);
  }
  std::vector<std::vector<Key>> free_slots(2);
  for (std::uint32_t s = 0; s < 2; ++s)
    for (Key j = kSlots; j-- > 0;) free_slots[s].push_back(j * 2 + s);
  std::map<std::uint64_t, Key> slot_of;
  const auto make = [&](std::uint64_t it, std::uint64_t id) {
    const std::uint32_t s = shard_of_id(id, 2);
    const Key key = free_slots[s].back();
    free_slots[s].pop_back();
    two[s].reset_rows(it, std::span<const Key>(&key, 1), std::span<const std::uint64_t>(&id, 1));
    slot_of[id] = key;
  };
  const auto drop = [&](std::uint64_t it, std::uint64_t id) {
    const Key key = slot_of.at(id);
    two[key % 2].reset_rows(it, std::span<const Key>(&key, 1), std::span<const std::uint64_t>(&kNoId, 1));
    free_slots[key % 2].push_back(key);
    slot_of.erase(id);
  };
  std::uint32_t one = 1;
  const auto train = [&](std::uint64_t it, std::uint64_t every) {
    for (const auto& [id, key] : slot_of) {
      if (id % every != 0) continue;
      float g[kDim] = {0.5f, -0.25f, float(id % 7), float(it)};
      two[key % 2].push_grad(it, {&key, 1}, {&one, 1}, g);
    }
    for (ShardStore& s : two) s.commit();
  };
  const auto values = [](std::map<std::uint64_t, std::vector<float>> rows) {
    for (auto& [id, r] : rows) r.resize(kDim);  // the optimizer state is no part of serving
    return rows;
  };
  std::uint64_t next_id = 1;
  for (; next_id <= 30; ++next_id) make(1, mix64(next_id));
  train(1, 1);
  const auto at3 = save_all(two, 3);
  // The follower: checkpoint 3 as restored, then each checkpoint's deltas.
  std::map<std::uint64_t, std::vector<float>> held = values(live(two));
  std::map<Key, std::uint64_t> held_ids;
  for (const auto& [id, key] : slot_of) held_ids[key] = id;
  std::int64_t held_at = 3;
  std::uint64_t changed_records = 0;
  // Checkpoints 5 (on 3), 7 (on 5), 9 whole, 11 (on 9): ids made, dropped, trained.
  const std::vector<std::pair<std::int64_t, std::optional<std::int64_t>>> plan = {{5, 3}, {7, 5}, {9, std::nullopt}, {11, 9}};
  for (const auto& [it, base] : plan) {
    SCOPED_TRACE("checkpoint " + std::to_string(it));
    drop(static_cast<std::uint64_t>(it), mix64(next_id - 25));
    make(static_cast<std::uint64_t>(it) - 1, mix64(next_id++));
    train(static_cast<std::uint64_t>(it) - 1, 3);
    make(static_cast<std::uint64_t>(it), mix64(next_id++));  // made by the checkpoint's own commit: free in it
    const auto files = save_all(two, it, base);
    for (std::uint32_t s = 0; s < 2; ++s) {
      const DeltaInfo info =
          read_delta(files[s].parent_path() / delta_file_name(s, 2), [&](Key key, DeltaKind kind, std::uint64_t id, const float* row) {
            ++changed_records;
            if (const auto at = held_ids.find(key); at != held_ids.end() && kind != DeltaKind::kRow) {
              held.erase(at->second);
              held_ids.erase(at);
            }
            if (kind == DeltaKind::kFreed) return;
            if (kind == DeltaKind::kRow) {
              ASSERT_TRUE(held_ids.count(key)) << "an update of slot " << key << ", which holds no id";
              id = held_ids[key];
            }
            held_ids[key] = id;
            held[id] = std::vector<float>(row, row + kDim);
          });
      EXPECT_EQ(info.previous, held_at);
      EXPECT_EQ(info.previous_sum, checkpoint_checksum(checkpoint_dir(dir_, held_at) / checkpoint_file_name(s, 2)));
      EXPECT_EQ(info.own_sum, checkpoint_checksum(files[s]));
      EXPECT_EQ(info.iteration, it);
      EXPECT_TRUE(info.hashed_ids);
    }
    held_at = it;
    EXPECT_EQ(held, values(live(*std::make_unique<std::vector<ShardStore>>(loaded(files, 2, kSlots)))));
  }
  // Four deltas of some 12 changed rows a shard each, not the 30-odd live rows each time.
  EXPECT_LT(changed_records, 4u * 30u);
  EXPECT_GT(changed_records, 4u * 4u);
  // A flipped byte: refused, naming the file.
  const auto file = checkpoint_dir(dir_, 11) / delta_file_name(0, 2);
  std::string bytes = read_file(file);
  bytes[bytes.size() / 2] ^= 0x10;
  write_file_atomic(file, bytes);
  try {
    read_delta(file, [](Key, DeltaKind, std::uint64_t, const float*) {});
    ADD_FAILURE() << "a corrupt delta read";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
  // Restored from 11, the next delta applies to 11.
  std::vector<ShardStore> back;
  for (std::uint32_t s = 0; s < 2; ++s) {
    StoreConfig c = hashed(s, 2);
    c.serving_deltas = true;
    back.emplace_back(c);
    back.back().load(save_all(two, 13));
  }
  std::filesystem::create_directories(checkpoint_dir(dir_, 15));
  back[0].save(checkpoint_dir(dir_, 15) / checkpoint_file_name(0, 2), 15);
  EXPECT_EQ(delta_info(checkpoint_dir(dir_, 15) / delta_file_name(0, 2)).previous, 13);
  EXPECT_EQ(delta_info(checkpoint_dir(dir_, 15) / delta_file_name(0, 2)).previous_sum,
            checkpoint_checksum(checkpoint_dir(dir_, 13) / checkpoint_file_name(0, 2)));
  // A fresh store's first delta has nothing to apply to: a header only.
  EXPECT_EQ(delta_info(checkpoint_dir(dir_, 3) / delta_file_name(0, 2)).previous, DeltaInfo::kNoPrevious);
  EXPECT_EQ(delta_info(checkpoint_dir(dir_, 3) / delta_file_name(0, 2)).updated, 0u);
  EXPECT_EQ(delta_info(checkpoint_dir(dir_, 15) / delta_file_name(0, 2)).updated, 0u);
}

}  // namespace
}  // namespace ember::ps
