// Proving knowledge of the job token without sending it: SHA-256 (FIPS 180-4) and
// HMAC-SHA256 (RFC 2104), fresh nonces from the kernel's CSPRNG (getrandom(2)), and the
// challenge-response proofs that the control plane's join and the data planes' hellos
// carry instead of the token.
//
// A proof is HMAC-SHA256(token, context || 0 || server nonce || client nonce || identity):
// the context names the exchange and the direction ("ember/2 tcp client", ... "server"),
// so no proof answers for another exchange or for the other side; the server's nonce is
// fresh per connection or join attempt, so a recorded proof answers no later challenge.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace ember::transport::auth {

using Digest = std::array<std::uint8_t, 32>;
using Nonce = std::array<std::uint8_t, 16>;

// SHA-256 of `data` (FIPS 180-4).
Digest sha256(std::span<const std::uint8_t> data);
// HMAC-SHA256 (RFC 2104) of `message` under `key`.
Digest hmac_sha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> message);

// Whether a[0, n) == b[0, n), in a time that does not depend on where they differ.
bool equal(const std::uint8_t* a, const std::uint8_t* b, std::size_t n);
inline bool equal(const Digest& a, const Digest& b) { return equal(a.data(), b.data(), a.size()); }

// 16 bytes from getrandom(2); throws IoError when the kernel has none to give.
Nonce random_nonce();

// The contexts of the proofs (one per exchange and direction).
inline constexpr std::string_view kTcpClient = "ember/2 tcp hello client";
inline constexpr std::string_view kTcpServer = "ember/2 tcp hello server";
inline constexpr std::string_view kRdmaClient = "ember/2 rdma hello client";
inline constexpr std::string_view kRdmaServer = "ember/2 rdma hello server";
inline constexpr std::string_view kJoinMember = "ember/2 control join member";
inline constexpr std::string_view kJoinCoordinator = "ember/2 control join coordinator";

// HMAC-SHA256(token, context || 0 || server_nonce || client_nonce || identity).
Digest proof(std::string_view token, std::string_view context, const Nonce& server_nonce, const Nonce& client_nonce,
             std::string_view identity = {});

// Lowercase hex, and back: from_hex is false unless `hex` is exactly 2 x out.size()
// lowercase hex digits.
std::string to_hex(std::span<const std::uint8_t> bytes);
bool from_hex(std::string_view hex, std::span<std::uint8_t> out);

}  // namespace ember::transport::auth
