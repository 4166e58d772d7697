// Models from files (ember-worker --model-file): a TorchScript module written in Python
// (examples/models/) is refused, in one line naming the file, when it breaks the
// contract; trains the same model as its built-in twin from the same weights; trains the
// one-process model in real jobs (vanilla, herald with lookahead and prefetch, the host
// hierarchy); resumes exactly; and is exported as the user's module with the trained
// weights. Needs a python3 with PyTorch (python3-torch) to write the files: skips
// without one.
#include <gtest/gtest.h>
#include <torch/script.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../data/test_util.h"
#include "ember/common/error.h"
#include "ember/common/fs.h"
#include "ember/worker/model.h"
#include "job_fixture.h"

namespace ember::worker {
namespace {

using namespace test_jobs;

// A python3 that imports torch (Debian's python3-torch is /usr/bin/python3's); empty: none.
std::string python_with_torch() {
  for (const char* py : {"/usr/bin/python3", "python3"}) {
    std::string out;
    if (test::run_command(std::string(py) + " -c 'import torch' 2>&1", out) == 0) return py;
  }
  return "";
}

class ModelFile : public JobTest {
 protected:
  void SetUp() override {
    JobTest::SetUp();
    python_ = python_with_torch();
    if (python_.empty()) GTEST_SKIP() << "no python3 with PyTorch (scripts/install_deps.sh --ops installs python3-torch)";
  }

  // examples/models/NAME.py's model written with `args`; its path.
  std::string example(const std::string& name, const std::string& args) {
    const fs::path out = dir_ / (name + ".pt");
    std::string log;
    const fs::path script = fs::path(EMBER_SOURCE_DIR) / "examples" / "models" / (name + ".py");
    EXPECT_EQ(test::run_command(python_ + " " + script.string() + " -o " + out.string() + " " + args + " 2>&1", log), 0) << log;
    return out.string();
  }

  // A module of class M defined by Python `code`, scripted and saved; its path.
  std::string module(const std::string& name, const std::string& code) {
    const fs::path py = dir_ / (name + ".py"), out = dir_ / (name + ".pt");
    std::ofstream(py) << "import torch\n" << code << "\ntorch.jit.script(M()).save('" << out.string() << "')\n";
    std::string log;
    EXPECT_EQ(test::run_command(python_ + " " + py.string() + " 2>&1", log), 0) << log;
    return out.string();
  }

  static ModelConfig shape(const std::string& file) {
    ModelConfig c;
    c.file = file;
    c.num_dense = 13;
    c.num_tables = 26;
    c.dim = 16;
    return c;
  }

