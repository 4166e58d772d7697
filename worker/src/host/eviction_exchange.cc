#include "host/eviction_exchange.h"

#include <string>

#include "ember/common/error.h"

namespace ember::worker {
namespace {

constexpr std::int64_t kPartial = std::int64_t{1} << 62, kPushes = std::int64_t{1} << 61, kKey = kPushes - 1;

}  // namespace

std::vector<std::int64_t> encode_evictions(const std::vector<scheduler::RowEviction>& evictions, std::uint32_t rank) {
  std::vector<std::int64_t> words;
  for (const scheduler::RowEviction& e : evictions) {
    if (e.worker != rank) continue;
    words.push_back(static_cast<std::int64_t>(e.key) | (e.partial ? kPartial : 0) | (e.pushes ? kPushes : 0));
  }
  return words;
}

void decode_evictions(const std::vector<std::int64_t>& words, std::uint32_t rank, std::uint64_t num_keys,
                      std::vector<scheduler::RowEviction>& out) {
  for (const std::int64_t w : words) {
    const auto key = static_cast<Key>(w & kKey);
    if (w < 0 || key >= num_keys) {
      throw ProtocolError("worker " + std::to_string(rank) + "'s evictions name row " + std::to_string(key) + ", outside the " +
                          std::to_string(num_keys) + " rows");
    }
    out.push_back({key, rank, (w & kPartial) != 0, (w & kPushes) != 0});
  }
}

ExchangeBytes exchange_evictions(scheduler::Scheduler& s, EvictionChannel& channel, std::uint32_t rank) {
  const std::vector<std::int64_t> mine = encode_evictions(s.evictions(), rank);
  const std::vector<std::vector<std::int64_t>> all = channel.all_gather(mine);
  const scheduler::SchedulerConfig& c = s.config();
  std::vector<scheduler::RowEviction> others;
  ExchangeBytes bytes{mine.size() * sizeof(std::int64_t), 0};
  for (std::uint32_t r = 0; r < all.size(); ++r) {
    if (r != rank) bytes.in += all[r].size() * sizeof(std::int64_t);
    if (c.models(r)) continue;  // this host's: already applied
    decode_evictions(all[r], r, c.num_keys, others);
  }
  s.apply_evictions(others);
  return bytes;
}

}  // namespace ember::worker
