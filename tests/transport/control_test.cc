// The ZeroMQ control plane over loopback: job formation, refusals, barriers, the board,
// heartbeat failure detection and clean shutdown.
#include "ember/transport/control.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <random>
#include <thread>
#include <zmq.hpp>

#include "../data/test_util.h"
#include "ember/common/error.h"
#include "ember/transport/auth.h"

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

// The string value of `key` in a flat JSON object (test frames only).
std::string json_string(const std::string& frame, const std::string& key) {
  const std::string k = "\"" + key + "\":\"";
  const auto at = frame.find(k);
  if (at == std::string::npos) return "";
  const auto end = frame.find('"', at + k.size());
  return frame.substr(at + k.size(), end - at - k.size());
}

// The next frame on `socket` that is not a heartbeat (ack), waiting up to 3 s.
std::string next_frame(zmq::socket_t& socket, std::string* identity = nullptr) {
  socket.set(zmq::sockopt::rcvtimeo, 3000);
  while (true) {
    zmq::message_t m;
    if (!socket.recv(m)) return "";
    if (identity && socket.get(zmq::sockopt::type) == ZMQ_ROUTER) {
      *identity = m.to_string();
      if (!socket.recv(m)) return "";
    }
    std::string text = m.to_string();
    if (text.find("\"hb") == std::string::npos) return text;
  }
}

// A raw DEALER's join as ControlMember does it: hello, the challenge, the join with its
// proof of `token`. Returns the join frame sent.
std::string raw_join(zmq::socket_t& d, const std::string& token, const std::string& role, int rank, const std::string& data = "") {
  const auth::Nonce mine = auth::random_nonce();
  d.send(zmq::buffer("{\"op\":\"hello\",\"nonce\":\"" + auth::to_hex(mine) + "\"}"));
  const std::string challenge = next_frame(d);
  auth::Nonce theirs{};
  EXPECT_TRUE(auth::from_hex(json_string(challenge, "nonce"), theirs)) << challenge;
  const auth::Digest proof = auth::proof(token, auth::kJoinMember, theirs, mine, role + "\n" + std::to_string(rank) + "\n" + data);
  const std::string join = "{\"op\":\"join\",\"proof\":\"" + auth::to_hex(proof) + "\",\"role\":\"" + role +
                           "\",\"rank\":" + std::to_string(rank) + ",\"data\":\"" + data + "\"}";
  d.send(zmq::buffer(join));
  return join;
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
  raw_join(raw, kToken, "worker", 1);
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
  workers[1]->leave();
  EXPECT_TRUE(p0->wait_shutdown(std::chrono::milliseconds(3000)));
  EXPECT_TRUE(p1->wait_shutdown(std::chrono::milliseconds(3000)));
  EXPECT_TRUE(p0->shutdown_requested());
  EXPECT_FALSE(p0->failure().has_value());
  EXPECT_TRUE(c.finished());
}

// A member gone without leave() (an exception on its way out) fails the job at once,
// named, and the PS members are not told the job ended well.
TEST(Control, MemberGoneWithoutLeavingFailsTheJobNamingIt) {
  Coordinator c("tcp://127.0.0.1:*", kToken, JobShape{1, 2}, fast());
  std::string failed_member, failed_cause;
  std::promise<void> reported;
  c.on_failure([&](const JobFailure& f) {
    failed_member = f.member;
    failed_cause = f.cause;
    EXPECT_EQ(f.exit_status, 0);  // a process gone without a word said no status
    reported.set_value();
  });
  auto ps = std::async(std::launch::async, [&] { return std::make_unique<ControlMember>(member(c, Role::kPs, 0)); });
  auto workers = join_workers(c, 2);
  auto p = ps.get();
  const std::uint32_t gone = workers[1]->rank();
  workers[0]->leave();
  workers[1].reset();
  ASSERT_EQ(reported.get_future().wait_for(std::chrono::seconds(3)), std::future_status::ready);
  EXPECT_EQ(failed_member, "worker " + std::to_string(gone));
  EXPECT_EQ(failed_cause, "exited without leaving the job");
  EXPECT_TRUE(p->wait_shutdown(std::chrono::milliseconds(3000)));
  EXPECT_FALSE(p->shutdown_requested());
  ASSERT_TRUE(p->failure().has_value());
  EXPECT_EQ(*p->failure(), "worker " + std::to_string(gone) + ": exited without leaving the job");
  EXPECT_FALSE(c.finished());
}

