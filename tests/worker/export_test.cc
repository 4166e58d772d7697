// ember-export and ember-predict. The scripted dense model computes what CtrModel's
// forward computes, for every kind; and, with real processes, a short job's model,
// exported from its final checkpoint and from its dump, scores the raw validation lines
// with the AUC the training's final evaluation printed.
#include "ember/serve/export.h"

#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <zlib.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../data/test_util.h"
#include "ember/common/fs.h"
#include "ember/worker/model.h"

namespace ember::worker {
namespace {

using serve::ExportedModel;
using serve::script_model;

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

ModelConfig small_config(const std::string& kind, std::uint32_t num_dense) {
  ModelConfig c;
  c.kind = kind;
  c.num_dense = num_dense;
  c.num_tables = 5;
  c.dim = 8;
  c.bottom = {16, 12};
  c.top = {16};
  c.deep = {16, 8};
  c.cross_layers = 2;
  c.cross_rank = 6;
  return c;
}

TEST(ScriptedModel, ComputesCtrModelsForwardForEveryKind) {
  torch::NoGradGuard no_grad;
  for (const auto& [kind, num_dense] : std::vector<std::pair<std::string, std::uint32_t>>{
           {"dlrm", 13}, {"dlrm", 0}, {"wide-deep", 13}, {"deepfm", 13}, {"dcn", 13}, {"deepfm", 0}, {"dcnv2", 13}, {"dcnv2", 0}}) {
    SCOPED_TRACE(kind + " with " + std::to_string(num_dense) + " dense features");
    const ModelConfig c = small_config(kind, num_dense);
    torch::manual_seed(11);
    auto model = make_model(c);
    const auto dense = torch::rand({300, static_cast<std::int64_t>(num_dense)});
    const auto emb = torch::randn({300, 5, 8}) * 0.3;
    const auto want = model->forward(dense, emb);
    torch::jit::Module scripted = script_model(*model, c);
    // Several runs: the graph executor profiles the first ones and optimizes after.
    for (int run = 0; run < 4; ++run) {
      const auto got = scripted.forward({dense, emb}).toTensor();
      ASSERT_EQ(got.sizes(), want.sizes());
      EXPECT_EQ(max_abs_diff(got, want), 0.0) << "run " << run << ": the scripted forward is not CtrModel's, op for op";
    }
    EXPECT_EQ(max_abs_diff(scripted.run_method("probability", dense, emb).toTensor(), torch::sigmoid(want)), 0.0);
    // Saved and loaded back: the same.
    std::stringstream bytes;
    scripted.save(bytes);
    torch::jit::Module loaded = torch::jit::load(bytes);
    for (int run = 0; run < 4; ++run) EXPECT_EQ(max_abs_diff(loaded.forward({dense, emb}).toTensor(), want), 0.0) << "run " << run;
    // Its parameters are the model's, named as in named_parameters with '_' for '.'.
    std::size_t n = 0;
    for (const auto& p : loaded.named_parameters(false)) {
      ++n;
      std::string name = p.name;
      bool found = false;
      for (const auto& q : model->named_parameters()) {
        std::string k = q.key();
        std::replace(k.begin(), k.end(), '.', '_');
        if (k == name) found = max_abs_diff(q.value(), p.value) == 0.0;
      }
      EXPECT_TRUE(found) << name;
    }
    EXPECT_EQ(n, model->parameters().size());
  }
}

// The end-to-end round trip: prep (with a vocabulary), a job of 1 PS shard and 2
// workers, ember-export twice, ember-predict on the raw validation lines.
class ExportRoundTrip : public test::TempDirTest {
 protected:
  static constexpr int kWorkers = 2;
  const std::string kToken = "export-token";

  int run(const std::string& cmd, std::string& log) { return test::run_command(cmd, log); }

