// The c10d store the dense collective rendezvouses through (Gloo's pair addresses,
// NCCL's unique id), kept on the control plane's board: only members that joined with
// the job token read or write it, and no extra port is opened (a c10d TCPStore listens
// on every interface and checks nobody).
#pragma once

#include <torch/version.h>

#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "ember/transport/control.h"

namespace ember::worker {

class ControlStore final : public c10d::Store {
 public:
  ControlStore(transport::ControlMember& control, std::string prefix, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<std::uint8_t>& value) override;
  std::vector<std::uint8_t> get(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t value) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  // The board keeps every key for the job's life.
  bool deleteKey(const std::string& key) override;
  std::int64_t getNumKeys() override;
#if TORCH_VERSION_MAJOR >= 2
  // LibTorch 2.x: a copy for another thread (the control member is thread-safe).
  c10::intrusive_ptr<c10d::Store> clone() override;
#endif

 private:
  std::string board_key(const std::string& key) const { return prefix_ + key; }
  transport::ControlMember& control_;
  std::string prefix_;
};

}  // namespace ember::worker
