// A pipeline's links between stages (job/stage_links.h), run by CTest
// under mpirun and gloo at 2 and 4 ranks, each rank a stage: the messages
// of a link arrive in the order sent, with the sender's bytes; both
// directions at once never wait on each other, also with messages large
// enough for a transport's rendezvous (every stage issues all its sends
// before any receive, the order that hangs where one channel carries
// both); interleaving's wrap from the last stage to the first; the tied
// groups sum over their stages alone. Only CHECK (never REQUIRE): a rank
// leaving early would desynchronise the next test.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "job/stage_links.h"
#include "world.h"
#include "ztrain/error.h"

using namespace ztrain;
using test::world;

namespace {

// Message k from stage s: every element s * 1000 + k.
std::vector<float> message(std::size_t n, int s, int k) {
  return std::vector<float>(n, static_cast<float>(s * 1000 + k));
}

// Every stage sends `count` activations forward and `count` gradients
// back, all issued before its receives, and checks what arrives.
void exchange(StageLinks& links, Communicator& group, std::size_t n, int count, bool wraps) {
  const int s = group.rank(), P = group.size();
  const bool sends_forward = wraps || s + 1 < P, sends_back = wraps || s > 0;
  std::vector<std::vector<float>> out;
  std::vector<CommWork> works;
  for (int k = 0; k < count; ++k) {
    if (sends_forward) {
      out.push_back(message(n, s, k));
      works.push_back(links.send_activation(out.back().data(), n));
    }
    if (sends_back) {
      out.push_back(message(n, s, 100 + k));
      works.push_back(links.send_gradient(out.back().data(), n));
    }
  }
  std::vector<float> got(n);
  for (int k = 0; k < count; ++k) {
    if (sends_back) {  // this stage has a previous one
      links.recv_activation(got.data(), n);
      CHECK(got == message(n, (s + P - 1) % P, k));
    }
    if (sends_forward) {
      links.recv_gradient(got.data(), n);
      CHECK(got == message(n, (s + 1) % P, 100 + k));
    }
  }
  wait_all(works);
}

}  // namespace

TEST_CASE("links carry each direction in order, never waiting on the other") {
  Communicator& w = world();
  for (const std::size_t n : {std::size_t{3}, std::size_t{1} << 20}) {
    StageLinks links(w, false, {});
    const CommCounters before = w.counters();
    exchange(links, w, n, 3, false);
    const CommCounters moved = w.counters().since(before);
    // Each of the stage's sends once, by itself: 3 forward unless last, 3
    // back unless first.
    const int s = w.rank(), P = w.size();
    const std::uint64_t messages = 3 * ((s + 1 < P ? 1 : 0) + (s > 0 ? 1 : 0));
    CHECK(moved.bytes_sent[static_cast<std::size_t>(Collective::broadcast)] ==
          messages * n * sizeof(float));
  }
}

TEST_CASE("interleaving's links wrap from the last stage to the first") {
  Communicator& w = world();
  StageLinks links(w, true, {});
  exchange(links, w, 1000, 2, true);
}

TEST_CASE("a tied group sums over its stages alone") {
  Communicator& w = world();
  const int P = w.size();
  const auto last = static_cast<std::size_t>(P - 1);
  StageLinks links(w, false, {{0, last}, {0, 1}});
  const int s = w.rank();
  for (std::size_t set = 0; set < 2; ++set) {
    const bool member = s == 0 || static_cast<std::size_t>(s) == (set == 0 ? last : 1);
    CHECK((links.tied(set) != nullptr) == member);
    if (!member) continue;
    float x = static_cast<float>(s + 1);
    links.tied(set)->all_reduce(&x, 1, DType::f32, ReduceOp::sum);
    CHECK(x == static_cast<float>(1 + (set == 0 ? P : 2)));
  }
}

TEST_CASE("stages that disagree stop together, naming the first two that differ") {
  Communicator& w = world();
  CHECK_NOTHROW(check_stages_agree(w, 42, "the plan"));
  const int odd = w.size() - 1;  // the last stage's plan differs
  std::string why;
  try {
    check_stages_agree(w, w.rank() == odd ? 7 : 42, "the plan");
  } catch (const ConfigError& e) {
    why = e.what();
  }
  CHECK(why.find("pipeline stages " + std::to_string(odd - 1) + " and " + std::to_string(odd) +
                 " disagree on the plan") == 0);
}
