// FakeFabric: an in-process verbs::Fabric with the semantics the RDMA protocol relies
// on, checked strictly so that protocol bugs show up as failures:
//   - SEND and WRITE with immediate consume the peer's oldest posted RECV; none posted is
//     an error (a real RC queue pair would stall in RNR retries: credits must prevent it);
//   - a SEND longer than the RECV buffer, a local buffer outside registered memory (each
//     piece of a gather list within the region of its lkey), a RECV into memory
//     registered for sends only, more pieces than max_send_sges(), or a remote write
//     outside a region the peer registered writable with that rkey fail the work
//     request, and the queue pairs go to the error state (posted RECVs flush with errors);
//   - operations on one queue pair complete in order; destroying an endpoint disconnects
//     its peer (the peer's posted RECVs flush).
// Operations complete at post time, on the poster's thread. `inject_send_error(n)` makes
// the n-th following post_send anywhere on the fabric fail, to test error paths.
#pragma once

#include <cstdint>
#include <memory>

#include "ember/transport/verbs.h"

namespace ember::transport::verbs {

class FakeFabric final : public Fabric {
 public:
  // Endpoints take up to `max_send_sges` pieces per send (1 to kMaxSendSges).
  explicit FakeFabric(std::uint32_t max_send_sges = kMaxSendSges);
  ~FakeFabric() override;

  std::unique_ptr<Listener> listen(const std::string& address, std::uint16_t port) override;
  std::unique_ptr<Endpoint> resolve(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout) override;

  void inject_send_error(std::uint64_t nth);
  std::uint64_t registrations() const;   // register_memory calls so far
  std::uint64_t sends_posted() const;    // post_send calls so far
  std::uint64_t bytes_moved() const;     // bytes placed by SEND and WRITE
  std::uint64_t gathered_sends() const;  // post_send calls of more than one piece

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace ember::transport::verbs
