// The run's opening and closing lines, from a report: what is printed when,
// and in which units; and a metrics line as JSON.
#include <doctest/doctest.h>

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support.h"
#include "train/metrics.h"
#include "train/run_report.h"
#include "ztrain/error.h"

using namespace ztrain;

namespace {
bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}
}  // namespace

TEST_CASE("the header names model, data, batch, precision and what the strategy offloads") {
  RunHeader h;
  h.model_plugin = "transformer";
  h.arch = "llama";
  h.n_params = 1234567;
  h.data_description = "synthetic (V=512, K=4)";
  h.strategy_plugin = "cpu_offload";
  h.device_name = "cpu (2 threads)";
  h.micro_batch = 4;
  h.grad_accum = 2;
  h.global_batch = 16;
  h.ranks = 2;
  h.comm_backend = "gloo";
  h.seq_len = 128;
  h.precision = DType::f16;
  h.grad_dtype = DType::f16;
  h.loss_scale = 0;
  h.initial_scale_power = 16;
  h.strategy_summary = "parameter shards in host memory";
  const std::string text = run_header(h);
  CHECK(contains(text, "model transformer (llama, 1.23M params)"));
  CHECK(contains(text,
                 "batch: 4 x 2 accum x 2 ranks = 16 sequences of 128 tokens per step | "
                 "collectives on gloo"));
  CHECK(contains(text, "fp32 master weights"));
  CHECK(contains(text, "loss scale dynamic from 2^16"));
  CHECK(contains(text, "\ncpu_offload: parameter shards in host memory"));
  CHECK(!contains(text, "weights from"));
  h.ranks = 1;
  CHECK(contains(run_header(h), "batch: 4 x 2 accum x 1 rank = 16 sequences"));
}

TEST_CASE("the summary: losses, communication only with ranks, peaks beside the estimate") {
  RunReport r;
  r.steps = 10;
  r.wall_s = 12.5;
  r.tokens_per_s = 2000;
  r.flops_per_token = 1e6;
  r.train_losses = {5.0, 4.0};
  r.val_losses = {{10, 3.5}};
  r.entropy_rate = 1.75;
  r.memory.tier_peak[Tier::device] = 3 << 20;
  r.memory.peak[Tier::device][Category::params] = 1 << 20;
  r.memory.peak[Tier::device][Category::activations] = 2 << 20;
  r.estimate.set(Tier::device, Category::params, 1 << 20);
  r.metrics_file = "runs/x/metrics.jsonl";
  std::string text = summary_text(r);
  CHECK(contains(text, "done: 10 steps in"));
  r.steps = 1;
  CHECK(contains(summary_text(r), "done: 1 step in"));
  r.steps = 10;
  CHECK(contains(text, "final train loss 4 | val loss 3.5 | source entropy 1.7500 (100.0% above)"));
  CHECK(!contains(text, "communication per rank"));
  CHECK(!contains(text, "skipped"));
  CHECK(contains(text, "  device: 3.00 MiB (params 1.00 MiB, activations 2.00 MiB)"));
  CHECK(contains(text,
                 "peak memory per tier (in brackets each category's own peak; they come at "
                 "different moments, so they can add up to more):"));
  r.device_budget = 400 << 20;  // an offload run's [device] memory_limit
  CHECK(contains(
      summary_text(r),
      "  device: 3.00 MiB of a 400.00 MiB budget (params 1.00 MiB, activations 2.00 MiB)"));
  r.device_budget.reset();
  CHECK(contains(text, "strategy estimate per rank:\n  device (params 1.00 MiB)"));
  CHECK(contains(text, "metrics: runs/x/metrics.jsonl"));
  CHECK(!contains(text, "weights:"));
  r.ranks = 2;
  r.bytes_per_rank = 10 << 20;
  r.comm_wait_s = 0.5;
  r.skipped_steps = 1;
  r.weights_file = "runs/x/model.safetensors";
  text = summary_text(r);
  CHECK(contains(text, "communication per rank: 1.00 MiB sent per step, 0.050 s per step"));
  CHECK(contains(text, "1 step skipped on gradient overflow"));
  CHECK(contains(text, " | weights: runs/x/model.safetensors"));
}

