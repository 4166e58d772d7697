// Signals handled on a thread of their own: there a handler may log, take locks and read
// the program's state, which a plain signal handler may not. Construct a SignalThread
// in main before any other thread starts: threads inherit the blocked signals, so none
// of them is interrupted by one (ZeroMQ and Gloo calls would fail with EINTR).
#pragma once

#include <atomic>
#include <csignal>
#include <functional>
#include <initializer_list>
#include <thread>

namespace ember {

class SignalThread {
 public:
  // Blocks `signals` in the calling thread and runs `on_signal(sig)` for each one received.
  SignalThread(std::initializer_list<int> signals, std::function<void(int)> on_signal);
  // Stops the thread (within 100 ms); the signals stay blocked, and one taken meanwhile
  // is made pending again (a later sigtimedwait gets it).
  ~SignalThread();
  SignalThread(const SignalThread&) = delete;
  SignalThread& operator=(const SignalThread&) = delete;

 private:
  sigset_t set_;
  std::function<void(int)> on_signal_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// Ends the process as `sig`'s default action does (the exit status a shell or a launcher
// sees for a process killed by it), after flushing the log.
[[noreturn]] void die_by_signal(int sig);

}  // namespace ember
