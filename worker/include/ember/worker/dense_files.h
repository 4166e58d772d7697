// Where the workers' dense checkpoint files are (without LibTorch: the launchers' tests
// and ember-export find them by name).
#pragma once

#include <cstdint>
#include <filesystem>

namespace ember::worker {

// Where worker `rank` writes its dense state of `iteration` under `dir`
// (worker-R-iter-NNNNNNNNN.pt: sorts by iteration; one file per worker, since hosts may
// share no filesystem, though the replicas are identical).
std::filesystem::path dense_checkpoint_file(const std::filesystem::path& dir, std::uint32_t rank, std::uint64_t iteration);

}  // namespace ember::worker