TEST_CASE("a metrics line: keys in order, strings escaped as JSON, non-finite numbers null") {
  const std::string line = JsonLine()
                               .add("step", std::int64_t{3})
                               .add("k\"ey", "a\nb\x01\\")
                               .add("loss", 1.5)
                               .add("nan", std::nan(""))
                               .add("bytes", std::string_view("\xff"))
                               .add("ok", true)
                               .str();
  CHECK(line ==
        "{\"step\": 3, \"k\\\"ey\": \"a\\nb\\u0001\\\\\", \"loss\": 1.5, \"nan\": null, "
        "\"bytes\": \"\xEF\xBF\xBD\", \"ok\": true}");
}

namespace {

// Each line of `file`.
std::vector<std::string> lines_of(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Writes past the current size of the process's files fail after `room`
// more bytes (EFBIG), as a disk that fills up part-way through a write;
// the old limit comes back on destruction.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(std::uintmax_t limit) {
    ::getrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit r = old_;
    r.rlim_cur = static_cast<rlim_t>(limit);
    ::setrlimit(RLIMIT_FSIZE, &r);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    ::signal(SIGXFSZ, SIG_DFL);
  }

 private:
  rlimit old_{};
};

}  // namespace

TEST_CASE("a metrics line that a full disk cuts short is not left in the file") {
  test::TempDir dir;
  const auto path = dir / "metrics.jsonl";
  MetricsFile m(path);
  m.write(JsonLine().add("step", std::int64_t{1}).add("split", "train"));
  const auto size = std::filesystem::file_size(path);
  {
    const FileSizeLimit limit(size + 20);  // room for part of the next line
    CHECK_THROWS_AS(m.write(JsonLine().add("step", std::int64_t{2}).add("split", "train")), Error);
  }
  CHECK(std::filesystem::file_size(path) == size);
  REQUIRE(lines_of(path).size() == 1);

  // A file cut short by other means (a kill between the bytes of one
  // line): a resumed run drops that line with the ones after its step.
  std::ofstream(path, std::ios::app) << "{\"step\": 2, \"split\": \"tr";
  std::size_t dropped = 0;
  MetricsFile resumed(path, 1, dropped);
  CHECK(dropped == 1);
  resumed.write(JsonLine().add("step", std::int64_t{2}).add("split", "train"));
  const auto lines = lines_of(path);
  REQUIRE(lines.size() == 2);
  CHECK(lines[1].find("{\"step\": 2, \"split\": \"train\"") == 0);
}

TEST_CASE("a resumed run's metrics hold every logged step exactly once, wherever it resumes") {
  // For every resume point of a 12-step run logging every `every` steps
  // (and evaluating every 4), the attempt went on past its checkpoint to
  // step `reached` before it stopped; the resumed run logs on from its
  // checkpoint. The file then holds each logged step once, in order.
  test::TempDir dir;
  const auto path = dir / "metrics.jsonl";
  const auto log_steps = [](MetricsFile& m, std::int64_t from, std::int64_t to, std::int64_t every) {
    for (std::int64_t s = from; s <= to; ++s) {
      if (s % every == 0 || s == 1)
        m.write(JsonLine().add("step", s).add("split", "train"));
      if (s % 4 == 0) m.write(JsonLine().add("step", s).add("split", "val"));
    }
  };
  for (const std::int64_t every : {1, 3})
    for (std::int64_t resume = 0; resume <= 12; ++resume)
      for (const std::int64_t reached : {resume, std::min<std::int64_t>(resume + 2, 12)}) {
        INFO("log every " << every << ", resumed at step " << resume << " after reaching "
                          << reached);
        {
          MetricsFile first(path);
          log_steps(first, 1, reached, every);
        }
        std::size_t dropped = 0;
        {
          MetricsFile resumed(path, resume, dropped);
          log_steps(resumed, resume + 1, 12, every);
        }
        std::vector<std::pair<std::int64_t, std::string>> seen, want;
        for (const auto& l : lines_of(path)) {
          const auto j = nlohmann::json::parse(l);
          seen.emplace_back(j["step"].get<std::int64_t>(), j["split"].get<std::string>());
        }
        for (std::int64_t s = 1; s <= 12; ++s) {
          if (s % every == 0 || s == 1) want.emplace_back(s, "train");
          if (s % 4 == 0) want.emplace_back(s, "val");
        }
        CHECK(seen == want);
      }
}
