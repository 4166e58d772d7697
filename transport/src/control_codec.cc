#include "control_codec.h"

#include <limits>
#include <type_traits>

#include "ember/common/error.h"

namespace ember::transport::control_codec {

using json = nlohmann::json;

namespace {

// Control messages nest at most three levels (welcome -> peers -> peer); deeper input is
// refused before the JSON parser builds it.
constexpr int kMaxDepth = 4;

void check_depth(std::string_view s) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth) throw ProtocolError("nested deeper than " + std::to_string(kMaxDepth) + " levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

json parse_object(std::string_view frame, std::int64_t max_bytes) {
  if (static_cast<std::int64_t>(frame.size()) > max_bytes)
    throw ProtocolError("frame of " + std::to_string(frame.size()) + " bytes exceeds " + std::to_string(max_bytes));
  check_depth(frame);
  json j = json::parse(frame.begin(), frame.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ProtocolError("not JSON");
  if (!j.is_object()) throw ProtocolError("not a JSON object");
  return j;
}

const json& field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) throw ProtocolError(std::string("no '") + name + "'");
  return *it;
}

std::string str(const json& j, const char* name, bool required = true) {
  auto it = j.find(name);
  if (it == j.end()) {
    if (required) throw ProtocolError(std::string("no '") + name + "'");
    return {};
  }
  if (!it->is_string()) throw ProtocolError(std::string("'") + name + "' must be a string, not " + it->type_name());
  const auto& s = it->get_ref<const std::string&>();
  if (s.size() > kMaxField) throw ProtocolError(std::string("'") + name + "' is longer than " + std::to_string(kMaxField) + " bytes");
  return s;
}

template <typename T>
T integer(const json& j, const char* name, T lo, T hi) {
  const json& v = field(j, name);
  if (!v.is_number_integer()) throw ProtocolError(std::string("'") + name + "' must be an integer, not " + v.type_name());
  bool ok;
  T out{};
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    ok = u <= static_cast<std::uint64_t>(hi) && (lo <= 0 || u >= static_cast<std::uint64_t>(lo));
    out = static_cast<T>(u);
  } else {
    const auto s = v.get<std::int64_t>();
    ok = s >= static_cast<std::int64_t>(lo) && (s < 0 || static_cast<std::uint64_t>(s) <= static_cast<std::uint64_t>(hi));
    out = static_cast<T>(s);
  }
  if (!ok) throw ProtocolError(std::string("'") + name + "' out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return out;
}

Role role(const json& j, const char* name) {
  const std::string s = str(j, name);
  if (s == "ps") return Role::kPs;
  if (s == "worker") return Role::kWorker;
  throw ProtocolError("unknown role '" + s.substr(0, 32) + "'");
}

// A nonce or a digest: exactly 2 x its size lowercase hex digits.
template <std::size_t N>
std::array<std::uint8_t, N> hex_field(const json& j, const char* name) {
  std::array<std::uint8_t, N> out{};
  const std::string s = str(j, name);
  if (!auth::from_hex(s, out))
    throw ProtocolError(std::string("'") + name + "' must be " + std::to_string(2 * N) + " lowercase hex digits");
  return out;
}

constexpr std::uint32_t kMaxMembers = 1u << 20;

int group(const json& j) { return integer<int>(j, "group", 0, 1); }

}  // namespace

std::string join_identity(Role role, int rank, const std::string& data) {
  return std::string(role_name(role)) + "\n" + std::to_string(rank) + "\n" + data;
}

ToCoordinator decode_to_coordinator(std::string_view frame) {
  const json j = parse_object(frame, kMaxToCoordinator);
  const std::string op = str(j, "op");
  if (op == "hello") return Hello{hex_field<16>(j, "nonce")};
  if (op == "join")
    return Join{hex_field<32>(j, "proof"), role(j, "role"), integer<int>(j, "rank", -1, kMaxMembers), str(j, "data", false)};
  if (op == "hb") return Heartbeat{};
  if (op == "barrier") return BarrierEnter{group(j), integer<std::uint64_t>(j, "gen", 0, std::numeric_limits<std::uint64_t>::max())};
  if (op == "publish") return Publish{str(j, "key"), str(j, "value")};
  if (op == "lookup") return Lookup{str(j, "key")};
  if (op == "add")
    return Add{
        integer<std::uint64_t>(j, "id", 0, std::numeric_limits<std::uint64_t>::max()), str(j, "key"),
        integer<std::int64_t>(j, "delta", std::numeric_limits<std::int64_t>::min() / 2, std::numeric_limits<std::int64_t>::max() / 2)};
  if (op == "leave") return Leave{};
  if (op == "abort") return Abort{str(j, "why"), j.contains("exit") ? integer<int>(j, "exit", 0, 255) : 0};
  if (op == "ending") return Ending{str(j, "why")};
  throw ProtocolError("unknown op '" + op.substr(0, 32) + "'");
}

