// The workers' dense checkpoint files as ember-export reads them: whether each is whole,
// and what it holds.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "ember/worker/dense_files.h"
#include "ember/worker/model.h"

namespace ember::worker {

// Checks every record of a dense checkpoint file (a zip archive) against its CRC-32;
// DataError naming the file ("FILE: checksum mismatch (corrupt dense checkpoint: record
// R)") for flipped bytes, or for a file whose archive cannot be read.
void verify_dense_file(const std::filesystem::path& file);

// A dense checkpoint file as ember-export reads it: its meta (iteration, num_keys,
// dim, ...), the model's configuration and the PS's seed, and the model's weights.
// DataError naming the file for one that is unreadable or written before files held
// the model's configuration.
struct DenseState {
  nlohmann::json meta;
  ModelConfig model;
  std::uint64_t ps_seed = 0;
  std::shared_ptr<CtrModel> weights;  // on the CPU
};
DenseState read_dense_state(const std::filesystem::path& file);

}  // namespace ember::worker
