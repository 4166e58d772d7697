#include "ember/common/blas_kernels.h"

#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace ember {

namespace {

template <typename F>
F symbol(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

// OpenBLAS's kernels from before AVX: what it falls back to on a CPU it does not know.
bool pre_avx(std::string_view core) {
  constexpr std::array<std::string_view, 8> old = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Opteron", "Barcelona"};
  for (auto o : old)
    if (core == o) return true;
  return false;
}

}  // namespace

BlasInfo blas_info() {
  BlasInfo b;
  if (auto corename = symbol<char* (*)()>("openblas_get_corename")) {
    b.library = "OpenBLAS";
    b.kernels = corename();
    if (auto config = symbol<char* (*)()>("openblas_get_config")) b.config = config();
  } else if (symbol<void*>("mkl_get_version") || symbol<void*>("MKL_Get_Version")) {
    b.library = "MKL";
  } else if (symbol<void*>("bli_info_get_version_str")) {
    b.library = "BLIS";
  } else if (symbol<void*>("sgemm_")) {
    b.library = "reference";
  }
  return b;
}

std::string better_openblas_kernels(const BlasInfo& blas) {
  if (blas.library != "OpenBLAS" || !pre_avx(blas.kernels)) return "";
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return "";
}

std::string describe(const BlasInfo& blas) {
  if (blas.library.empty()) return "dense BLAS: not found among the loaded libraries (linked into LibTorch?)";
  if (blas.library == "reference")
    return "dense BLAS: Debian's reference BLAS (libblas3), 2-6x slower on the dense model than OpenBLAS: "
           "install libopenblas0-openmp (scripts/install_deps.sh does)";
  if (blas.library != "OpenBLAS") return "dense BLAS: " + blas.library;
  std::string line = "dense BLAS: " + (blas.config.empty() ? blas.library : blas.config) + ", " + blas.kernels + " kernels";
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE")) line += std::string(" (OPENBLAS_CORETYPE=") + forced + ")";
  if (const std::string better = better_openblas_kernels(blas); !better.empty())
    line += "; this CPU runs " + better + "'s (1.2-3.1x faster on the quickstart's models): OPENBLAS_CORETYPE=" + better;
  // The pthread build starts its threads when it loads, before main blocks SIGTERM and
  // SIGINT: a signal may land on one of them and end the process instead of stopping it
  // at a checkpoint.
  if (!blas.config.empty() && blas.config.find("USE_OPENMP") == std::string::npos)
    line +=
        "; this is OpenBLAS's pthread build, whose threads can take SIGTERM before the worker does: "
        "install libopenblas0-openmp (its OpenMP build)";
  return line;
}

void use_the_cpus_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;  // the user's choice, or the exec below done
  const std::string better = better_openblas_kernels(blas_info());
  if (better.empty()) return;
  // The binary's own path, not /proc/self/exe: the process's name (comm, what pgrep and
  // top show) is taken from the path exec is given.
  std::array<char, 4096> self{};
  const ssize_t n = readlink("/proc/self/exe", self.data(), self.size() - 1);
  if (n <= 0 || setenv("OPENBLAS_CORETYPE", better.c_str(), 1) != 0) return;
  execv(self.data(), argv);
  // Still here: the exec failed (no /proc?); the slower kernels work, describe() says so.
  std::fprintf(stderr, "warning: could not restart with OPENBLAS_CORETYPE=%s; OpenBLAS runs its slower kernels\n", better.c_str());
  unsetenv("OPENBLAS_CORETYPE");
}

}  // namespace ember
