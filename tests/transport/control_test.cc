// The ZeroMQ control plane over loopback: job formation, refusals, barriers, the board,
// heartbeat failure detection and clean shutdown.
#include "ember/transport/control.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>
#include <zmq.hpp>

#include "ember/common/error.h"

namespace ember::transport {
namespace {

const std::string kToken = "job-secret";

ControlTimeouts fast() {
  ControlTimeouts t;
  t.heartbeat_interval = std::chrono::milliseconds(50);
  t.heartbeat_timeout = std::chrono::milliseconds(600);
  t.join_timeout = std::chrono::milliseconds(10000);
  return t;
}

MemberOptions member(const Coordinator& c, Role role, int rank = -1, std::string data = "") {
  MemberOptions o;
  o.coordinator = c.endpoint();
  o.token = kToken;
  o.role = role;
  o.rank = rank;
  o.data_address = std::move(data);
  o.timeouts = fast();
  return o;
}

// Joins W workers concurrently (each constructor blocks until the job forms).
std::vector<std::unique_ptr<ControlMember>> join_workers(const Coordinator& c, int workers) {
  std::vector<std::future<std::unique_ptr<ControlMember>>> f;
  for (int i = 0; i < workers; ++i)
    f.push_back(std::async(std::launch::async, [&] { return std::make_unique<ControlMember>(member(c, Role::kWorker)); }));
  std::vector<std::unique_ptr<ControlMember>> out;
  for (auto& x : f) out.push_back(x.get());
  return out;
}

TEST(Control, FormsTheJobWithRanksAndAddresses) {
  Coordinator c("tcp://127.0.0.1:*", kToken, JobShape{2, 3}, fast());
  auto ps1 = std::async(std::launch::async, [&] { return std::make_unique<ControlMember>(member(c, Role::kPs, 1, "127.0.0.1:7001")); });
  auto ps0 = std::async(std::launch::async, [&] { return std::make_unique<ControlMember>(member(c, Role::kPs, 0, "127.0.0.1:7000")); });
  auto workers = join_workers(c, 3);
  auto p0 = ps0.get();
  auto p1 = ps1.get();
  EXPECT_EQ(p0->rank(), 0u);
  EXPECT_EQ(p1->rank(), 1u);
  std::set<std::uint32_t> ranks;
  for (auto& w : workers) {
    ranks.insert(w->rank());
    EXPECT_EQ(w->shape().ps, 2u);
    EXPECT_EQ(w->shape().workers, 3u);
    auto ps = w->peers_of(Role::kPs);
    ASSERT_EQ(ps.size(), 2u);
    EXPECT_EQ(ps[0].data_address, "127.0.0.1:7000");
    EXPECT_EQ(ps[1].data_address, "127.0.0.1:7001");
    EXPECT_EQ(w->peers().size(), 5u);
  }
  EXPECT_EQ(ranks, (std::set<std::uint32_t>{0, 1, 2}));
}

TEST(Control, RefusesWrongTokenTakenRankAndLateJoin) {
  Coordinator c("tcp://127.0.0.1:*", kToken, JobShape{1, 1}, fast());
  auto bad = member(c, Role::kWorker);
  bad.token = "guess";
  try {
    ControlMember m(bad);
    FAIL() << "joined without the token";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("wrong job token"), std::string::npos) << e.what();
  }
  auto ps = std::async(std::launch::async, [&] { return std::make_unique<ControlMember>(member(c, Role::kPs, 0)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_THROW(ControlMember(member(c, Role::kPs, 0)), ProtocolError);  // rank taken
  auto w = std::make_unique<ControlMember>(member(c, Role::kWorker));
  auto p = ps.get();
  EXPECT_THROW(ControlMember(member(c, Role::kWorker)), ProtocolError);  // already formed
  EXPECT_EQ(c.refused(), 3u);
  EXPECT_FALSE(c.failure().has_value());
}

TEST(Control, BarriersKeepGenerationsInStep) {
  Coordinator c("tcp://127.0.0.1:*", kToken, JobShape{1, 3}, fast());
  auto ps = std::async(std::launch::async, [&] { return std::make_unique<ControlMember>(member(c, Role::kPs, 0)); });
  auto workers = join_workers(c, 3);
  auto p = ps.get();
  constexpr int kRounds = 100;
  std::atomic<int> arrived{0};
  std::atomic<bool> overtaken{false};
  std::vector<std::thread> threads;
  for (auto& w : workers) {
    threads.emplace_back([&, m = w.get()] {
      for (int g = 0; g < kRounds; ++g) {
        arrived.fetch_add(1);
        m->barrier(BarrierGroup::kWorkers, g);
        // Nobody may leave barrier g before all three arrived at it.
        if (arrived.load() < 3 * (g + 1)) overtaken = true;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(overtaken.load());
  // kAll includes the PS.
  auto all = std::async(std::launch::async, [&] { p->barrier(BarrierGroup::kAll, 7); });
  std::vector<std::future<void>> fs;
  for (auto& w : workers) fs.push_back(std::async(std::launch::async, [&, m = w.get()] { m->barrier(BarrierGroup::kAll, 7); }));
  for (auto& f : fs) f.get();
  all.get();
}

TEST(Control, BoardPublishesAndWaitsForValues) {
  Coordinator c("tcp://127.0.0.1:*", kToken, JobShape{1, 2}, fast());
  auto ps = std::async(std::launch::async, [&] { return std::make_unique<ControlMember>(member(c, Role::kPs, 0)); });
  auto workers = join_workers(c, 2);
  auto p = ps.get();
  auto later = std::async(std::launch::async, [&] { return workers[1]->lookup("store"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  workers[0]->publish("store", "127.0.0.1:4242");
  EXPECT_EQ(later.get(), "127.0.0.1:4242");
  EXPECT_EQ(p->lookup("store"), "127.0.0.1:4242");
  EXPECT_THROW(p->lookup("missing", std::chrono::milliseconds(100)), IoError);
  // try_lookup never waits: nothing until published, then the value.
  EXPECT_EQ(workers[0]->try_lookup("checkpoint/9/1"), std::nullopt);
  EXPECT_EQ(workers[0]->try_lookup("checkpoint/9/1"), std::nullopt);  // asked once; still nothing
  p->publish("checkpoint/9/1", "{}");
  std::optional<std::string> seen;
  for (int i = 0; i < 200 && !seen; ++i) {
    seen = workers[0]->try_lookup("checkpoint/9/1");
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(seen, "{}");
  EXPECT_EQ(workers[1]->try_lookup("store"), "127.0.0.1:4242");  // arrived for lookup() before
}

TEST(Control, SilentMemberIsReportedDeadToEveryone) {
  Coordinator c("tcp://127.0.0.1:*", kToken, JobShape{1, 2}, fast());
  // A raw peer that joins as worker 1 and then never sends a heartbeat (a hung or
  // killed process), plus a malformed message the coordinator must survive.
  zmq::context_t ctx;
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect(c.endpoint());
  raw.send(zmq::str_buffer("{not json"));
  raw.send(zmq::str_buffer(R"({"op":"join","token":"job-secret","role":"worker","rank":1,"data":""})"));
  auto ps = std::async(std::launch::async, [&] { return std::make_unique<ControlMember>(member(c, Role::kPs, 0, "127.0.0.1:9")); });
  auto w0 = std::make_unique<ControlMember>(member(c, Role::kWorker, 0));
  auto p = ps.get();
  try {
    w0->barrier(BarrierGroup::kWorkers, 0, std::chrono::milliseconds(5000));
    FAIL() << "barrier passed without worker 1";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("worker 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no heartbeat"), std::string::npos) << e.what();
  }
  ASSERT_TRUE(p->wait_shutdown(std::chrono::milliseconds(3000)));
  ASSERT_TRUE(p->failure().has_value());
  EXPECT_NE(p->failure()->find("worker 1"), std::string::npos);
  ASSERT_TRUE(c.failure().has_value());
}

TEST(Control, MemberNoticesLostCoordinator) {
  auto c = std::make_unique<Coordinator>("tcp://127.0.0.1:*", kToken, JobShape{1, 1}, fast());
  auto ps = std::async(std::launch::async, [&] { return std::make_unique<ControlMember>(member(*c, Role::kPs, 0)); });
  auto w = std::make_unique<ControlMember>(member(*c, Role::kWorker));
  auto p = ps.get();
  c.reset();
  EXPECT_THROW(w->barrier(BarrierGroup::kWorkers, 0, std::chrono::milliseconds(5000)), Error);
  ASSERT_TRUE(w->failure().has_value());
  EXPECT_NE(w->failure()->find("lost the coordinator"), std::string::npos);
}

TEST(Control, ShutdownAfterEveryWorkerLeft) {
  Coordinator c("tcp://127.0.0.1:*", kToken, JobShape{2, 2}, fast());
  auto ps0 = std::async(std::launch::async, [&] { return std::make_unique<ControlMember>(member(c, Role::kPs, 0)); });
  auto ps1 = std::async(std::launch::async, [&] { return std::make_unique<ControlMember>(member(c, Role::kPs, 1)); });
  auto workers = join_workers(c, 2);
  auto p0 = ps0.get(), p1 = ps1.get();
  workers[0]->leave();
  EXPECT_FALSE(p0->wait_shutdown(std::chrono::milliseconds(200)));
  workers[1].reset();  // the destructor leaves too
  EXPECT_TRUE(p0->wait_shutdown(std::chrono::milliseconds(3000)));
  EXPECT_TRUE(p1->wait_shutdown(std::chrono::milliseconds(3000)));
  EXPECT_TRUE(p0->shutdown_requested());
  EXPECT_FALSE(p0->failure().has_value());
  EXPECT_TRUE(c.finished());
}

TEST(Control, UnreachableCoordinatorTimesOut) {
  MemberOptions o;
  o.coordinator = "tcp://127.0.0.1:1";
  o.token = kToken;
  o.timeouts = fast();
  o.timeouts.join_timeout = std::chrono::milliseconds(300);
  EXPECT_THROW(ControlMember m(o), IoError);
  o.coordinator = "not-an-endpoint";
  EXPECT_THROW(ControlMember m(o), ConfigError);
}

}  // namespace
}  // namespace ember::transport