// A member that fails says why, and the status it exits with (3: bad data, which a
// restart cannot mend); the first failure is the one the job reports.
TEST(Control, AbortNamesTheMemberAndItsCause) {
  Coordinator c("tcp://127.0.0.1:*", kToken, JobShape{1, 2}, fast());
  std::promise<JobFailure> reported;
  c.on_failure([&](const JobFailure& f) { reported.set_value(f); });
  auto ps = std::async(std::launch::async, [&] { return std::make_unique<ControlMember>(member(c, Role::kPs, 0)); });
  auto workers = join_workers(c, 2);
  auto p = ps.get();
  workers[0]->abort("bad data: f.tsv:3: 12 fields", 3);
  ASSERT_TRUE(p->wait_shutdown(std::chrono::milliseconds(3000)));
  workers[1]->abort("all-reduce: connection closed by peer", 5);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string first = "worker " + std::to_string(workers[0]->rank()) + ": bad data: f.tsv:3: 12 fields";
  EXPECT_EQ(c.failure().value_or(""), first);
  EXPECT_EQ(p->failure().value_or(""), first);
  auto f = reported.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(1)), std::future_status::ready);
  const JobFailure word = f.get();
  EXPECT_EQ(word.member, "worker " + std::to_string(workers[0]->rank()));
  EXPECT_EQ(word.exit_status, 3);
}

// A member that says it is ending (a signal) is not named while another member, silent
// since before it, is still to be found lost: srun --kill-on-bad-exit signals a lost
// host's survivors at once, and the host's member is the cause. Alone, it is named with
// its reason after the heartbeat timeout and a quarter.
TEST(Control, AnEndingMemberIsNamedOnlyIfNoOtherWasLostFirst) {
  for (const bool other_lost : {true, false}) {
    Coordinator c("tcp://127.0.0.1:*", kToken, JobShape{1, 3}, fast());
    std::promise<std::pair<std::string, std::string>> reported;
    c.on_failure([&](const JobFailure& f) { reported.set_value({f.member, f.cause}); });
    // Worker 2: a raw peer that heartbeats by hand, then falls silent (killed).
    zmq::context_t ctx;
    zmq::socket_t raw(ctx, zmq::socket_type::dealer);
    raw.set(zmq::sockopt::linger, 0);
    raw.connect(c.endpoint());
    raw_join(raw, kToken, "worker", 2);
    auto ps = std::async(std::launch::async, [&] { return std::make_unique<ControlMember>(member(c, Role::kPs, 0)); });
    auto w1 = std::async(std::launch::async, [&] { return std::make_unique<ControlMember>(member(c, Role::kWorker, 1)); });
    auto w0 = std::make_unique<ControlMember>(member(c, Role::kWorker, 0));
    auto p = ps.get();
    auto ending = w1.get();
    if (!other_lost) {
      std::thread([&raw] {
        for (int i = 0; i < 40; ++i) {  // alive for 2 s, beyond the timeouts
          raw.send(zmq::str_buffer("{\"op\":\"hb\"}"));
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      }).detach();
    }
    // Worker 1 says it is ending and goes; worker 2 is last heard 50 ms later (its host
    // lost first, its last heartbeat later: without the word, worker 1 is silent longer).
    const auto t0 = std::chrono::steady_clock::now();
    ending->ending("stopped by signal 15 (Terminated)");
    ending.reset();  // silent, neither leaving nor aborting
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (other_lost) raw.send(zmq::str_buffer("{\"op\":\"hb\"}"));
    auto got = reported.get_future();
    ASSERT_EQ(got.wait_for(std::chrono::seconds(3)), std::future_status::ready);
    const auto [who, cause] = got.get();
    const double after_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (other_lost) {
      EXPECT_EQ(who, "worker 2") << cause;
      EXPECT_NE(cause.find("no heartbeat"), std::string::npos) << cause;
    } else {
      EXPECT_EQ(who, "worker 1");
      EXPECT_EQ(cause, "stopped by signal 15 (Terminated)");
      EXPECT_GE(after_s, 0.6 * 1.25 - 0.05) << "named after the heartbeat timeout and a quarter";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2100 - static_cast<int>(after_s * 1000)));  // the heartbeat thread ends
  }
}