FromCoordinator decode_from_coordinator(std::string_view frame) {
  const json j = parse_object(frame, kMaxFromCoordinator);
  const std::string op = str(j, "op");
  if (op == "challenge") return Challenge{hex_field<16>(j, "nonce"), hex_field<32>(j, "proof")};
  if (op == "welcome") {
    Welcome w;
    w.rank = integer<std::uint32_t>(j, "rank", 0, kMaxMembers);
    w.shape.ps = integer<std::uint32_t>(j, "ps", 1, kMaxMembers);
    w.shape.workers = integer<std::uint32_t>(j, "workers", 1, kMaxMembers);
    const json& peers = field(j, "peers");
    if (!peers.is_array()) throw ProtocolError("'peers' must be an array");
    if (peers.size() != static_cast<std::size_t>(w.shape.ps) + w.shape.workers)
      throw ProtocolError("'peers' has " + std::to_string(peers.size()) + " entries for a job of " + std::to_string(w.shape.ps) +
                          " ps and " + std::to_string(w.shape.workers) + " workers");
    for (const json& p : peers) {
      if (!p.is_object()) throw ProtocolError("a peer must be an object");
      w.peers.push_back(Peer{role(p, "role"), integer<std::uint32_t>(p, "rank", 0, kMaxMembers), str(p, "data")});
    }
    return w;
  }
  if (op == "error") return Refusal{str(j, "why")};
  if (op == "hb_ack") return HeartbeatAck{};
  if (op == "release") return Release{group(j), integer<std::uint64_t>(j, "gen", 0, std::numeric_limits<std::uint64_t>::max())};
  if (op == "value") return Value{str(j, "key"), str(j, "value")};
  if (op == "added")
    return Added{integer<std::uint64_t>(j, "id", 0, std::numeric_limits<std::uint64_t>::max()),
                 integer<std::int64_t>(j, "value", std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max())};
  if (op == "dead") return Dead{str(j, "member", false), str(j, "why")};
  if (op == "shutdown") return Shutdown{};
  throw ProtocolError("unknown op '" + op.substr(0, 32) + "'");
}

namespace {

template <class... F>
struct Overload : F... {
  using F::operator()...;
};
template <class... F>
Overload(F...) -> Overload<F...>;  // clang before 17 deduces no aggregate's arguments

}  // namespace

std::string encode(const ToCoordinator& m) {
  json j = std::visit(
      Overload{
          [](const Hello& x) {
            return json{{"op", "hello"}, {"nonce", auth::to_hex(x.nonce)}};
          },
          [](const Join& x) {
            return json{{"op", "join"}, {"proof", auth::to_hex(x.proof)}, {"role", role_name(x.role)}, {"rank", x.rank}, {"data", x.data}};
          },
          [](const Heartbeat&) {
            return json{{"op", "hb"}};
          },
          [](const BarrierEnter& x) {
            return json{{"op", "barrier"}, {"group", x.group}, {"gen", x.gen}};
          },
          [](const Publish& x) {
            return json{{"op", "publish"}, {"key", x.key}, {"value", x.value}};
          },
          [](const Lookup& x) {
            return json{{"op", "lookup"}, {"key", x.key}};
          },
          [](const Add& x) {
            return json{{"op", "add"}, {"id", x.id}, {"key", x.key}, {"delta", x.delta}};
          },
          [](const Leave&) {
            return json{{"op", "leave"}};
          },
          [](const Abort& x) {
            json out{{"op", "abort"}, {"why", x.why}};
            if (x.exit_status != 0) out["exit"] = x.exit_status;
            return out;
          },
          [](const Ending& x) {
            return json{{"op", "ending"}, {"why", x.why}};
          },
      },
      m);
  // Replace, not throw, on invalid UTF-8 (a reason may quote a peer's bytes).
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string encode(const FromCoordinator& m) {
  json j =
      std::visit(Overload{
                     [](const Challenge& x) {
                       return json{{"op", "challenge"}, {"nonce", auth::to_hex(x.nonce)}, {"proof", auth::to_hex(x.proof)}};
                     },
                     [](const Welcome& x) {
                       json peers = json::array();
                       for (const Peer& p : x.peers)
                         peers.push_back({{"role", role_name(p.role)}, {"rank", p.rank}, {"data", p.data_address}});
                       return json{{"op", "welcome"}, {"rank", x.rank}, {"ps", x.shape.ps}, {"workers", x.shape.workers}, {"peers", peers}};
                     },
                     [](const Refusal& x) {
                       return json{{"op", "error"}, {"why", x.why}};
                     },
                     [](const HeartbeatAck&) {
                       return json{{"op", "hb_ack"}};
                     },
                     [](const Release& x) {
                       return json{{"op", "release"}, {"group", x.group}, {"gen", x.gen}};
                     },
                     [](const Value& x) {
                       return json{{"op", "value"}, {"key", x.key}, {"value", x.value}};
                     },
                     [](const Added& x) {
                       return json{{"op", "added"}, {"id", x.id}, {"value", x.value}};
                     },
                     [](const Dead& x) {
                       return json{{"op", "dead"}, {"member", x.member}, {"why", x.why}};
                     },
                     [](const Shutdown&) {
                       return json{{"op", "shutdown"}};
                     },
                 },
                 m);
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace ember::transport::control_codec
