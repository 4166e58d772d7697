// ember-bench cache. Each case: a cache of R slots of dim D, a batch of R ids drawn
// uniformly (repeats included, as a step's are), gathered into a dense [R, D] buffer and
// their gradients scatter-added back. The baseline is a copy of the same R*D floats in
// the same memory, timed in the same run. Bandwidth counts bytes read plus bytes written
// (2 x R*D*4 for all three; the slot ids and the scatter's read of the old gradient are
// not counted), so a ratio of 1 means the kernel moves rows as fast as a plain copy.
#include "bench_cache.h"

#include <chrono>
#include <cstring>
#include <random>

#include "bench_common.h"
#include "bench_options.h"
#include "ember/cache/embedding_cache.h"
#include "ember/common/error.h"
#ifdef EMBER_HAVE_CUDA
#include <cuda_runtime.h>

#include "ember/cache/cuda_embedding_cache.h"
#endif

namespace ember::bench {
namespace {

struct CaseTimes {
  double gather_s = 0, scatter_s = 0, copy_s = 0;  // medians, seconds per launch
};

std::vector<std::uint32_t> random_slots(std::uint32_t rows, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint32_t> slots(rows);
  for (auto& s : slots) s = static_cast<std::uint32_t>(rng() % rows);
  return slots;
}

template <class F>
double median_seconds(int repeats, F&& once) {
  once();  // warm-up: first-touch pages, kernel loading
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) t.push_back(once());
  return median(t);
}

CaseTimes host_case(std::uint32_t rows, std::uint32_t dim, const CacheBenchOptions& o) {
  cache::EmbeddingCache cache(rows, dim, 0);
  std::vector<float> row(dim, 0.5f);
  for (std::uint32_t s = 0; s < rows; ++s) cache.fill(s, s, row.data(), nullptr);
  const std::vector<std::uint32_t> slots = random_slots(rows, o.seed);
  const std::size_t floats = static_cast<std::size_t>(rows) * dim;
  std::vector<float> out(floats), grads(floats, 0.25f), src(floats, 1.0f);
  using clock = std::chrono::steady_clock;
  auto timed = [](auto&& f) {
    auto t0 = clock::now();
    f();
    return std::chrono::duration<double>(clock::now() - t0).count();
  };
  CaseTimes t;
  t.gather_s = median_seconds(o.repeats, [&] { return timed([&] { cache.gather(slots.data(), rows, out.data()); }); });
  t.scatter_s = median_seconds(o.repeats, [&] { return timed([&] { cache.scatter_add_grad(slots.data(), rows, grads.data()); }); });
  t.copy_s = median_seconds(o.repeats, [&] { return timed([&] { std::memcpy(out.data(), src.data(), floats * sizeof(float)); }); });
  return t;
}

#ifdef EMBER_HAVE_CUDA
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("ember-bench cache: CUDA ") + what + ": " + cudaGetErrorString(e));
}

