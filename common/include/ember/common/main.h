// What every Ember binary's main does with errors: one line on stderr naming the
// program, and an exit code by error type (error.h). It also ignores SIGPIPE.
#pragma once

#include <functional>

namespace ember {

int guarded_main(const char* program, const std::function<int()>& body);

}  // namespace ember
