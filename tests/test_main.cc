// Every test binary's main: GoogleTest's, after OpenBLAS's kernels are matched to the CPU
// as in ember-worker (blas_kernels.h), so that a model trained inside a test and one
// trained by the job's processes sum in the same order.
#include <gtest/gtest.h>

#include "ember/common/blas_kernels.h"

int main(int argc, char** argv) {
  ember::use_the_cpus_blas_kernels(argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
