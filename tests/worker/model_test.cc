// Models: every kind builds, gives one logit per sample, learns a separable toy task;
// metrics agree with hand-computed values.
#include "ember/worker/model.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ember/common/error.h"

namespace ember::worker {
namespace {

TEST(Model, EveryKindFitsASeparableTask) {
  for (const char* kind : {"wide-deep", "deepfm", "dcn", "dlrm"}) {
    ModelConfig c;
    c.kind = kind;
    c.num_dense = 3;
    c.num_tables = 4;
    c.dim = 4;
    c.bottom = {8};
    c.top = {8};
    c.deep = {8};
    c.cross_layers = 2;
    torch::manual_seed(1);
    auto m = make_model(c);
    auto dense = torch::randn({64, 3});
    auto emb = torch::randn({64, 4, 4});
    auto y = (dense.select(1, 0) + emb.select(1, 0).select(1, 0) > 0).to(torch::kFloat32);
    torch::optim::Adam opt(m->parameters(), 0.02);
    double first = 0, last = 0;
    for (int i = 0; i < 150; ++i) {
      opt.zero_grad();
      auto logits = m->forward(dense, emb);
      ASSERT_EQ(logits.sizes(), torch::IntArrayRef({64})) << kind;
      auto loss = torch::binary_cross_entropy_with_logits(logits, y);
      loss.backward();
      opt.step();
      (i == 0 ? first : last) = loss.item<double>();
    }
    EXPECT_LT(last, first * 0.5) << kind;
  }
  // Avazu has no dense features: DLRM's interaction then has only the embeddings.
  ModelConfig avazu;
  avazu.num_dense = 0;
  avazu.num_tables = 5;
  avazu.dim = 4;
  auto m = make_model(avazu);
  EXPECT_EQ(m->forward(torch::zeros({2, 0}), torch::randn({2, 5, 4})).sizes(), torch::IntArrayRef({2}));
  ModelConfig bad;
  bad.kind = "mlp";
  EXPECT_THROW(make_model(bad), ConfigError);
  EXPECT_EQ(parse_layers("512-256-64", "--x"), (std::vector<std::int64_t>{512, 256, 64}));
  EXPECT_THROW(parse_layers("512--64", "--x"), ConfigError);
  EXPECT_THROW(parse_layers("a", "--x"), ConfigError);
}

}  // namespace
}  // namespace ember::worker