  // Runs the job; returns worker 0's final evaluation line.
  // `extra`: more flags for every worker; `ps_extra`: for the shard.
  json train(const fs::path& data, const std::string& model, std::uint64_t iterations, const std::vector<std::string>& extra = {},
             const std::vector<std::string>& ps_extra = {}) {
    std::vector<std::unique_ptr<test::Process>> ps, workers;
    const fs::path coord_file = dir_ / "coord";
    std::vector<std::string> ps_args = test::ps_command(
        {.data = data, .dim = 8, .workers = kWorkers, .optimizer = "adagrad", .token = kToken, .seed = 5, .coord_file = coord_file});
    ps_args.insert(ps_args.end(), {"--checkpoint-dir", (dir_ / "ckpt").string(), "--checkpoint-every", "10"});
    ps_args.insert(ps_args.end(), ps_extra.begin(), ps_extra.end());
    ps.push_back(std::make_unique<test::Process>(ps_args, dir_ / "ps.log"));
    const std::string coord = test::wait_for_file(coord_file, 20s);
    if (coord.empty()) {
      ADD_FAILURE() << "ember-ps did not start:\n" << ps[0]->log_tail(20);
      return {};
    }
    for (int w = 0; w < kWorkers; ++w) {
      std::vector<std::string> a = test::worker_command(data, coord, {"--token", kToken}, kWorkers, w);
      a.insert(a.end(), {"--model",
                         model,
                         "--bottom-mlp",
                         "32-16",
                         "--top-mlp",
                         "32-16",
                         "--deep-mlp",
                         "32-16",
                         "--batch-per-worker",
                         "64",
                         "--cache-ratio",
                         "0.5",
                         "--iterations",
                         std::to_string(iterations),
                         "--dense-lr",
                         "0.05",
                         "--dense-optimizer",
                         "adagrad",
                         "--eval-samples",
                         "0",
                         "--seed",
                         "5",
                         "--checkpoint-dir",
                         (dir_ / "dense").string(),
                         "--metrics",
                         (dir_ / ("w" + std::to_string(w) + ".jsonl")).string(),
                         "--heartbeat-timeout-ms",
                         "3000",
                         "--log-level",
                         "warn"});
      if (w == 0) a.insert(a.end(), {"--dump-dir", (dir_ / "dump").string()});
      a.insert(a.end(), extra.begin(), extra.end());
      workers.push_back(std::make_unique<test::Process>(a, dir_ / ("w" + std::to_string(w) + ".log")));
    }
    for (int w = 0; w < kWorkers; ++w) EXPECT_EQ(workers[w]->wait(300s), 0) << "worker " << w << ":\n" << workers[w]->log_tail(20);
    EXPECT_EQ(ps[0]->wait(30s), 0) << ps[0]->log_tail(20);
    json last;
    std::ifstream in(dir_ / "w0.jsonl");
    for (std::string line; std::getline(in, line);) {
      auto j = json::parse(line);
      if (j.value("eval", false)) last = j;
    }
    return last;
  }

  // ember-data prep of `input` with a validation split of 20%; returns its rows.
  std::uint64_t prepare(const fs::path& input, const std::string& format, const fs::path& data, const std::string& extra = "") {
    std::string log;
    EXPECT_EQ(run(test::bin("ember-data") + " prep --format " + format + extra + " --val-fraction 0.2 --min-count 2 -q -o " +
                      data.string() + " " + input.string(),
                  log),
              0)
        << log;
    return json::parse(read_file(data / "manifest.json")).at("rows").at("val").get<std::uint64_t>();
  }

