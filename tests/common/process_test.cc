#include "ember/common/process.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <thread>

#include "ember/common/error.h"

namespace ember {
namespace {

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

TEST(CpuList, ParsesNumbersAndRangesInOrderOnce) {
  EXPECT_EQ(parse_cpu_list("1", "--x"), (std::vector<int>{1}));
  EXPECT_EQ(parse_cpu_list("0-3", "--x"), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(parse_cpu_list("6,0,2-3,3", "--x"), (std::vector<int>{0, 2, 3, 6}));
}

TEST(CpuList, RefusesMalformedListsNamingTheFlag) {
  for (const char* bad : {"", ",", "1,", "a", "-1", "3-1", "1-", "0-2x", "99999999", "1 2"}) {
    try {
      parse_cpu_list(bad, "--server-cpus");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--server-cpus '" + std::string(bad) + "'"), std::string::npos) << e.what();
    }
  }
}

// On a thread of its own: the test's main thread keeps its mask.
TEST(PinThisThread, KeepsTheThreadAndThoseItStartsOnTheCpus) {
  const std::vector<int> cpus = allowed_cpus();
  ASSERT_FALSE(cpus.empty());
  std::thread([&] {
    const unsigned before = usable_cpus();
    EXPECT_EQ(before, cpus.size());
    pin_this_thread({cpus.back()});
    EXPECT_EQ(usable_cpus(), 1u);
    EXPECT_EQ(sched_getcpu(), cpus.back());
    std::thread([] { EXPECT_EQ(usable_cpus(), 1u); }).join();  // inherited
  }).join();
  EXPECT_EQ(usable_cpus(), cpus.size());
}

TEST(PinThisThread, RefusesCpusTheProcessCannotUse) {
  std::thread([] {
    const unsigned before = usable_cpus();
    try {
      pin_this_thread({CPU_SETSIZE - 1});  // no host this runs on has 1024 CPUs online
      ADD_FAILURE() << "pinned to CPU " << CPU_SETSIZE - 1;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("cannot run on CPU(s) " + std::to_string(CPU_SETSIZE - 1)), std::string::npos) << e.what();
    }
    EXPECT_EQ(usable_cpus(), before);  // unchanged
    EXPECT_THROW(pin_this_thread({CPU_SETSIZE}), ConfigError);
  }).join();
}

}  // namespace
}  // namespace ember