TEST(Control, CountersAddAcrossMembers) {
  Coordinator c("tcp://127.0.0.1:*", kToken, JobShape{1, 2}, fast());
  auto ps = std::async(std::launch::async, [&] { return std::make_unique<ControlMember>(member(c, Role::kPs, 0)); });
  auto workers = join_workers(c, 2);
  auto p = ps.get();
  EXPECT_EQ(workers[0]->add("n", 5), 5);
  EXPECT_EQ(workers[1]->add("n", -2), 3);
  EXPECT_EQ(workers[1]->lookup("n"), "3");
  for (auto& w : workers) w->leave();
}

// Bytes from anyone who can reach the port: none may stop the coordinator, and the job
// forms and works afterwards.
TEST(Control, HostileBytesNeitherCrashNorStopTheCoordinator) {
  Coordinator c("tcp://127.0.0.1:*", kToken, JobShape{1, 1}, fast());
  const std::string endpoint = c.endpoint();
  const auto port = static_cast<std::uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
  // Raw TCP: random bytes, and a ZMTP/1.0 greeting followed by a frame (no metadata).
  auto raw = [&](const std::string& bytes) {
    const int fd = ember::test::connect_loopback(port);
    ASSERT_GE(fd, 0);
    (void)!::write(fd, bytes.data(), bytes.size());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ::close(fd);
  };
  std::mt19937_64 rng(3);
  std::string noise(4096, '\0');
  for (char& ch : noise) ch = static_cast<char>(rng());
  raw(noise);
  raw(std::string("\x01\x00", 2) + std::string("\x05\x00hello", 7) + std::string("\x03\x00{}", 4));
  // A ZeroMQ peer sending frames of every wrong shape, and one larger than the limit.
  zmq::context_t ctx;
  zmq::socket_t d(ctx, zmq::socket_type::dealer);
  d.set(zmq::sockopt::linger, 0);
  d.connect(endpoint);
  for (const char* bad :
       {"{\"op\":7}", "{\"op\":\"join\",\"token\":5}", "{\"op\":\"join\",\"token\":\"job-secret\",\"role\":\"ps\",\"rank\":\"0\"}", "[1,2]",
        "not json", "{\"op\":\"barrier\",\"group\":{}}", "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", "{\"op\":\"hb\"}",
        "{\"op\":\"join\",\"token\":\"job-secret\",\"role\":\"worker\",\"rank\":99999999999}"})
    d.send(zmq::buffer(std::string(bad)), zmq::send_flags::none);
  d.send(zmq::buffer(std::string(2 << 20, 'x')), zmq::send_flags::none);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // Still coordinating.
  auto ps = std::async(std::launch::async, [&] { return std::make_unique<ControlMember>(member(c, Role::kPs, 0)); });
  ControlMember w(member(c, Role::kWorker));
  auto p = ps.get();
  w.barrier(BarrierGroup::kWorkers, 1, std::chrono::milliseconds(3000));
  EXPECT_FALSE(c.failure().has_value());
  w.leave();
  EXPECT_TRUE(p->wait_shutdown(std::chrono::milliseconds(3000)));
  EXPECT_TRUE(c.finished());
}

