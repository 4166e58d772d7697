// The host map every worker builds from the hosts the workers stated at the join, and the
// all-reduce bytes each algorithm sends across hosts.
#include "hosts.h"

#include <gtest/gtest.h>

#include <map>

#include "ember/common/error.h"

namespace ember::worker {
namespace {

HostMap map_of(const std::vector<std::string>& host_of_rank) {
  std::map<std::string, std::string> board;
  for (std::uint32_t r = 0; r < host_of_rank.size(); ++r) board[worker_host_key(r)] = host_of_rank[r];
  return host_map(static_cast<std::uint32_t>(host_of_rank.size()), [&](const std::string& k) { return board.at(k); });
}

TEST(Hosts, NumberedByTheirLowestRankWithLeadersFirst) {
  const HostMap m = map_of({"b", "b", "a", "b", "a"});
  ASSERT_EQ(m.hosts(), 2u);
  EXPECT_EQ(m.names, (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(m.host_of, (std::vector<std::uint32_t>{0, 0, 1, 0, 1}));
  EXPECT_EQ(m.workers[1], (std::vector<std::uint32_t>{2, 4}));
  EXPECT_TRUE(m.leader(0));
  EXPECT_TRUE(m.leader(2));
  EXPECT_FALSE(m.leader(3));
  EXPECT_EQ(m.local_rank(3), 2u);
  EXPECT_EQ(m.describe(), "2 hosts: b (workers 0-1, 3), a (workers 2, 4)");
  EXPECT_THROW(map_of({"a", ""}), ConfigError);
}

// 2 hosts x 4 workers, host-contiguous: the flat ring crosses at 3 -> 4 and 7 -> 0, each
// sending 2(W-1)/W = 1.75x the payload; the leaders' ring sends 2(H-1)/H = 1x each: 0.57x.
TEST(Hosts, HierarchicalAllReduceCrossesHostsWithTheLeadersAlone) {
  const HostMap m = map_of({"a", "a", "a", "a", "b", "b", "b", "b"});
  const std::uint64_t payload = 8000;
  std::uint64_t flat = 0, hier = 0;
  for (std::uint32_t r = 0; r < 8; ++r) {
    flat += allreduce_cross_host_bytes(m, r, false, payload);
    hier += allreduce_cross_host_bytes(m, r, true, payload);
  }
  EXPECT_EQ(flat, 2 * 14000u);
  EXPECT_EQ(hier, 2 * 8000u);
  EXPECT_LE(static_cast<double>(hier), 0.6 * static_cast<double>(flat));
  const HostMap one = map_of({"a", "a"});
  EXPECT_EQ(allreduce_cross_host_bytes(one, 0, false, payload) + allreduce_cross_host_bytes(one, 0, true, payload), 0u);
}

}  // namespace
}  // namespace ember::worker
