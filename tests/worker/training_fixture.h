// The fixture of the end-to-end training tests (training_*test.cc): JobTest's jobs,
// and a check that a stopped member ends every survivor within the heartbeat timeout.
#pragma once

#include <signal.h>

#include <chrono>
#include <string>

#include "job_fixture.h"

namespace ember::worker::test_jobs {

class Training : public JobTest {
 protected:
  void expect_survivors_end_when_stopped(const JobOptions& o, std::uint32_t victim, const std::string& name) {
    const fs::path data = dataset(4000);
    Processes ps;
    const std::string coord = start_ps(data, o, name, ps);
    ASSERT_FALSE(coord.empty());
    Processes workers = start_workers(data, o, coord, name);
    wait_for_lines(dir_ / (name + "-w0.jsonl"), 3);
    workers[victim]->signal(SIGSTOP);
    const auto stopped = std::chrono::steady_clock::now();
    const std::string named = "worker " + std::to_string(victim) + ": no heartbeat";
    for (std::uint32_t w = 0; w < o.workers; ++w) {
      if (w == victim) continue;
      EXPECT_EQ(workers[w]->wait(20s), 6) << name << " worker " << w << ": " << workers[w]->log_tail(10);
      const std::string tail = workers[w]->log_tail(10);
      EXPECT_NE(tail.find(named), std::string::npos) << name << ": " << tail;
    }
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped).count();
    EXPECT_LT(took, 3.0 + 3.0 + 4.0) << name << ": survivors must end within the heartbeat timeout, the watchdog's grace and a margin";
    EXPECT_EQ(ps[0]->wait(20s), 6) << ps[0]->log_tail(10);
    EXPECT_NE(ps[0]->log_tail(20).find(named), std::string::npos) << ps[0]->log_tail(20);
    workers[victim]->signal(SIGKILL);
  }
};

}  // namespace ember::worker::test_jobs