// Device buffers freed on every path (a failed case throws).
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(std::size_t bytes) { cuda_check(cudaMalloc(&p, bytes), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

CaseTimes cuda_case(std::uint32_t rows, std::uint32_t dim, const CacheBenchOptions& o) {
  cache::CudaEmbeddingCache cache(rows, dim);
  const std::vector<std::uint32_t> slots = random_slots(rows, o.seed);
  const std::size_t bytes = static_cast<std::size_t>(rows) * dim * sizeof(float);
  DeviceBuffer d_slots(rows * sizeof(std::uint32_t)), d_out(bytes), d_src(bytes);
  cuda_check(cudaMemcpy(d_slots.p, slots.data(), rows * sizeof(std::uint32_t), cudaMemcpyHostToDevice), "copy slots");
  cuda_check(cudaMemset(d_src.p, 0, bytes), "cudaMemset");
  cudaEvent_t start, stop;
  cuda_check(cudaEventCreate(&start), "cudaEventCreate");
  cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
  auto timed = [&](auto&& f) {
    cuda_check(cudaEventRecord(start), "cudaEventRecord");
    f();
    cuda_check(cudaEventRecord(stop), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    cuda_check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    return ms * 1e-3;
  };
  CaseTimes t;
  t.gather_s =
      median_seconds(o.repeats, [&] { return timed([&] { cache.gather(d_slots.as<std::uint32_t>(), rows, d_out.as<float>()); }); });
  t.scatter_s = median_seconds(
      o.repeats, [&] { return timed([&] { cache.scatter_add_grad(d_slots.as<std::uint32_t>(), rows, d_src.as<float>()); }); });
  t.copy_s = median_seconds(
      o.repeats, [&] { return timed([&] { cuda_check(cudaMemcpyAsync(d_out.p, d_src.p, bytes, cudaMemcpyDeviceToDevice), "copy"); }); });
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return t;
}

std::string cuda_device_name() {
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  return prop.name;
}
#endif

}  // namespace

void add_cache_options(CLI::App& app, CacheBenchOptions& o) {
  using O = CacheBenchOptions;
  const std::vector<OptionDecl<O>> decls = {
      bench_flag("--device", &O::device, "cuda (CudaEmbeddingCache vs a device-to-device copy) or cpu (EmbeddingCache vs memcpy)")
          .checked(CLI::IsMember({"cuda", "cpu"})),
      comma_separated(list_flag("--dims", &O::dims, "embedding dimensions (16,64,128 or 16 64 128)")),
      comma_separated(list_flag("--rows", &O::rows, "cache slots, and ids per gathered batch")),
      bench_flag("--repeats", &O::repeats, "timed launches per case (medians reported)").checked(CLI::Range(1, 10000)),
      bench_flag("--seed", &O::seed, "the batch's ids"),
  };
  add_options(app, decls, o, kBenchProgram);
}

int run_cache_bench(const CacheBenchOptions& o, bool json) {
  std::string device_name = "host";
  if (o.device == "cuda") {
#ifdef EMBER_HAVE_CUDA
    std::string why = cache::CudaEmbeddingCache::unavailable_reason();
    if (!why.empty()) throw ConfigError("ember-bench cache --device cuda: " + why + " (--device cpu measures the host cache)");
    device_name = cuda_device_name();
#else
    throw ConfigError("ember-bench cache --device cuda: this build has no CUDA (nvcc was not found at configure time)");
#endif
  }
  for (std::uint32_t r : o.rows) {
    if (r == 0) throw ConfigError("ember-bench cache: --rows must be positive");
  }
  Output out{json};
  out.text("ember-bench cache on " + device_name + ": gather and scatter-add of R random ids vs a copy of the same R*D floats\n" +
           "GB/s count bytes read + written (2 x R*D*4); medians of " + std::to_string(o.repeats) + " launches\n");
  char line[256];
  std::snprintf(line, sizeof line, "%5s %8s %10s %10s %10s %8s %8s\n", "dim", "rows", "gather", "scatter", "copy", "g/copy", "s/copy");
  out.text(line);
  double worst = 1e30;
  for (std::uint32_t dim : o.dims) {
    if (dim == 0) throw ConfigError("ember-bench cache: --dims must be positive");
    for (std::uint32_t rows : o.rows) {
      CaseTimes t;
#ifdef EMBER_HAVE_CUDA
      t = o.device == "cuda" ? cuda_case(rows, dim, o) : host_case(rows, dim, o);
#else
      t = host_case(rows, dim, o);
#endif
      const double bytes = 2.0 * rows * dim * sizeof(float);
      auto gbs = [&](double s) { return s > 0 ? bytes / s / 1e9 : 0.0; };
      const double g = gbs(t.gather_s), s = gbs(t.scatter_s), c = gbs(t.copy_s);
      worst = std::min({worst, g / c, s / c});
      std::snprintf(line, sizeof line, "%5u %8u %10.1f %10.1f %10.1f %8.2f %8.2f\n", dim, rows, g, s, c, g / c, s / c);
      out.text(line);
      out.row({{"bench", "cache"},
               {"device", o.device},
               {"device_name", device_name},
               {"dim", dim},
               {"rows", rows},
               {"gather_gb_s", g},
               {"scatter_gb_s", s},
               {"copy_gb_s", c},
               {"gather_vs_copy", g / c},
               {"scatter_vs_copy", s / c},
               {"gather_us", t.gather_s * 1e6},
               {"scatter_us", t.scatter_s * 1e6},
               {"copy_us", t.copy_s * 1e6}});
    }
  }
  std::snprintf(line, sizeof line, "lowest ratio to the copy: %.2f (target >= 0.50)\n", worst);
  out.text(line);
  return 0;
}

}  // namespace ember::bench
