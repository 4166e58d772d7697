#include "job/control_store.h"

#include "ember/common/error.h"
#include "ember/transport/auth.h"

namespace ember::worker {

namespace {

// The board holds JSON strings: values (binary for Gloo) travel as hex (the transport's
// helpers, as the join's proofs do).
std::vector<std::uint8_t> from_hex(const std::string& text, const std::string& key) {
  std::vector<std::uint8_t> out(text.size() / 2);
  if (!transport::auth::from_hex(text, out)) {
    throw ProtocolError("c10d store: the board's value of '" + key + "' is not lowercase hex of even length");
  }
  return out;
}

}  // namespace

ControlStore::ControlStore(transport::ControlMember& control, std::string prefix, std::chrono::milliseconds timeout)
    : c10d::Store(timeout), control_(control), prefix_(std::move(prefix)) {}

void ControlStore::set(const std::string& key, const std::vector<std::uint8_t>& value) {
  control_.publish(board_key(key), "x" + transport::auth::to_hex(value));
}

std::vector<std::uint8_t> ControlStore::get(const std::string& key) {
  const std::string v = control_.lookup(board_key(key), timeout_);
  // Values set() wrote start with 'x'; add()'s counters are decimal, as c10d's stores keep them.
  if (!v.empty() && v[0] == 'x') return from_hex(v.substr(1), key);
  return std::vector<std::uint8_t>(v.begin(), v.end());
}

std::int64_t ControlStore::add(const std::string& key, std::int64_t value) { return control_.add(board_key(key), value, timeout_); }

bool ControlStore::check(const std::vector<std::string>& keys) {
  bool all = true;
  for (const auto& k : keys) all = control_.try_lookup(board_key(k)).has_value() && all;
  return all;
}

void ControlStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void ControlStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  for (const auto& k : keys) control_.lookup(board_key(k), timeout);
}

bool ControlStore::deleteKey(const std::string& key) {
  TORCH_CHECK(false, "ControlStore: deleteKey is not supported (the control plane's board keeps keys for the job's life)");
}

std::int64_t ControlStore::getNumKeys() { TORCH_CHECK(false, "ControlStore: getNumKeys is not supported"); }

#if TORCH_VERSION_MAJOR >= 2
c10::intrusive_ptr<c10d::Store> ControlStore::clone() { return c10::make_intrusive<ControlStore>(control_, prefix_, timeout_); }
#endif

}  // namespace ember::worker
