#include "ember/common/main.h"

#include <cstdio>
#include <exception>

#include "ember/common/error.h"

namespace ember {

int guarded_main(const char* program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return exit_code(e);
  }
}

}  // namespace ember
