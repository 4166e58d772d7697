// The BLAS under LibTorch's dense layers (libblas.so.3, chosen by Debian's alternatives):
// what is loaded, and OpenBLAS's kernels matched to the CPU.
//
// OpenBLAS picks its kernels from the CPU's model number when it loads. On a CPU newer
// than the library (Debian 12's 0.3.21 on Sapphire or Emerald Rapids, for one) it falls
// back to its SSE3 kernels ("Prescott"): the quickstart's jobs trained 1.2x (DLRM) and
// 3.1x (DCNv2) faster on its AVX-512 ones (scripts/bench_blas.py); Debian's reference
// BLAS (libblas3, no OpenBLAS installed) is slower still.
#pragma once

#include <string>

namespace ember {

struct BlasInfo {
  std::string library;  // "OpenBLAS", "MKL", "BLIS", "reference" or "" (none found)
  std::string kernels;  // OpenBLAS's core ("SkylakeX", "Prescott"); else ""
  std::string config;   // OpenBLAS's own line (version, build, core); else ""
};

BlasInfo blas_info();

// One line for the log: the BLAS, its kernels, and what to do when it is slow.
std::string describe(const BlasInfo& blas);

// The kernels for this CPU when OpenBLAS runs older ones it falls back to ("Haswell" for
// AVX2 and FMA, "SkylakeX" for AVX-512), or "" when it needs none.
std::string better_openblas_kernels(const BlasInfo& blas);

// Call first in main. When OpenBLAS fell back to kernels older than the CPU and the user
// did not name them (OPENBLAS_CORETYPE unset), runs this program again (exec: same pid,
// arguments and environment) with OPENBLAS_CORETYPE set to better_openblas_kernels(): it
// is read only when the library loads. Every process of a job then runs the same kernels,
// which the equivalence of policies needs (they sum in different orders). Returns when
// nothing is to be done or the exec failed.
void use_the_cpus_blas_kernels(char** argv);

}  // namespace ember
