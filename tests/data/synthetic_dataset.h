// A synthetic dataset for tests that need one on disk (header-only: only tests that link
// ember_data include it, unlike test_util.cc, which every suite links).
#pragma once

#include <filesystem>

#include "ember/data/prep.h"
#include "ember/data/synthetic.h"

namespace ember::test {

// Generates `g` (its output set here to DIR/g.tsv) and prepares it, all rows train, into
// DIR/ds; returns that directory.
inline std::filesystem::path prepare_synthetic(const std::filesystem::path& dir, data::GenOptions g) {
  g.output = dir / "g.tsv";
  data::generate(g);
  data::PrepOptions p;
  p.inputs = {g.output};
  p.output = dir / "ds";
  data::prepare_dataset(p);
  return p.output;
}

}  // namespace ember::test
