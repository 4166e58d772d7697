#include "ember/worker/worker_options.h"

#include <algorithm>
#include <iterator>
#include <nlohmann/json.hpp>

#include "ember/common/error.h"
#include "ember/ps/row_options.h"
#include "ember/scheduler/scheduler_cli.h"
#include "ember/transport/job_connection_options.h"

namespace ember::worker {

namespace {

using Decl = OptionDecl<TrainConfig>;
constexpr unsigned kWorker = kWorkerProgram;

template <class Base, class T>
Decl option(const char* flag, T Base::*member, const char* help) {
  return field_option<TrainConfig>(flag, member, help, kWorker);
}

// A model option bound to a ModelConfig field.
template <class T>
Decl model_option(const char* flag, T ModelConfig::*member, const char* help) {
  return member_option<TrainConfig>(
      flag, member, help, kWorker, [](auto& c) -> auto& { return c.model; });
}

std::string layers(const std::vector<std::int64_t>& l) {
  std::string s;
  for (std::int64_t n : l) s += (s.empty() ? "" : "-") + std::to_string(n);
  return s.empty() ? "none" : s;
}

// The workers of a model kind that does not build `value`'s layers (space-separated
// `kinds` do) may differ on it: the same word for every kind that ignores it.
std::string for_models(const TrainConfig& c, const std::string& kinds, const std::string& value) {
  const std::string k = " " + kinds + " ";
  return k.find(" " + c.model.effective_kind() + " ") != std::string::npos ? value : "unused";
}

// A layer list written "512-256-64", bound to a ModelConfig field, built by `kinds`.
Decl layers_option(const char* flag, std::vector<std::int64_t> ModelConfig::*member, const char* help, const char* kinds) {
  Decl d;
  d.flag = flag;
  d.help = help;
  d.programs = kWorker;
  d.kind = OptionKind::kText;
  d.agreed = true;
  d.add = [flag = d.flag, help = d.help, member](CLI::App& app, TrainConfig& c) {
    return app
        .add_option_function<std::string>(
            flag,
            [flag, member, &c](const std::string& text) {
              try {
                c.model.*member = parse_layers(text, flag);
              } catch (const ConfigError& e) {
                throw CLI::ValidationError(e.what());
              }
            },
            help)
        ->default_str(layers(c.model.*member));
  };
  d.text = [member](const TrainConfig& c) { return layers(c.model.*member); };
  d.value = [member, kinds = std::string(kinds)](const TrainConfig& c) { return for_models(c, kinds, layers(c.model.*member)); };
  return d;
}

// The model's options (the workers agree on each).
std::vector<Decl> model_options() {
  return {
      model_option("--model", &ModelConfig::kind, "wide-deep, deepfm, dcn, dcnv2 (low-rank cross layers, MLPerf's DLRM-DCNv2), dlrm")
          .must_agree()
          .compared_as([](const TrainConfig& c) { return c.model.effective_kind(); }),
      model_option("--model-file", &ModelConfig::file,
                   "train this TorchScript module instead of a --model (written in Python: examples/models/; "
                   "forward(dense [B, num_dense], emb [B, tables, dim]) -> logits [B]; its parameters and initial values "
                   "its own)")
          .must_agree()
          .job_setting()
          .compared_as([](const TrainConfig& c) { return model_file_identity(c.model.file); }),
      layers_option("--bottom-mlp", &ModelConfig::bottom, "dlrm, dcnv2 bottom MLP (then the embedding dim)", "dlrm dcnv2"),
      layers_option("--top-mlp", &ModelConfig::top, "dlrm, dcnv2 top MLP (then 1)", "dlrm dcnv2"),
      layers_option("--deep-mlp", &ModelConfig::deep, "wide-deep / deepfm / dcn deep MLP", "wide-deep deepfm dcn"),
      model_option("--cross-layers", &ModelConfig::cross_layers, "dcn, dcnv2 cross layers")
          .must_agree()
          .compared_as([](const TrainConfig& c) { return for_models(c, "dcn dcnv2", std::to_string(c.model.cross_layers)); }),
      model_option("--cross-rank", &ModelConfig::cross_rank, "dcnv2: rank of each cross layer (MLPerf: 512)")
          .must_agree()
          .compared_as([](const TrainConfig& c) { return for_models(c, "dcnv2", std::to_string(c.model.cross_rank)); }),
      model_option("--pooling", &ModelConfig::pooling,
                   "multi-hot datasets: a table's bag of rows into one vector by sum or mean (one-hot: no effect)")
          .must_agree()
          .checked(CLI::IsMember({"sum", "mean"})),
  };
}

// This worker's own: its connection to the job (the flags ember-ps takes too), its
// addresses, threads, device, files, reporting and timeouts.
std::vector<Decl> process_options() {
  std::vector<Decl> d = lift_options<TrainConfig>(transport::job_connection_options());
  std::vector<Decl> own = {
      option("--rank", &TrainConfig::rank, "this worker's rank (default: assigned at join)"),
      option("--device", &TrainConfig::device, "cpu, cuda or cuda:N (the embedding cache then lives in GPU memory)"),
      option("--cache-backend", &TrainConfig::cache_backend, "auto, host (CPU memory, the PS's optimizer code) or tensor (device memory)"),
      option("--ps-connections", &TrainConfig::ps_connections, "data connections per PS shard (keys spread over them)"),
      option("--torch-threads", &TrainConfig::torch_threads, "LibTorch intra-op threads"),
      option("--progress-every", &TrainConfig::progress_every, "iterations between progress lines (worker 0)"),
      option("--metrics", &TrainConfig::metrics_file, "JSON lines: one per iteration, evaluation and the summary"),
      option("--restart-record", &TrainConfig::restart_record,
             "a restarted job's record from its launcher (JSON: restarts, iterations_recomputed, lost_at): reported in the "
             "summary and on /metrics, with the seconds from the loss to training again"),
      option("--dump-dir", &TrainConfig::dump_dir, "worker 0 writes the final dense weights and every embedding row here"),
      option("--checkpoint-dir", &TrainConfig::checkpoint_dir,
             "write this worker's dense model and optimizer here at every PS checkpoint (ember-ps --checkpoint-every), for "
             "--resume; with it, SIGTERM/SIGINT stops the job at a checkpoint a few iterations on (a second signal stops now)"),
      ps::keep_checkpoints_option<TrainConfig>(&TrainConfig::keep_checkpoints),
      option("--gloo-host", &TrainConfig::gloo_host, "address the dense all-reduce (Gloo) binds on"),
      millis_option<TrainConfig>("--timeout-ms", &TrainConfig::timeout, "PS request timeout", kWorker),
      millis_option<TrainConfig>("--join-timeout-ms", &TrainConfig::join_timeout, "wait this long for the job to form", kWorker),
  };
  std::move(own.begin(), own.end(), std::back_inserter(d));
  return d;
}

std::vector<Decl> declare() {
  // The workers agree on the dataset (by its identity), the model, the dense optimizer
  // (the replicas step alike), the scheduler's options that shape the plans, the
  // all-reduce and the aggregation (both change which sums are made where) and where
  // the job starts. Each worker's own addresses, threads, device, files, reporting and
  // timeouts may differ: the dense gradients are summed before any replica steps, and
  // only worker 0 evaluates and dumps.
  std::vector<Decl> d = {
      option("--dataset", &TrainConfig::dataset, "ember-data dataset directory (required, unless --stream)").must_agree()};
  auto add = [&d](std::vector<Decl> part) { std::move(part.begin(), part.end(), std::back_inserter(d)); };
  add(model_options());
  add({
      option("--dense-optimizer", &TrainConfig::dense_optimizer, "sgd or adagrad").must_agree(),
      option("--dense-lr", &TrainConfig::dense_lr, "dense learning rate").must_agree(),
  });
  for (Decl& s : lift_options<TrainConfig>(scheduler::scheduler_options())) {
    if ((s.programs & kWorker) != 0) d.push_back(std::move(s));
  }
  add({
      option("--allreduce", &TrainConfig::allreduce,
             "dense all-reduce: flat (one ring over every worker) or hierarchical (within each host, across the hosts' "
             "leaders, back within the host)")
          .must_agree()
          .checked(CLI::IsMember({"flat", "hierarchical"})),
      option("--host-aggregation", &TrainConfig::host_aggregation,
             "per-host aggregation: a row of a PS shard on another host crosses once per host and phase (pulled by one "
             "worker of the host and handed to the others; gradients summed within the host and pushed once)")
          .must_agree(),
      option("--resume", &TrainConfig::resume,
             "continue from the iteration the PS shards restored (ember-ps --restore), with the dense state of that "
             "iteration from --checkpoint-dir")
          .must_agree(),
      option("--overlap-allreduce", &TrainConfig::overlap_allreduce,
             "sum the dense gradients over the workers while the PS exchange runs (waited for before the next forward pass)")
          .job_setting(),
      option("--progressive-window", &TrainConfig::progressive_window,
             "progressive validation: each global batch scored by the model before it trains on it; AUC and log loss over the "
             "last N iterations in the progress line, summary.json and /metrics (0: off; 2 floats a sample join the all-reduce)")
          .must_agree()
          .job_setting(),
  });
  add(process_options());
  return d;
}

}  // namespace

const std::vector<OptionDecl<TrainConfig>>& worker_options() {
  static const std::vector<Decl> decls = declare();  // immutable after its first use
  return decls;
}

void add_worker_options(CLI::App& app, TrainConfig& c) {
  add_options(app, worker_options(), c, kWorkerProgram);
  app.get_option("--dataset")->excludes(app.get_option("--stream"));  // one of them: open_job_data
}

std::string worker_options_json(const TrainConfig& c) {
  nlohmann::json out = nlohmann::json::array();
  for (const Decl& d : worker_options()) {
    out.push_back({{"flag", d.flag},
                   {"kind", kind_name(d.kind)},
                   {"default", d.text(c)},
                   {"help", d.help},
                   {"agreed", d.agreed},
                   {"setting", d.setting}});
  }
  return out.dump(1);
}

}  // namespace ember::worker
