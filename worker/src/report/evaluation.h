// Around training: worker 0's evaluation (AUC and log loss of the validation split, with
// rows read from the PS after a flush, so the model evaluated is the BSP one) and its
// dump of the whole model (--dump-dir: dense weights and every row).
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "ember/data/dataset.h"
#include "ember/ps/ps_client.h"
#include "ember/scheduler/key_directory.h"
#include "ember/worker/model.h"
#include "ember/worker/train_config.h"
#include "report/held_rows.h"

namespace ember::worker {

struct Evaluation {
  bool ran = false;  // false: no validation split
  double auc = -1, logloss = -1;
  std::uint64_t samples = 0;
};

// The model after `iteration` on the validation split (c.eval_samples of it; 0: all):
// rows in `held` from there (their holders' newer values), the others from the PS.
// Dynamic tables: `directory` (as it stood after `iteration`) finds each id's row; an id
// without one leaves its bag, as in training.
Evaluation evaluate(const data::Dataset& ds, const TrainConfig& c, ps::PsClient& client, CtrModel& model, torch::Device device,
                    std::uint32_t dim, std::uint64_t iteration, const HeldRows& held = HeldRows(),
                    const scheduler::KeyDirectory* directory = nullptr);

// Writes dense.bin, rows.bin and model.json into c.dump_dir, atomically each; with
// `directory` (dynamic tables: rows are slots), slot_ids.bin too: each slot's id as a
// uint64 (KeyDirectory::kNoId: free).
void dump_model(const TrainConfig& c, ps::PsClient& client, CtrModel& model, std::uint64_t num_keys, std::uint32_t dim,
                std::uint64_t iteration, const scheduler::KeyDirectory* directory = nullptr);

}  // namespace ember::worker