  std::string python_;
};

void expect_refused(const ModelConfig& c, const std::string& says) {
  try {
    make_model(c);
    ADD_FAILURE() << c.file << " was taken; expected: " << says;
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--model-file " + c.file + ": "), std::string::npos) << what;
    EXPECT_NE(what.find(says), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
  }
}

TEST_F(ModelFile, BrokenContractsAreRefusedNamingTheFile) {
  expect_refused(shape((dir_ / "missing.pt").string()), "no such file");
  write_file_atomic(dir_ / "text.pt", "not a model\n");
  expect_refused(shape((dir_ / "text.pt").string()), "not a TorchScript module");
  const std::string linear = "        self.l = torch.nn.Linear(13, 1)\n";
  expect_refused(shape(module("one_input", "class M(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n" + linear +
                                               "    def forward(self, dense):\n        return self.l(dense).squeeze(1)\n")),
                 "forward must be forward(self, dense: Tensor, emb: Tensor) -> Tensor");
  expect_refused(shape(module("column", "class M(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n" + linear +
                                            "    def forward(self, dense, emb):\n        return self.l(dense)\n")),
                 "forward returns a tensor of shape [2, 1]");
  expect_refused(shape(module("double", "class M(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n" + linear +
                                            "    def forward(self, dense, emb):\n        return self.l(dense).squeeze(1).double()\n")),
                 "forward returns Double");
  expect_refused(shape(module("no_params",
                              "class M(torch.nn.Module):\n    def forward(self, dense, emb):\n"
                              "        return dense.sum(1) + emb.sum(2).sum(1)\n")),
                 "has no parameters to train");
  // Written for 5 tables, given 26.
  expect_refused(shape(example("dcnv2", "--tables 5 --bottom 16 --top 16 --rank 4")),
                 "forward fails on dense [2, 13] and emb [2, 26, 16] (this dataset's shape)");

  // ember-worker refuses before it joins a job: one line, exit 2.
  std::string out;
  EXPECT_EQ(test::run_command(test::bin("ember-worker") + " --dataset " + dir_.string() + " --coordinator tcp://127.0.0.1:1 --model-file " +
                                  (dir_ / "text.pt").string() + " 2>&1",
                              out),
            2)
      << out;
  EXPECT_NE(out.find("--model-file " + (dir_ / "text.pt").string() + ": not a TorchScript module"), std::string::npos) << out;
}

// The same steps on the built-in model and on its Python twin, from the same weights.
void expect_trains_as_twin(CtrModel& builtin, CtrModel& file, const std::string& what) {
  ASSERT_EQ(builtin.parameters().size(), file.parameters().size()) << what;
  load_flat_params(builtin, flatten_params(file));
  torch::manual_seed(3);
  auto opt_a = make_dense_optimizer("adagrad", builtin.parameters(), 0.05f);
  auto opt_b = make_dense_optimizer("adagrad", file.parameters(), 0.05f);
  double worst_logit = 0, worst_grad = 0;
  for (int step = 0; step < 5; ++step) {
    const auto dense = torch::rand({64, 13});
    const auto emb = torch::randn({64, 26, 16}) * 0.1;
    const auto labels = (torch::rand({64}) < 0.3).to(torch::kFloat32);
    auto ea = emb.clone().requires_grad_(), eb = emb.clone().requires_grad_();
    auto la = builtin.forward(dense, ea), lb = file.forward(dense, eb);
    worst_logit = std::max(worst_logit, (la - lb).abs().max().item<double>());
    opt_a->zero_grad();
    opt_b->zero_grad();
    torch::binary_cross_entropy_with_logits(la, labels).backward();
    torch::binary_cross_entropy_with_logits(lb, labels).backward();
    worst_grad = std::max(worst_grad, (ea.grad() - eb.grad()).abs().max().item<double>());
    opt_a->step();
    opt_b->step();
  }
  const auto a = flatten_params(builtin), b = flatten_params(file);
  double worst_param = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst_param = std::max(worst_param, static_cast<double>(std::abs(a[i] - b[i])));
  EXPECT_LT(worst_logit, 1e-5) << what;
  EXPECT_LT(worst_grad, 1e-7) << what << ": the embeddings' gradients (what the rows get)";
  EXPECT_LT(worst_param, 1e-5) << what;
  std::printf("%s: after 5 Adagrad steps, largest difference of logits %.3g, embedding gradients %.3g, parameters %.3g\n", what.c_str(),
              worst_logit, worst_grad, worst_param);
}

TEST_F(ModelFile, TrainsAsItsBuiltInTwin) {
  {
    ModelConfig c = shape(example("dlrm", "--bottom 32-16 --top 32-16"));
    auto file = make_model(c);
    c.file.clear();
    c.kind = "dlrm";
    c.bottom = {32, 16};
    c.top = {32, 16};
    auto builtin = make_model(c);
    expect_trains_as_twin(*builtin, *file, "dlrm");
  }
  {
    ModelConfig c = shape(example("dcnv2", "--bottom 32 --top 32-16 --layers 2 --rank 8"));
    auto file = make_model(c);
    c.file.clear();
    c.kind = "dcnv2";
    c.bottom = {32};
    c.top = {32, 16};
    c.cross_layers = 2;
    c.cross_rank = 8;
    auto builtin = make_model(c);
    expect_trains_as_twin(*builtin, *file, "dcnv2");
  }
}

// AutoInt, which Ember has no built-in for, in real jobs: vanilla; herald with lookahead
// and prefetch; herald on 2 hosts x 2 workers with the whole host hierarchy. Each trains
// what one process trains on the same batches; the job's workers and the one process all
// start from the file's weights.
TEST_F(ModelFile, JobsTrainTheOneProcessModel) {
  const fs::path data = dataset();
  const std::string file = example("autoint", "--tables 26 --dense 13 --dim 8 --layers 2 --heads 2");
  struct Case {
    const char* name;
    std::string policy;
    bool window, hosts;
  };
  for (const Case& c : {Case{"file-vanilla", "vanilla", false, false}, Case{"file-herald-window", "herald", true, false},
                        Case{"file-herald-hosts", "herald", true, true}}) {
    JobOptions o;
    o.policy = c.policy;
    o.model_file = file;
    o.optimizer = "adagrad";
    o.cache_ratio = "0.06";
    if (c.window) {
      o.lookahead = 2;
      o.prefetch = true;
    }
    if (c.hosts) {
      o.workers_per_host = 2;
      o.host_aggregation = o.host_allocation = o.peer_sync = true;
      o.allreduce = "hierarchical";
    }
    run_job_like_one_process(data, o, c.name, std::string(c.name) + " on autoint.pt");
  }
}

// MLPerf's bags under cache pressure (a tenth of the rows cached, evictions every
// iteration), SGD: vanilla, herald and one process train the same model within float
// rounding. The model is DLRM with a smooth activation: with ReLU these runs end up to
// 1e-4 apart, because one sample's top-MLP pre-activation sits 3e-7 from 0 at iteration
// 47 and the other summation order flips it (docs/training.md "Same model, whatever the
// policy"); Softplus has no kink to flip, so a sample's gradient mishandled by a policy
// would show here as a 1e-3 difference, not hide in one.
TEST_F(ModelFile, MultiHotPoliciesAgreeUnderCachePressure) {
  const fs::path tsv = dir_ / "mlperf.tsv", data = dir_ / "mlperf";
  std::string log;
  ASSERT_EQ(test::run_command(test::bin("ember-data") + " gen --like criteo --rows 4000 --scale 0.002 --seed 11 --multi-hot mlperf -q -o " +
                                  tsv.string() + " && " + test::bin("ember-data") + " prep --multi-hot-sep '|' --format criteo -q -o " +
                                  data.string() + " " + tsv.string() + " 2>&1",
                              log),
            0)
      << log;
  JobOptions o;
  o.model_file = example("dlrm", "--tables 26 --dense 13 --dim 8 --bottom 16 --top 16 --activation softplus");
  o.workers = 2;
  o.batch = 32;
  o.iterations = 48;
  o.cache_ratio = "0.1";
  one_process_tolerance_ = 1e-6;
  std::map<std::string, JobResult> jobs;
  for (const char* policy : {"vanilla", "herald"}) {
    o.policy = policy;
    jobs[policy] = run_job_like_one_process(data, o, std::string("mlperf-") + policy, std::string(policy) + " on MLPerf bags, cache 0.1");
    const auto sim = simulate(data, o);
    if (o.policy == "herald") {
      EXPECT_GT(sim.at("push_evict"), o.iterations) << "herald must push evicted rows in every iteration, or the case proves little";
    }
  }
  EXPECT_LT(max_abs_diff(jobs["vanilla"].dump.rows, jobs["herald"].dump.rows), 1e-6);
  EXPECT_LT(max_abs_diff(jobs["vanilla"].dump.dense, jobs["herald"].dump.dense), 1e-6);
}

TEST_F(ModelFile, JobsResumeExactly) {
  JobOptions o = checkpointing_job({"--checkpoint-every", "4"});
  o.model_file = example("dlrm", "--tables 26 --dense 13 --dim 8 --bottom 16 --top 16");
  // DLRM's first Adagrad steps magnify float rounding (LibTorch 2.11 on an H200
  // machine's CPU: 2.4e-5 from one-process training); the resume is still exact.
  one_process_tolerance_ = 1e-4;
  expect_resumes_exactly(dataset(), o, "file", "a model file");
}

// The export of a model file's job is the user's module with the trained weights, and
// scores as the trained model does.
TEST_F(ModelFile, ExportIsTheUsersModuleWithTheTrainedWeights) {
  const fs::path data = dataset();
  JobOptions o;
  o.model_file = example("autoint", "--tables 26 --dense 13 --dim 8");
  const JobResult job = run_job(data, o, "exp");
  ASSERT_FALSE(job.dump.dense.empty());
  std::string log;
  const fs::path out = dir_ / "export";
  ASSERT_EQ(test::run_command(test::bin("ember-export") + " --dump " + (dir_ / "exp-model").string() + " --dataset " + data.string() +
                                  " --output " + out.string() + " 2>&1",
                              log),
            0)
      << log;
  torch::jit::Module m = torch::jit::load((out / "dense.pt").string());
  std::vector<float> exported;
  for (const auto& p : m.parameters()) {
    const auto t = p.contiguous();
    exported.insert(exported.end(), t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
  }
  EXPECT_EQ(exported, job.dump.dense) << "the exported parameters are the trained ones, in the module's order";
  EXPECT_TRUE(m.find_method("probability").has_value());
  // ember-predict scores the validation split through it as the training's final
  // evaluation did.
  ASSERT_EQ(test::run_command(test::bin("ember-predict") + " --json --export " + out.string() + " --dataset " + data.string() +
                                  " --split val 2>/dev/null",
                              log),
            0)
      << log;
  const auto scored = nlohmann::json::parse(log.substr(log.find('{')));
  ASSERT_GT(job.auc, 0.0);
  EXPECT_NEAR(scored.at("auc").get<double>(), job.auc, 1e-6) << log;
  // The file the model was trained from is checked when the dump is read back: a changed
  // file is refused.
  std::ofstream(o.model_file, std::ios::app) << "x";
  EXPECT_NE(test::run_command(test::bin("ember-export") + " --dump " + (dir_ / "exp-model").string() + " --dataset " + data.string() +
                                  " --output " + (dir_ / "export2").string() + " 2>&1",
                              log),
            0);
  EXPECT_NE(log.find("changed since this model was trained"), std::string::npos) << log;
}

}  // namespace
}  // namespace ember::worker
