#include "ember/scheduler/batch_stream.h"

#include <utility>

namespace ember::scheduler {

void BatchStream::Epochs::next(data::Batch& out) {
  if (!reader.next(out)) {
    reader.start_epoch(++epoch);
    reader.next(out);
  }
}

BatchStream::BatchStream(const data::BatchReader& reader, std::vector<std::uint64_t> table_offsets, std::uint32_t lookahead)
    : main_{reader}, ahead_{reader}, offsets_(std::move(table_offsets)), lookahead_(lookahead) {}

void BatchStream::next(data::Batch& b, GlobalBatch& g) {
  main_.next(b);
  to_global_batch(b, offsets_, g);
}

void BatchStream::look_ahead(Scheduler& s, std::uint64_t t, std::uint64_t end) {
  s.look_ahead_through(t, end, [&](GlobalBatch& next) {
    ahead_.next(ahead_batch_);
    to_global_batch(ahead_batch_, offsets_, next);
    if (on_ahead_) on_ahead_(ahead_next_, next);
    ++ahead_next_;
  });
}

void BatchStream::look_ahead(HostSchedulers& s, std::uint64_t t, std::uint64_t end) {
  s.look_ahead_through(t, end, [&](GlobalBatch& next) {
    ahead_.next(ahead_batch_);
    to_global_batch(ahead_batch_, offsets_, next);
    if (on_ahead_) on_ahead_(ahead_next_, next);
    ++ahead_next_;
  });
}

void BatchStream::skip(std::uint64_t n) {
  data::Batch b;
  for (std::uint64_t t = 0; t < n; ++t) main_.next(b);
  if (lookahead_ > 0) {
    for (std::uint64_t t = 0; t < n; ++t) ahead_.next(b);
    ahead_next_ += n;
  }
}

}  // namespace ember::scheduler
