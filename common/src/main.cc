#include "ember/common/main.h"

#include <csignal>
#include <cstdio>
#include <exception>

#include "ember/common/error.h"

namespace ember {

int guarded_main(const char* program, const std::function<int()>& body) {
  // A write to a peer that died (Gloo's sockets do not ask for MSG_NOSIGNAL) must fail
  // as an error naming that peer, not kill this process by SIGPIPE: the launchers would
  // name the survivor as the member that failed.
  std::signal(SIGPIPE, SIG_IGN);
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return exit_code(e);
  }
}

}  // namespace ember