// What a listener on the job's network sees of a join carries no token: a ROUTER socket
// standing in for the coordinator records a member's frames. Replayed to the real
// coordinator (which draws a new nonce), the recorded join is refused as a wrong token.
TEST(Control, TheTokenNeverCrossesTheWireAndARecordedJoinIsRefused) {
  zmq::context_t ctx;
  zmq::socket_t fake(ctx, zmq::socket_type::router);
  fake.set(zmq::sockopt::linger, 0);
  fake.bind("tcp://127.0.0.1:*");
  const std::string fake_endpoint = fake.get(zmq::sockopt::last_endpoint);
  std::vector<std::string> frames;
  // The stand-in does not know the token: its challenge's proof is zeros, and once the
  // member's join is in it welcomes the member, which must refuse it.
  std::thread standin([&] {
    std::string id;
    frames.push_back(next_frame(fake, &id));  // hello
    const std::string challenge =
        "{\"op\":\"challenge\",\"nonce\":\"" + auth::to_hex(auth::random_nonce()) + "\",\"proof\":\"" + std::string(64, '0') + "\"}";
    fake.send(zmq::buffer(id), zmq::send_flags::sndmore);
    fake.send(zmq::buffer(challenge));
    frames.push_back(next_frame(fake, &id));  // join
    fake.send(zmq::buffer(id), zmq::send_flags::sndmore);
    fake.send(zmq::str_buffer(
        R"({"op":"welcome","rank":0,"ps":1,"workers":1,"peers":[{"role":"ps","rank":0,"data":"x"},{"role":"worker","rank":0,"data":""}]})"));
  });
  MemberOptions o;
  o.coordinator = fake_endpoint;
  o.token = kToken;
  o.role = Role::kWorker;
  o.timeouts = fast();
  o.timeouts.join_timeout = std::chrono::milliseconds(3000);
  try {
    ControlMember m(o);
    ADD_FAILURE() << "joined a coordinator that does not know the token";
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("did not prove it knows the job token"), std::string::npos) << e.what();
  }
  standin.join();
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_NE(frames[0].find("\"op\":\"hello\""), std::string::npos) << frames[0];
  EXPECT_NE(frames[1].find("\"op\":\"join\""), std::string::npos) << frames[1];
  for (const std::string& f : frames) EXPECT_EQ(f.find(kToken), std::string::npos) << "the token crossed the wire: " << f;

  // Replayed at the real coordinator: the same hello gets a new challenge, which the
  // recorded join does not answer; a join with no challenge before is refused too.
  Coordinator c("tcp://127.0.0.1:*", kToken, JobShape{1, 1}, fast());
  zmq::socket_t replay(ctx, zmq::socket_type::dealer);
  replay.set(zmq::sockopt::linger, 0);
  replay.connect(c.endpoint());
  replay.send(zmq::buffer(frames[0]));
  EXPECT_NE(next_frame(replay).find("\"op\":\"challenge\""), std::string::npos);
  replay.send(zmq::buffer(frames[1]));
  EXPECT_NE(next_frame(replay).find("wrong job token"), std::string::npos);
  replay.send(zmq::buffer(frames[1]));
  EXPECT_NE(next_frame(replay).find("without a challenge"), std::string::npos);
  EXPECT_EQ(c.refused(), 2u);
  // A raw member that answers its challenge with the token joins.
  zmq::socket_t good(ctx, zmq::socket_type::dealer);
  good.set(zmq::sockopt::linger, 0);
  good.connect(c.endpoint());
  raw_join(good, kToken, "worker", 0);
  ControlMember ps(member(c, Role::kPs, 0));
  EXPECT_NE(next_frame(good).find("\"op\":\"welcome\""), std::string::npos);
  EXPECT_EQ(c.refused(), 2u);
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
