#include "ember/common/signals.h"

#include <pthread.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <ctime>
#include <utility>

#include "ember/common/process.h"

namespace ember {

SignalThread::SignalThread(std::initializer_list<int> signals, std::function<void(int)> on_signal) : on_signal_(std::move(on_signal)) {
  sigemptyset(&set_);
  for (int s : signals) sigaddset(&set_, s);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  thread_ = std::thread([this] {
    name_this_thread("signals");
    // A short wait, so that the destructor is heard.
    const timespec wait{0, 100'000'000};
    while (!done_.load()) {
      const int sig = sigtimedwait(&set_, nullptr, &wait);
      if (sig <= 0) continue;
      if (done_.load()) {
        // Taken while the destructor waits for this thread: pending again, for whoever
        // waits for the signals next (they stay blocked).
        kill(getpid(), sig);
        return;
      }
      on_signal_(sig);
    }
  });
}

SignalThread::~SignalThread() {
  done_ = true;
  thread_.join();
}

void die_by_signal(int sig) {
  spdlog::default_logger()->flush();
  std::signal(sig, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  raise(sig);
  _exit(128 + sig);  // a signal whose default action does not end the process
}

}  // namespace ember
