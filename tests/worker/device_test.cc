// LibTorch is linked and trains: a linear model's gradient step on the selected device.
#include "ember/worker/device.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include "ember/common/blas_kernels.h"

namespace ember::worker {
namespace {

TEST(Device, SelectsCpuWithoutCudaAndTrainsALinearModel) {
  DeviceInfo info = select_device(true);
  if (!info.cuda_available) {
    EXPECT_EQ(info.device, "cpu");
  }
  EXPECT_FALSE(info.torch_version.empty());
  EXPECT_NE(describe(info).find(info.device), std::string::npos);
  torch::manual_seed(0);
  torch::Device dev(info.device);
  torch::nn::Linear lin(4, 1);
  lin->to(dev);
  torch::optim::SGD opt(lin->parameters(), 0.1);
  auto x = torch::randn({64, 4}, dev);
  auto y = x.matmul(torch::tensor({1.0f, -2.0f, 0.5f, 3.0f}, dev).unsqueeze(1));
  float first = 0, last = 0;
  for (int i = 0; i < 50; ++i) {
    opt.zero_grad();
    auto loss = torch::mse_loss(lin->forward(x), y);
    loss.backward();
    opt.step();
    (i == 0 ? first : last) = loss.item<float>();
  }
  EXPECT_LT(last, first * 0.1f);
}

// This binary's main matched OpenBLAS's kernels to the CPU as ember-worker's does
// (tests/test_main.cc): no fallback to kernels older than the CPU is left.
TEST(Device, OpenBlasRunsTheKernelsOfThisCpu) {
  const BlasInfo blas = blas_info();
  if (blas.library != "OpenBLAS") GTEST_SKIP() << describe(blas);
  EXPECT_EQ(better_openblas_kernels(blas), "") << describe(blas);
  EXPECT_NE(describe(blas).find(blas.kernels + " kernels"), std::string::npos) << describe(blas);
}

// ... and keeps its name (comm, what pgrep and the cluster tests look for): "exe" if
// the exec were given /proc/self/exe.
TEST(Device, TheExecKeepsTheProgramsName) {
  std::ifstream comm("/proc/self/comm");
  std::string name;
  std::getline(comm, name);
  EXPECT_EQ(name, "worker_test");
}

TEST(Device, TheReferenceBlasIsNamedWithItsFix) {
  const std::string line = describe(BlasInfo{"reference", "", ""});
  EXPECT_NE(line.find("libopenblas0-openmp"), std::string::npos) << line;
  EXPECT_EQ(better_openblas_kernels(BlasInfo{"OpenBLAS", "SkylakeX", ""}), "");
  EXPECT_EQ(better_openblas_kernels(BlasInfo{"MKL", "", ""}), "");
}

}  // namespace
}  // namespace ember::worker
