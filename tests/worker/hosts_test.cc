// The host map every worker builds from the hosts the workers and shards stated at the
// join, the all-reduce bytes each algorithm sends within and across hosts, and each
// shard's traffic put on its link.
#include "job/hosts.h"

#include <gtest/gtest.h>

#include <map>

#include "ember/common/error.h"
#include "ember/common/host.h"

namespace ember::worker {
namespace {

// Each member on the machine of its host's name, unless `machine` says otherwise (key:
// "w1", "s0").
HostMap map_of(const std::vector<std::string>& host_of_rank, const std::vector<std::string>& host_of_shard = {},
               const std::map<std::string, std::string>& machine = {}) {
  std::map<std::string, std::string> board;
  const auto on = [&](const std::string& who, const std::string& host) { return machine.count(who) ? machine.at(who) : host; };
  for (std::uint32_t r = 0; r < host_of_rank.size(); ++r) {
    board[worker_host_key(r)] = host_of_rank[r];
    board[worker_machine_key(r)] = on("w" + std::to_string(r), host_of_rank[r]);
  }
  for (std::uint32_t s = 0; s < host_of_shard.size(); ++s) {
    board[shard_host_key(s)] = host_of_shard[s];
    board[shard_machine_key(s)] = on("s" + std::to_string(s), host_of_shard[s]);
  }
  return host_map(static_cast<std::uint32_t>(host_of_rank.size()), static_cast<std::uint32_t>(host_of_shard.size()),
                  [&](const std::string& k) { return board.at(k); });
}

TEST(Hosts, NumberedByTheirLowestRankWithLeadersFirst) {
  const HostMap m = map_of({"b", "b", "a", "b", "a"}, {"c", "a", "c"});
  ASSERT_EQ(m.hosts(), 2u);
  EXPECT_EQ(m.names, (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(m.host_of, (std::vector<std::uint32_t>{0, 0, 1, 0, 1}));
  EXPECT_EQ(m.workers[1], (std::vector<std::uint32_t>{2, 4}));
  EXPECT_EQ(m.shard_hosts, (std::vector<std::string>{"c", "a", "c"}));
  EXPECT_TRUE(m.leader(0));
  EXPECT_TRUE(m.leader(2));
  EXPECT_FALSE(m.leader(3));
  EXPECT_EQ(m.local_rank(3), 2u);
  EXPECT_EQ(m.describe(), "2 hosts: b (workers 0-1, 3), a (workers 2, 4); PS shards on c, a");
  EXPECT_THROW(map_of({"a", ""}), ConfigError);
  EXPECT_THROW(map_of({"a"}, {""}), ConfigError);
}

// Virtual hosts on one machine are fine; one host's name on two machines is refused,
// naming both members and machines.
TEST(Hosts, OneHostsNameOnTwoMachinesIsRefused) {
  EXPECT_NO_THROW(map_of({"v1", "v1", "v2"}, {"v0"}, {{"w0", "vm"}, {"w1", "vm"}, {"w2", "vm"}, {"s0", "vm"}}));
  try {
    map_of({"a", "a", "b"}, {}, {{"w1", "x"}});
    ADD_FAILURE() << "no refusal";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "the host map disagrees: worker 1 states host 'a' from machine 'x', worker 0 from machine 'a' (give each machine's "
                 "members its own --host)");
  }
  EXPECT_THROW(map_of({"a", "b"}, {"b"}, {{"s0", "c"}}), ConfigError) << "a shard on another machine than its host's workers";
}

std::uint64_t cross_out(const HostMap& m, std::uint32_t r, bool hier, std::uint64_t payload) {
  return allreduce_link_bytes(m, r, hier, payload).cross_out;
}

// 2 hosts x 4 workers, host-contiguous: the flat ring crosses at 3 -> 4 and 7 -> 0, each
// sending 2(W-1)/W = 1.75x the payload; the leaders' ring sends 2(H-1)/H = 1x each: 0.57x.
TEST(Hosts, HierarchicalAllReduceCrossesHostsWithTheLeadersAlone) {
  const HostMap m = map_of({"a", "a", "a", "a", "b", "b", "b", "b"});
  const std::uint64_t payload = 8000;
  std::uint64_t flat = 0, hier = 0, flat_in = 0, hier_in = 0, hier_intra = 0;
  for (std::uint32_t r = 0; r < 8; ++r) {
    flat += cross_out(m, r, false, payload);
    hier += cross_out(m, r, true, payload);
    flat_in += allreduce_link_bytes(m, r, false, payload).cross_in;
    hier_in += allreduce_link_bytes(m, r, true, payload).cross_in;
    hier_intra += allreduce_link_bytes(m, r, true, payload).intra_out;
  }
  EXPECT_EQ(flat, 2 * 14000u);
  EXPECT_EQ(hier, 2 * 8000u);
  EXPECT_EQ(flat_in, flat) << "what one host sends the other receives";
  EXPECT_EQ(hier_in, hier);
  EXPECT_EQ(hier_intra, 2 * (3 * 8000u + 3 * 8000u)) << "each host: 3 workers send to the leader, which sends 3 back";
  EXPECT_LE(static_cast<double>(hier), 0.6 * static_cast<double>(flat));
  const HostMap one = map_of({"a", "a"});
  EXPECT_EQ(cross_out(one, 0, false, payload) + cross_out(one, 0, true, payload), 0u);
  EXPECT_EQ(allreduce_link_bytes(map_of({"a"}), 0, false, payload).intra_out, 0u) << "one worker: no all-reduce";
}

// A shard's bytes and rows count within the host when the shard's host is the worker's.
TEST(Hosts, EachShardsTrafficGoesOnItsLink) {
  const HostMap m = map_of({"a", "b"}, {"a", "c"});
  std::vector<ps::WireTally> by_shard(2);
  by_shard[0].pull = {100, 1000, 10};
  by_shard[1].pull = {200, 2000, 20};
  by_shard[1].push_grad = {300, 48, 5};
  const std::vector<ps::PsClient::SocketBytes> socket = {{110, 1010}, {520, 2060}};
  const Links w0 = link_traffic(m, 0, by_shard, socket, false, 0);
  EXPECT_EQ(w0.intra_host.ps.pull.rows, 10u);
  EXPECT_EQ(w0.cross_host.ps.pull.rows, 20u);
  EXPECT_EQ(w0.cross_host.ps_out, 520u) << "the socket's bytes, not the framed tally's";
  EXPECT_EQ(w0.cross_host.ps_in, 2060u);
  EXPECT_EQ(w0.intra_host.ps_out, 110u);
  const Links w1 = link_traffic(m, 1, by_shard, socket, false, 4000);
  EXPECT_EQ(w1.intra_host.ps_out + w1.intra_host.ps_in, 0u) << "no shard on b";
  EXPECT_EQ(w1.cross_host.ps.pull.rows, 30u);
  EXPECT_EQ(w1.cross_host.peer_out, 4000u) << "2 workers on 2 hosts: the ring's 2(W-1)/W = 1x crosses";
  EXPECT_EQ(w1.cross_host.out(), w1.cross_host.ps_out + 4000u);
}

// Per-host aggregation's hand-offs, from the host's plans: a row several workers of the
// host pull is pulled by the first and handed to the others, their gradients go to the
// first, which pushes the sum; rows of a shard on this host and rows of one worker move
// as before; a row one worker wants with its state travels with it.
TEST(Hosts, HandOffsGoThroughTheHostsFirstWorkerOfEachRow) {
  using scheduler::EvictKind;
  using scheduler::StepPlan;
  const HostMap m = map_of({"a", "a", "a", "b"}, {"a", "c"});  // shard 0 on a, shard 1 on c
  std::vector<StepPlan> plans(4);
  const auto pull = [](Key k, bool state = false) { return scheduler::PullEntry{k, 0, 0, EvictKind::kNone, state, false}; };
  // Odd keys are shard 1's (across), even keys shard 0's (within host a).
  plans[0].pulls = {pull(1), pull(2), pull(7, true)};
  plans[1].pulls = {pull(3), pull(1), pull(2), pull(7)};
  plans[2].pulls = {pull(1), pull(3), pull(5)};
  plans[3].pulls = {pull(1)};  // host b: another host's worker
  for (std::uint32_t w = 0; w < 4; ++w)
    plans[w].push_grads =
        plans[w].pulls.size() > 2 ? std::vector<scheduler::KeySlot>{{1, 0}, {9, 1}} : std::vector<scheduler::KeySlot>{{9, 0}};
  // (No row was trained: every worker's parts are whole.)
  scheduler::HostParts p0, p1, p2, p3;
  HostPlans h0 = host_plans(host_group(m, 0), plans, p0), h1 = host_plans(host_group(m, 1), plans, p1),
            h2 = host_plans(host_group(m, 2), plans, p2);
  // Key 1 (workers 0, 1, 2): worker 0 pulls it and hands it to 1 and 2. Key 3 (1, 2):
  // worker 1 to 2. Key 7 (0 with its state, 1 without): worker 0 pulls it with its state
  // and hands it so. Key 2 is within the host, key 5 pulled by one worker: not handed.
  EXPECT_TRUE(h0.pull.any && h1.pull.any && h2.pull.any);
  EXPECT_EQ(h0.pull.send, (std::vector<std::vector<std::uint32_t>>{{}, {0, 2}, {0}}));
  EXPECT_EQ(h0.pull.received(), 0u);
  EXPECT_EQ(h1.pull.recv, (std::vector<std::vector<std::uint32_t>>{{1, 3}, {}, {}}));
  EXPECT_EQ(h1.pull.send, (std::vector<std::vector<std::uint32_t>>{{}, {}, {0}}));
  EXPECT_EQ(h1.pull.share, (std::vector<std::uint32_t>{1, 0, 1, 0}));
  EXPECT_TRUE(h0.pull.with_state(2, false) && h1.pull.with_state(3, false)) << "key 7 travels with its state";
  EXPECT_FALSE(h1.pull.with_state(1, true)) << "key 1: no worker wants its state";
  EXPECT_EQ(h2.pull.recv, (std::vector<std::vector<std::uint32_t>>{{0}, {1}, {}}));
  EXPECT_EQ(h2.pull.share, (std::vector<std::uint32_t>{0, 0, 1}));
  // Gradients of key 9 (workers 0, 1, 2) and key 1 (0, 1, 2) gather at worker 0, which
  // pushes each with a share of 3.
  EXPECT_EQ(h0.sync.recv, (std::vector<std::vector<std::uint32_t>>{{}, {0, 1}, {0, 1}}));
  EXPECT_EQ(h0.sync.share, (std::vector<std::uint32_t>{3, 3}));
  EXPECT_EQ(h1.sync.send, (std::vector<std::vector<std::uint32_t>>{{0, 1}, {}, {}}));
  EXPECT_EQ(h2.sync.send, (std::vector<std::vector<std::uint32_t>>{{0, 1}, {}, {}}));
  EXPECT_EQ(h2.sync.share, (std::vector<std::uint32_t>{0, 0}));
  // Alone on its host: nothing to hand.
  const HostPlans h3 = host_plans(host_group(m, 3), plans, p3);
  EXPECT_FALSE(h3.pull.any || h3.sync.any || h3.evict.any || h3.end.any);
  EXPECT_FALSE(h0.evict.any || h0.end.any);
}

// A host's gradient parts of a row are summed there only when a phase holds all of them;
// then in the order of their bytes (as the shard sums a host's parts that came one by
// one), so that the shard's sum does not depend on which phases they left in. Key 1 is
// trained by the host's three workers: two of them evict it at the next iteration, the
// third pushes it at a flush; none is summed. Key 3 (the same three) leaves in one phase:
// summed at worker 0. Key 5 has two parts (0 and 1), evicted together: summed.
TEST(Hosts, AHostsPartsAreSummedOnlyWhenAPhaseHoldsThemAll) {
  using scheduler::EvictKind;
  using scheduler::StepPlan;
  const HostMap m = map_of({"a", "a", "a"}, {"c"});  // every key's shard on another host
  const auto trained = [](std::vector<Key> keys) {
    StepPlan p;
    for (Key k : keys) p.rows.push_back({k, 0, 3});
    return p;
  };
  std::vector<StepPlan> it0 = {trained({1, 3, 5}), trained({1, 3, 5}), trained({1, 3})};
  it0[2].rows[0].trainers = it0[2].rows[1].trainers = 3;
  it0[0].rows[2].trainers = it0[1].rows[2].trainers = 2;
  std::vector<scheduler::HostParts> parts(3);
  for (std::uint32_t w = 0; w < 3; ++w) host_plans(host_group(m, w), it0, parts[w]);
  EXPECT_EQ(parts[0].pending(), 3u);
  const auto evict = [](Key k) { return scheduler::PullEntry{100 + k, 0, k, EvictKind::kPartial, false, false}; };
  std::vector<StepPlan> it1(3);
  it1[0].pulls = {evict(1), evict(3), evict(5)};
  it1[1].pulls = {evict(3), evict(5), evict(1)};
  it1[2].pulls = {evict(3)};
  std::vector<HostPlans> h;
  for (std::uint32_t w = 0; w < 3; ++w) h.push_back(host_plans(host_group(m, w), it1, parts[w]));
  // Worker 0 takes key 3 from 1 and 2 (a share of 3) and key 5 from 1 (a share of 2).
  EXPECT_EQ(h[0].evict.recv, (std::vector<std::vector<std::uint32_t>>{{}, {1, 2}, {1}}));
  EXPECT_EQ(h[0].evict.share, (std::vector<std::uint32_t>{1, 3, 2}));
  EXPECT_EQ(h[1].evict.send, (std::vector<std::vector<std::uint32_t>>{{0, 1}, {}, {}}));
  EXPECT_EQ(h[1].evict.share, (std::vector<std::uint32_t>{0, 0, 1})) << "key 1: two of its three parts, pushed one by one";
  EXPECT_EQ(h[2].evict.send, (std::vector<std::vector<std::uint32_t>>{{0}, {}, {}}));
  // The flush pushes key 1's last part.
  std::vector<StepPlan> flush(3);
  flush[2].push_grads = {{1, 0}};
  for (std::uint32_t w = 0; w < 3; ++w) EXPECT_FALSE(host_flush(host_group(m, w), flush, parts[w]).any);
  for (std::uint32_t w = 0; w < 3; ++w) EXPECT_EQ(parts[w].pending(), 0u) << "worker " << w;
}

}  // namespace
}  // namespace ember::worker