  // ember-predict's JSON result (empty on failure, with the log in the test's output).
  json predict(const std::string& args) {
    std::string log;
    const int rc = run(test::bin("ember-predict") + " --json " + args, log);
    EXPECT_EQ(rc, 0) << log;
    if (rc != 0) return {};
    return json::parse(log.substr(log.rfind('{')));
  }
};

// The last `n` data lines of a text file (the validation split of an unshuffled prep
// without --test-fraction), with the header line first when the format has one.
std::string tail_lines(const fs::path& file, std::uint64_t n, bool header) {
  std::ifstream in(file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::string out = header ? lines.front() + "\n" : "";
  for (std::size_t i = lines.size() - n; i < lines.size(); ++i) out += lines[i] + "\n";
  return out;
}

TEST_F(ExportRoundTrip, PredictOnTheRawValidationLinesGivesTheTrainingsAuc) {
  // The real Criteo sample (the first 10,000 lines of Kaggle's train.txt), or synthetic
  // data where ../shared is absent.
  fs::path input = test::real_sample("criteo_kaggle_train_head10000.tsv");
  std::string log;
  if (input.empty()) {
    input = dir_ / "gen.tsv";
    ASSERT_EQ(run(test::bin("ember-data") + " gen --like criteo --rows 10000 --scale 0.001 --seed 3 -o " + input.string(), log), 0) << log;
  }
  const fs::path data = dir_ / "data";
  const std::uint64_t val_rows = prepare(input, "criteo", data);
  ASSERT_GT(val_rows, 1000u);

  const json eval = train(data, "dlrm", 30);
  ASSERT_FALSE(eval.is_null()) << "no evaluation line";
  ASSERT_EQ(eval.at("iteration").get<std::uint64_t>(), 30u);
  ASSERT_EQ(eval.at("samples").get<std::uint64_t>(), val_rows) << "the evaluation covers the whole validation split";
  const double trained_auc = eval.at("auc"), trained_logloss = eval.at("logloss");

  // Export the final checkpoint (the launcher-less layout: ps checkpoints in ckpt/, the
  // workers' dense state in dense/) and the dump.
  ASSERT_EQ(run(test::bin("ember-export") + " --checkpoint " + (dir_ / "ckpt").string() + " --dense " + (dir_ / "dense").string() +
                    " --dataset " + data.string() + " -o " + (dir_ / "from-ckpt").string(),
                log),
            0)
      << log;
  EXPECT_NE(log.find("iteration 30"), std::string::npos) << log;
  ASSERT_EQ(run(test::bin("ember-export") + " --dump " + (dir_ / "dump").string() + " --dataset " + data.string() + " -o " +
                    (dir_ / "from-dump").string(),
                log),
            0)
      << log;
  const fs::path val = write("val.tsv", tail_lines(input, val_rows, false));
  for (const char* exp : {"from-ckpt", "from-dump"}) {
    SCOPED_TRACE(exp);
    const json r =
        predict("--export " + (dir_ / exp).string() + " -o " + (dir_ / (std::string(exp) + ".txt")).string() + " " + val.string());
    ASSERT_FALSE(r.is_null());
    std::printf("%s: ember-predict on the raw validation lines: AUC %.10f, logloss %.10f\n", exp, r.at("auc").get<double>(),
                r.at("logloss").get<double>());
    EXPECT_EQ(r.at("samples").get<std::uint64_t>(), val_rows);
    EXPECT_NEAR(r.at("auc").get<double>(), trained_auc, 1e-6) << "the training's final evaluation: AUC " << trained_auc;
    EXPECT_NEAR(r.at("logloss").get<double>(), trained_logloss, 1e-6);
    // The prepared split scores the same.
    const json s = predict("--export " + (dir_ / exp).string() + " --dataset " + data.string() + " --split val");
    EXPECT_NEAR(s.at("auc").get<double>(), trained_auc, 1e-6);
  }
  // Both exports hold the same model: the same tables, the same probabilities.
  EXPECT_EQ(read_file(dir_ / "from-ckpt.txt"), read_file(dir_ / "from-dump.txt"));
  const auto m = json::parse(read_file(dir_ / "from-ckpt" / "manifest.json"));
  EXPECT_EQ(m.at("iterations").get<std::int64_t>(), 30);
  EXPECT_GT(m.at("rows_initial").get<std::uint64_t>(), 0u) << "rows never touched come from the PS's initialization";
  for (const auto& t : m.at("tables")) {
    const std::string a = read_file(dir_ / "from-ckpt" / t.at("file").get<std::string>());
    const std::string b = read_file(dir_ / "from-dump" / t.at("file").get<std::string>());
    const auto ta = torch::pickle_load(std::vector<char>(a.begin(), a.end())).toTensor();
    const auto tb = torch::pickle_load(std::vector<char>(b.begin(), b.end())).toTensor();
    ASSERT_EQ(ta.sizes(), tb.sizes());
    EXPECT_EQ(ta.size(0), t.at("rows").get<std::int64_t>());
    EXPECT_EQ(max_abs_diff(ta, tb), 0.0) << t.at("name");
  }
  std::printf("final evaluation: AUC %.10f, logloss %.10f on %llu validation samples\n", trained_auc, trained_logloss,
              static_cast<unsigned long long>(val_rows));

  // A launcher's --checkpoint-dir (ps/ and dense/ in it) and one checkpoint's directory.
  fs::create_directories(dir_ / "launcher");
  fs::create_directory_symlink(dir_ / "ckpt", dir_ / "launcher" / "ps");
  fs::create_directory_symlink(dir_ / "dense", dir_ / "launcher" / "dense");
  ASSERT_EQ(run(test::bin("ember-export") + " --checkpoint " + (dir_ / "launcher").string() + " --dataset " + data.string() + " -o " +
                    (dir_ / "from-launcher").string(),
                log),
            0)
      << log;
  EXPECT_EQ(read_file(dir_ / "from-launcher" / "tables" / "C3.pt"), read_file(dir_ / "from-ckpt" / "tables" / "C3.pt"));
  EXPECT_EQ(read_file(dir_ / "from-launcher" / "dense.pt").size(), read_file(dir_ / "from-ckpt" / "dense.pt").size());
  ASSERT_EQ(run(test::bin("ember-export") + " --checkpoint " + (dir_ / "ckpt" / "iter-000000019").string() + " --dense " +
                    (dir_ / "dense").string() + " --dataset " + data.string() + " -o " + (dir_ / "from-19").string(),
                log),
            0)
      << log;
  EXPECT_EQ(json::parse(read_file(dir_ / "from-19" / "manifest.json")).at("iterations").get<std::int64_t>(), 19);
  // An existing output is kept unless --force.
  EXPECT_EQ(run(test::bin("ember-export") + " --dump " + (dir_ / "dump").string() + " --dataset " + data.string() + " -o " +
                    (dir_ / "from-19").string(),
                log),
            2)
      << log;

  // Bad input: the data readers' errors, FILE:LINE, exit 3.
  std::string bad = tail_lines(input, 5, false);
  bad.insert(bad.find('\n', bad.find('\n') + 1) + 1, "1\t2\tnot-a-line\n");
  const fs::path bad_file = write("bad.tsv", bad);
  EXPECT_EQ(run(test::bin("ember-predict") + " --export " + (dir_ / "from-ckpt").string() + " " + bad_file.string(), log), 3) << log;
  EXPECT_NE(log.find(bad_file.string() + ":3: expected 40 fields, found 3"), std::string::npos) << log;
  EXPECT_EQ(run(test::bin("ember-predict") + " --export " + (dir_ / "from-ckpt").string() + " --format avazu " + val.string(), log), 3)
      << log;
  EXPECT_NE(log.find(val.string() + ":1: "), std::string::npos) << log;
  // The flag's old name (ember-worker's --model names a kind of model) names the new one.
  EXPECT_NE(run(test::bin("ember-predict") + " --model " + (dir_ / "from-ckpt").string() + " " + val.string(), log), 0) << log;
  EXPECT_NE(log.find("--model is now called --export"), std::string::npos) << log;
  // The checkpoint's dense state missing: named.
  EXPECT_EQ(run(test::bin("ember-export") + " --checkpoint " + (dir_ / "ckpt").string() + " --dense " + dir_.string() + " --dataset " +
                    data.string() + " -o " + (dir_ / "x").string(),
                log),
            3)
      << log;
  EXPECT_NE(log.find("no worker's dense state of iteration 30"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(dir_ / "x"));

  // A dataset of an older prep (no vocabulary): exported, it scores prepared splits,
  // and raw text gets a clear error.
  const fs::path old = dir_ / "old-data";
  fs::copy(data, old, fs::copy_options::recursive);
  fs::remove(old / "vocab.bin");
  auto om = json::parse(read_file(old / "manifest.json"));
  om.erase("vocabulary");
  write_file_atomic(old / "manifest.json", om.dump(2));
  ASSERT_EQ(run(test::bin("ember-export") + " --dump " + (dir_ / "dump").string() + " --dataset " + old.string() + " -o " +
                    (dir_ / "old-export").string(),
                log),
            0)
      << log;
  EXPECT_NEAR(predict("--export " + (dir_ / "old-export").string() + " --dataset " + old.string()).at("auc").get<double>(), trained_auc,
              1e-6);
  EXPECT_EQ(run(test::bin("ember-predict") + " --export " + (dir_ / "old-export").string() + " " + val.string(), log), 3) << log;
  EXPECT_NE(log.find("has no vocabulary"), std::string::npos) << log;

  // PyTorch itself reads the export (Debian's python3-torch), when installed.
  if (run("/usr/bin/python3 -c 'import torch'", log) != 0) {
    std::printf("python3-torch not installed: torch.load / torch.jit.load not checked\n");
    return;
  }
  const fs::path script = write("load.py", R"(
import json, sys, torch
d = sys.argv[1]
m = json.load(open(d + "/manifest.json"))
tables = [torch.load(d + "/" + t["file"]) for t in m["tables"]]
model = torch.jit.load(d + "/dense.pt")
n, nd = 7, len(m["dense_names"])
dense = torch.arange(n * nd, dtype=torch.float32).reshape(n, nd) / 10
emb = torch.stack([t[torch.arange(n) % t.shape[0]] for t in tables], 1)
with torch.no_grad():
    p = model.probability(dense, emb)
print(json.dumps({"shapes": [list(t.shape) for t in tables], "dtypes": [str(t.dtype) for t in tables],
                  "p": p.tolist()}))
)");
  ASSERT_EQ(run("/usr/bin/python3 " + script.string() + " " + (dir_ / "from-ckpt").string(), log), 0) << log;
  const json py = json::parse(log.substr(log.rfind('{')));
  const ExportedModel model = ExportedModel::load(dir_ / "from-ckpt");
  const std::size_t n = 7, nd = model.config().num_dense;
  std::vector<float> dense(n * nd);
  for (std::size_t i = 0; i < dense.size(); ++i) dense[i] = static_cast<float>(i) / 10;
  std::vector<std::vector<std::uint32_t>> ids(model.table_rows().size());
  std::vector<const std::uint32_t*> cols;
  for (std::size_t t = 0; t < ids.size(); ++t) {
    for (std::size_t i = 0; i < n; ++i) ids[t].push_back(static_cast<std::uint32_t>(i % model.table_rows()[t]));
    cols.push_back(ids[t].data());
    EXPECT_EQ(py.at("shapes")[t][0].get<std::uint64_t>(), model.table_rows()[t]);
    EXPECT_EQ(py.at("shapes")[t][1].get<std::uint32_t>(), model.config().dim);
    EXPECT_EQ(py.at("dtypes")[t].get<std::string>(), "torch.float32");
  }
  const std::vector<float> p = model.predict(dense.data(), cols, n);
  for (std::size_t i = 0; i < n; ++i) EXPECT_NEAR(py.at("p")[i].get<double>(), p[i], 1e-6) << i;

  // scripts/score_export.py: the raw validation lines scored in PyTorch alone, through the
  // export's vocabulary, as ember-predict scored them.
  ASSERT_EQ(run("/usr/bin/python3 " + std::string(EMBER_SOURCE_DIR) + "/scripts/score_export.py --export " + (dir_ / "from-ckpt").string() +
                    " -o " + (dir_ / "torch.txt").string() + " " + val.string(),
                log),
            0)
      << log;
  const json sj = json::parse(log.substr(log.rfind('{')));
  std::printf("scripts/score_export.py (PyTorch alone): AUC %.10f, logloss %.10f\n", sj.at("auc").get<double>(),
              sj.at("logloss").get<double>());
  EXPECT_NEAR(sj.at("auc").get<double>(), trained_auc, 1e-6);
  EXPECT_NEAR(sj.at("logloss").get<double>(), trained_logloss, 1e-6);
  std::ifstream a(dir_ / "torch.txt"), b(dir_ / "from-ckpt.txt");
  std::size_t lines = 0;
  for (double x, y; a >> x && b >> y; ++lines) ASSERT_NEAR(x, y, 1e-6) << "line " << lines + 1;
  EXPECT_EQ(lines, val_rows);
}

// Avazu (a CSV with a header, hashed values, no dense features) with DeepFM, the lines
// given gzip-compressed.
// Dynamic tables: the dump names each slot's id, ember-export writes each table's ids
// (ascending) and their rows after a zero row, and ember-predict on the raw validation
// lines, each value hashed as prep hashes it, gives the training's final evaluation (ids
// without a row, made after 2 batches or never seen, are the zero vector in both).
TEST_F(ExportRoundTrip, HashedIdsExportAsIdsAndRowsAndRawLinesScoreAsTrained) {
  const fs::path input = dir_ / "gen.tsv", data = dir_ / "data";
  std::string log;
  ASSERT_EQ(
      run(test::bin("ember-data") + " gen --like criteo --rows 10000 --scale 0.001 --new-ids 0.2 --seed 3 -o " + input.string() + " && " +
              test::bin("ember-data") + " prep --ids hash --format criteo --val-fraction 0.2 -q -o " + data.string() + " " + input.string(),
          log),
      0)
      << log;
  const std::uint64_t val_rows = json::parse(read_file(data / "manifest.json")).at("rows").at("val").get<std::uint64_t>();
  const json eval = train(data, "dlrm", 30, {"--create-after", "2", "--expire-after", "3"}, {"--slots-per-shard", "65536"});
  ASSERT_FALSE(eval.is_null()) << "no evaluation line";
  ASSERT_EQ(eval.at("samples").get<std::uint64_t>(), val_rows);
  const fs::path exported = dir_ / "hashed-export";
  ASSERT_EQ(
      run(test::bin("ember-export") + " --dump " + (dir_ / "dump").string() + " --dataset " + data.string() + " -o " + exported.string(),
          log),
      0)
      << log;
  const json m = json::parse(read_file(exported / "manifest.json"));
  EXPECT_EQ(m.at("ids").get<std::string>(), "hash");
  std::uint64_t with_rows = 0;
  for (const auto& t : m.at("tables")) {
    const std::string b = read_file(exported / t.at("ids_file").get<std::string>());
    const auto ids = torch::pickle_load(std::vector<char>(b.begin(), b.end())).toTensor();
    EXPECT_EQ(ids.size(0) + 1, t.at("rows").get<std::int64_t>()) << t.at("name");
    with_rows += static_cast<std::uint64_t>(ids.size(0));
  }
  EXPECT_GT(with_rows, 1000u);
  const fs::path val = write("val.tsv", tail_lines(input, val_rows, false));
  const json r = predict("--export " + exported.string() + " " + val.string());
  ASSERT_FALSE(r.is_null());
  EXPECT_EQ(r.at("samples").get<std::uint64_t>(), val_rows);
  EXPECT_NEAR(r.at("auc").get<double>(), eval.at("auc").get<double>(), 1e-6);
  EXPECT_NEAR(r.at("logloss").get<double>(), eval.at("logloss").get<double>(), 1e-6);
  // The job's final checkpoint names each slot's id too: its export holds the same ids
  // and rows as the dump's (the shards' files re-placed on one shard: ascending ids;
  // the rows expired after the last iteration cleared at the final commit).
  const fs::path from_ckpt = dir_ / "from-ckpt";
  ASSERT_EQ(run(test::bin("ember-export") + " --checkpoint " + (dir_ / "ckpt").string() + " --dense " + (dir_ / "dense").string() +
                    " --dataset " + data.string() + " -o " + from_ckpt.string(),
                log),
            0)
      << log;
  const auto tensor = [](const fs::path& f) {
    const std::string b = read_file(f);
    return torch::pickle_load(std::vector<char>(b.begin(), b.end())).toTensor();
  };
  for (const auto& t : m.at("tables")) {
    for (const char* file : {"ids_file", "file"}) {
      const std::string name = t.at(file).get<std::string>();
      EXPECT_TRUE(torch::equal(tensor(exported / name), tensor(from_ckpt / name))) << name;
    }
  }
}

TEST_F(ExportRoundTrip, AvazuDeepFmFromGzipText) {
  fs::path input = dir_ / "avazu.csv";
  std::string log;
  ASSERT_EQ(run(test::bin("ember-data") + " gen --like avazu --rows 6000 --scale 0.001 --seed 4 -o " + input.string(), log), 0) << log;
  const fs::path data = dir_ / "data";
  const std::uint64_t val_rows = prepare(input, "avazu", data);
  const json eval = train(data, "deepfm", 20);
  ASSERT_FALSE(eval.is_null()) << "no evaluation line";
  ASSERT_EQ(eval.at("samples").get<std::uint64_t>(), val_rows);
  ASSERT_EQ(run(test::bin("ember-export") + " --checkpoint " + (dir_ / "ckpt").string() + " --dense " + (dir_ / "dense").string() +
                    " --dataset " + data.string() + " -o " + (dir_ / "model").string(),
                log),
            0)
      << log;
  const std::string val = tail_lines(input, val_rows, true);
  const fs::path gz = dir_ / "val.csv.gz";
  gzFile f = gzopen(gz.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, val.data(), static_cast<unsigned>(val.size())), static_cast<int>(val.size()));
  gzclose(f);
  const json r = predict("--export " + (dir_ / "model").string() + " " + gz.string());
  ASSERT_FALSE(r.is_null());
  std::printf("avazu deepfm: final evaluation AUC %.10f; ember-predict on the gzip lines: AUC %.10f\n", eval.at("auc").get<double>(),
              r.at("auc").get<double>());
  EXPECT_EQ(r.at("samples").get<std::uint64_t>(), val_rows);
  EXPECT_NEAR(r.at("auc").get<double>(), eval.at("auc").get<double>(), 1e-6);
  EXPECT_NEAR(r.at("logloss").get<double>(), eval.at("logloss").get<double>(), 1e-6);
}

// Multi-hot Criteo-like text (bags split by '|', MLPerf-like sizes scaled down) with
// DCNv2 and mean pooling: ember-predict pools the raw lines' bags as training did.
TEST_F(ExportRoundTrip, MultiHotBagsArePooledAsTrained) {
  const fs::path input = dir_ / "bags.tsv";
  std::string log;
  ASSERT_EQ(run(test::bin("ember-data") + " gen --like criteo --rows 6000 --scale 0.001 --seed 6 --multi-hot " +
                    "3,2,1,2,6,1,1,1,1,7,3,8,0,6,9,5,1,1,1,12,4,2,10,3,1,1 --multi-hot-dist zipf -o " + input.string(),
                log),
            0)
      << log;
  const fs::path data = dir_ / "data";
  const std::uint64_t val_rows = prepare(input, "criteo", data, " --multi-hot-sep '|'");
  const json eval = train(data, "dcnv2", 20, {"--pooling", "mean"});
  ASSERT_FALSE(eval.is_null()) << "no evaluation line";
  ASSERT_EQ(eval.at("samples").get<std::uint64_t>(), val_rows);
  ASSERT_EQ(run(test::bin("ember-export") + " --checkpoint " + (dir_ / "ckpt").string() + " --dense " + (dir_ / "dense").string() +
                    " --dataset " + data.string() + " -o " + (dir_ / "model").string(),
                log),
            0)
      << log;
  const auto m = json::parse(read_file(dir_ / "model" / "manifest.json"));
  EXPECT_EQ(m.at("model").at("pooling").get<std::string>(), "mean");
  const fs::path val = write("val.tsv", tail_lines(input, val_rows, false));
  const json r = predict("--export " + (dir_ / "model").string() + " " + val.string());
  ASSERT_FALSE(r.is_null());
  std::printf("multi-hot dcnv2 (mean): final evaluation AUC %.10f; ember-predict on the raw lines: AUC %.10f\n",
              eval.at("auc").get<double>(), r.at("auc").get<double>());
  EXPECT_EQ(r.at("samples").get<std::uint64_t>(), val_rows);
  EXPECT_NEAR(r.at("auc").get<double>(), eval.at("auc").get<double>(), 1e-6);
  EXPECT_NEAR(r.at("logloss").get<double>(), eval.at("logloss").get<double>(), 1e-6);
  const json s = predict("--export " + (dir_ / "model").string() + " --dataset " + data.string() + " --split val");
  EXPECT_NEAR(s.at("auc").get<double>(), eval.at("auc").get<double>(), 1e-6);
}

}  // namespace
}  // namespace ember::worker
