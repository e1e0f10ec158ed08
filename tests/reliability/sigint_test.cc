// Ctrl-C during `sample`: the CLI stops generating, prints what it generated
// so far and its report, and exits cleanly (status 0; 130 would also be an
// accepted convention for "interrupted", a crash or a hang is not).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace ptllm {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Outcome {
  int status = -1;  // exit code, or 128 + signal
  std::string out, err;
  bool timed_out = false;
};

// Starts the CLI with `args`, waits until `ready_file` (its stdout or stderr)
// holds `ready` (the model is loaded and generating), waits another second,
// sends SIGINT, then waits up to 60 s for it to exit.
Outcome interrupt(const std::vector<std::string>& args, bool wait_on_stderr, const std::string& ready) {
  const std::string base = ::testing::TempDir() + "/ptllm_sigint_" + std::to_string(::getpid());
  const std::string out_path = base + ".out", err_path = base + ".err";
  const pid_t pid = fork();
  if (pid == 0) {
    const int o = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    std::vector<char*> argv;
    std::string cli = PTLLM_CLI;
    argv.push_back(cli.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(cli.c_str(), argv.data());
    _exit(127);
  }
  Outcome r;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  // Loading takes milliseconds in Release but longer under sanitizers.
  while (slurp(wait_on_stderr ? err_path : out_path).find(ready) == std::string::npos &&
         clock::now() - t0 < std::chrono::seconds(60)) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {  // exited before the signal: report as is
      r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      r.out = slurp(out_path);
      r.err = slurp(err_path);
      return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  kill(pid, SIGINT);
  int st = 0;
  const auto t1 = clock::now();
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (clock::now() - t1 > std::chrono::seconds(60)) {
      r.timed_out = true;
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  std::remove(out_path.c_str());
  std::remove(err_path.c_str());
  return r;
}

const std::string kStories = test::repo_dir() + "/models/stories260K";

// Far more tokens than one second produces: only the signal can stop it.
const std::vector<std::string> kLong = {"sample", kStories, "--prompt", "Once upon a time", "--tokens", "100000000",
                                        "--ignore-eos", "--seed", "5", "--streaming-llm-sink", "4",
                                        "--streaming-llm-window", "252"};

TEST(Sigint, SamplePrintsTextAndReportAndExitsCleanly) {
  const Outcome r = interrupt(kLong, /*wait_on_stderr=*/false, " ");  // some streamed text
  ASSERT_FALSE(r.timed_out) << "sample did not exit within 60 s of SIGINT\n" << r.err;
  EXPECT_TRUE(r.status == 0 || r.status == 130) << "status " << r.status << "\n" << r.err;
  EXPECT_NE(r.err.find("stop: interrupted"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("kv cache"), std::string::npos) << r.err;  // the cache report line
  // "generated N tokens" with 0 < N < requested, and text on stdout.
  const size_t g = r.err.find("generated ");
  ASSERT_NE(g, std::string::npos) << r.err;
  const long n = std::stol(r.err.substr(g + 10));
  EXPECT_GT(n, 0);
  EXPECT_LT(n, 100000000);
  EXPECT_GT(r.out.size(), 20u) << r.out;
}

TEST(Sigint, SampleJsonReportsInterruptedWithIds) {
  std::vector<std::string> args = kLong;
  args.push_back("--json");
  // --json streams nothing; the cache banner on stderr means loading is done.
  const Outcome r = interrupt(args, /*wait_on_stderr=*/true, "\n");
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_TRUE(r.status == 0 || r.status == 130) << "status " << r.status << "\n" << r.err;
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out.substr(0, 400);
  EXPECT_EQ(j["stats"]["stop_reason"], "interrupted");
  EXPECT_GT(j["generated_ids"].size(), 0u);
  EXPECT_EQ(j["stats"]["generated_tokens"], j["generated_ids"].size());
}

}  // namespace
}  // namespace ptllm
