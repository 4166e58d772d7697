#include "ember/common/signals.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace ember {
namespace {

using namespace std::chrono_literals;

// A signal sent to the process reaches the handler on the SignalThread's own thread; one
// that comes while the destructor waits for that thread is not handled but made pending
// again, for the next waiter (ember-ps's loop takes SIGTERM over from its SignalThread
// that way: handled there, it ended the shard).
TEST(SignalThread, HandlesSignalsOnItsThreadAndHandsThemOnWhenGone) {
  std::atomic<int> got{0};
  std::thread::id on;
  {
    SignalThread t({SIGUSR2}, [&](int sig) {
      on = std::this_thread::get_id();
      got = sig;
    });
    kill(getpid(), SIGUSR2);
    for (int i = 0; i < 500 && got.load() == 0; ++i) std::this_thread::sleep_for(10ms);
    EXPECT_EQ(got.load(), SIGUSR2);
    EXPECT_NE(on, std::this_thread::get_id());
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR2);
  const timespec none{0, 0}, second{1, 0};
  EXPECT_EQ(sigtimedwait(&set, nullptr, &none), -1) << "nothing pending yet";
  for (int round = 0; round < 5; ++round) {
    std::atomic<bool> closing{false}, late{false};
    {
      SignalThread t({SIGUSR2}, [&](int) { late = closing.load(); });
      std::this_thread::sleep_for(10ms);  // its thread waits for signals
      // Sent 20 ms into the destructor's wait for that thread (up to 100 ms).
      closing = true;
      std::thread([] {
        std::this_thread::sleep_for(20ms);
        kill(getpid(), SIGUSR2);
      }).detach();
    }
    EXPECT_FALSE(late.load()) << "round " << round << ": handled after the destructor began (ember-ps would die)";
    EXPECT_EQ(sigtimedwait(&set, nullptr, &second), SIGUSR2) << "round " << round << ": the signal was lost";
  }
}

}  // namespace
}  // namespace ember
