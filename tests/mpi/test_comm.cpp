// The mpi communicator, run by CTest under mpirun -np 2 and -np 4, and the
// gloo communicator, 2 and 4 ranks started with RANK/WORLD_SIZE: every
// collective in every dtype, sync and async, odd sizes, sub-communicators;
// the exchanges (all-to-all, permute) with every sender, receiver and
// element its own bits.
// Only CHECK (never REQUIRE): a rank leaving a test early would desynchronise
// the collectives of the next one.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/shm_communicator.h"
#include "comm/world.h"
#include "job/mesh_groups.h"
#include "train/step_agreement.h"
#include "world.h"
#include "ztrain/comm.h"
#include "ztrain/device.h"
#include "ztrain/shard/grad_reducer.h"
#include "ztrain/shard/init.h"
#include "ztrain/shard/param_gatherer.h"
#include "ztrain/shard/swapped_shard.h"

using namespace ztrain;
using namespace ztrain::id_literals;
using test::gloo;
using test::world;

namespace {

// Values exactly representable in every dtype, so sums are exact.
float value(int rank, std::size_t i) {
  return static_cast<float>((rank + 1) * (static_cast<int>(i % 7) + 1));
}

// The 16-bit encoding of v (empty for f32, whose data stays in v).
std::vector<std::uint16_t> encode(const std::vector<float>& v, DType t) {
  if (t == DType::f32) return {};
  std::vector<std::uint16_t> out(v.size());
  convert(v.data(), DType::f32, out.data(), t, v.size());
  return out;
}
std::vector<float> decode(const void* p, DType t, std::size_t n) {
  std::vector<float> out(n);
  convert(p, t, out.data(), DType::f32, n);
  return out;
}

std::size_t kind(Collective c) {
  return static_cast<std::size_t>(c);
}

// The sum of every rank's v (an all-gather of the bits: 64-bit integers
// are no reduction type).
std::uint64_t sum_over_ranks(std::uint64_t v) {
  std::vector<std::uint64_t> all(static_cast<std::size_t>(world().size()));
  world().all_gather(&v, all.data(), 4, DType::bf16);
  std::uint64_t s = 0;
  for (auto x : all) s += x;
  return s;
}

// A 1-D parameter of n elements used by the given modules, N(0, 1) initial values.
ParamSpec param(const char* name, std::int64_t n, std::vector<ModuleId> used_by) {
  ParamSpec p;
  p.name = name;
  p.shape = Shape{n};
  p.init = {Init::Kind::normal, 1.0f};
  p.used_by = std::move(used_by);
  return p;
}

}  // namespace

TEST_CASE("the world comes from the launcher") {
  CHECK((gloo() ? launched_by_env() : launched_by_mpi()));
  CHECK(world().size() >= 2);
  CHECK(world().backend() == (gloo() ? "gloo" : "mpi"));
}

TEST_CASE("all_reduce sums and averages in f32, bf16 and f16, sync and async, odd sizes") {
  const int R = world().size(), r = world().rank();
  double rank_sum = 0;
  for (int k = 0; k < R; ++k) rank_sum += k + 1;
  for (std::size_t n : {std::size_t{1}, std::size_t{13}, std::size_t{1001}}) {
    for (DType t : {DType::f32, DType::bf16, DType::f16}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::average}) {
        for (bool async : {false, true}) {
          std::vector<float> v(n);
          for (std::size_t i = 0; i < n; ++i) v[i] = value(r, i);
          std::vector<std::uint16_t> h = encode(v, t);
          void* data = t == DType::f32 ? static_cast<void*>(v.data()) : h.data();
          if (async) {
            CommWork w = world().all_reduce_async(data, n, t, op);
            w.wait();
            CHECK(w.test());
          } else {
            world().all_reduce(data, n, t, op);
          }
          const auto got = decode(data, t, n);
          for (std::size_t i = 0; i < n; ++i) {
            const double want =
                rank_sum * static_cast<double>(i % 7 + 1) / (op == ReduceOp::average ? R : 1);
            INFO("n " << n << " dtype " << dtype_name(t) << " i " << i);
            CHECK(got[i] == doctest::Approx(want).epsilon(t == DType::f32 ? 1e-6 : 1e-2));
          }
        }
      }
    }
  }
}

// Which rank holds an element's maximum varies with the element (a rank
// copying its own or its neighbour's values fails), negative values too.
float peaky(int rank, std::size_t i) {
  return static_cast<float>((rank * 7 + static_cast<int>(i) * 3) % 11) - 5.0f;
}

TEST_CASE("all_reduce and reduce_scatter take the maximum in f32, bf16 and f16") {
  const int R = world().size(), r = world().rank();
  const auto most = [&](std::size_t i) {
    float m = peaky(0, i);
    for (int k = 1; k < R; ++k) m = std::max(m, peaky(k, i));
    return m;
  };
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    const std::size_t n = 1001;
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = peaky(r, i);
    std::vector<std::uint16_t> h = encode(v, t);
    void* data = t == DType::f32 ? static_cast<void*>(v.data()) : h.data();
    world().all_reduce(data, n, t, ReduceOp::max);
    const auto got = decode(data, t, n);
    for (std::size_t i = 0; i < n; ++i) {
      INFO("all_reduce, dtype " << dtype_name(t) << " i " << i);
      CHECK(got[i] == most(i));
    }
    const std::size_t block = 9;
    std::vector<float> send(block * static_cast<std::size_t>(R));
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = peaky(r, i);
    const auto s16 = encode(send, t);
    std::vector<float> recv(block);
    std::vector<std::uint16_t> r16(block);
    const void* sp = t == DType::f32 ? static_cast<const void*>(send.data()) : s16.data();
    void* rp = t == DType::f32 ? static_cast<void*>(recv.data()) : r16.data();
    world().reduce_scatter(sp, rp, block, t, ReduceOp::max);
    const auto mine = decode(rp, t, block);
    for (std::size_t i = 0; i < block; ++i) {
      INFO("reduce_scatter, dtype " << dtype_name(t) << " i " << i);
      CHECK(mine[i] == most(static_cast<std::size_t>(r) * block + i));
    }
  }
}

TEST_CASE("reduce_scatter gives each rank its block's reduction") {
  const int R = world().size(), r = world().rank();
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    const std::size_t block = 5;
    std::vector<float> send(block * static_cast<std::size_t>(R));
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = value(r, i);
    const auto s16 = encode(send, t);
    std::vector<float> recv(block);
    std::vector<std::uint16_t> r16(block);
    const void* sp = t == DType::f32 ? static_cast<const void*>(send.data()) : s16.data();
    void* rp = t == DType::f32 ? static_cast<void*>(recv.data()) : r16.data();
    world().reduce_scatter_async(sp, rp, block, t, ReduceOp::sum).wait();
    const auto got = decode(rp, t, block);
    for (std::size_t i = 0; i < block; ++i) {
      double want = 0;
      for (int k = 0; k < R; ++k) want += value(k, static_cast<std::size_t>(r) * block + i);
      CHECK(got[i] == doctest::Approx(want).epsilon(t == DType::f32 ? 1e-6 : 1e-2));
    }
  }
}

TEST_CASE("irregular reduce_scatter_v and all_gather_v: empty, uneven and in-place blocks") {
  const int R = world().size(), r = world().rank();
  // Rank k's block holds (k * 3) % 5 elements: rank 0's is empty.
  std::vector<std::size_t> counts;
  std::size_t total = 0, mine_at = 0;
  for (int k = 0; k < R; ++k) {
    counts.push_back(static_cast<std::size_t>(k * 3 % 5));
    if (k == r) mine_at = total;
    total += counts.back();
  }
  const std::size_t own = counts[static_cast<std::size_t>(r)];
  for (DType t : {DType::f32, DType::bf16}) {
    std::vector<float> send(total);
    for (std::size_t i = 0; i < total; ++i) send[i] = value(r, i);
    const auto s16 = encode(send, t);
    std::vector<float> recv(own + 1);
    std::vector<std::uint16_t> r16(own + 1);
    const void* sp = t == DType::f32 ? static_cast<const void*>(send.data()) : s16.data();
    void* rp = t == DType::f32 ? static_cast<void*>(recv.data()) : r16.data();
    world().reduce_scatter_v_async(sp, rp, counts, t, ReduceOp::average).wait();
    const auto got = decode(rp, t, own);
    for (std::size_t i = 0; i < own; ++i) {
      double want = 0;
      for (int k = 0; k < R; ++k) want += value(k, mine_at + i);
      CHECK(got[i] == doctest::Approx(want / R).epsilon(t == DType::f32 ? 1e-6 : 1e-2));
    }
  }
  std::vector<float> mine(own, static_cast<float>(r) + 0.25f), all(total, -1.0f);
  world().all_gather_v_async(mine.data(), all.data(), counts, DType::f32).wait();
  std::vector<float> in_place(total, -1.0f);
  std::fill_n(in_place.begin() + static_cast<std::ptrdiff_t>(mine_at), own,
              static_cast<float>(r) + 0.25f);
  world().all_gather_v_async(in_place.data() + mine_at, in_place.data(), counts, DType::f32).wait();
  std::size_t at = 0;
  for (int k = 0; k < R; ++k)
    for (std::size_t i = 0; i < counts[static_cast<std::size_t>(k)]; ++i, ++at) {
      CHECK(all[at] == static_cast<float>(k) + 0.25f);
      CHECK(in_place[at] == static_cast<float>(k) + 0.25f);
    }
}

// Through shared memory a collective runs in chunks of a 1 MiB slot per
// rank (shm_communicator.cpp), so these cross several chunk boundaries at
// odd places: every element must come out exact, on every rank alike.
TEST_CASE("large and uneven buffers: every collective exact across many chunks") {
  const int R = world().size(), r = world().rank();
  CHECK(shares_memory(world()) == test::shm());
  double rank_sum = 0;
  for (int k = 0; k < R; ++k) rank_sum += k + 1;
  for (DType t : {DType::f32, DType::bf16}) {
    const std::size_t n = 1'000'003;
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = value(r, i);
    std::vector<std::uint16_t> h = encode(v, t);
    void* data = t == DType::f32 ? static_cast<void*>(v.data()) : h.data();
    world().all_reduce(data, n, t, ReduceOp::sum);
    const auto got = decode(data, t, n);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i)
      wrong += got[i] != static_cast<float>(rank_sum * static_cast<double>(i % 7 + 1));
    INFO("all_reduce, dtype " << dtype_name(t));
    CHECK(wrong == 0);
  }
  // Rank k's block: 300001 + 70000 k elements (uneven, larger than a piece).
  std::vector<std::size_t> counts;
  std::size_t total = 0, mine_at = 0;
  for (int k = 0; k < R; ++k) {
    if (k == r) mine_at = total;
    counts.push_back(300'001 + 70'000 * static_cast<std::size_t>(k));
    total += counts.back();
  }
  const std::size_t own = counts[static_cast<std::size_t>(r)];
  std::vector<float> send(total), recv(own, -1.0f);
  for (std::size_t i = 0; i < total; ++i) send[i] = value(r, i);
  world()
      .reduce_scatter_v_async(send.data(), recv.data(), counts, DType::f32, ReduceOp::sum)
      .wait();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < own; ++i)
    wrong += recv[i] != static_cast<float>(rank_sum * static_cast<double>((mine_at + i) % 7 + 1));
  CHECK(wrong == 0);
  std::vector<float> all(total, -1.0f);
  for (std::size_t i = 0; i < own; ++i) recv[i] = static_cast<float>(r * 1000003 + i % 4099);
  world().all_gather_v_async(recv.data(), all.data(), counts, DType::f32).wait();
  wrong = 0;
  for (int k = 0, at = 0; k < R; ++k)
    for (std::size_t i = 0; i < counts[static_cast<std::size_t>(k)]; ++i, ++at)
      wrong += all[static_cast<std::size_t>(at)] != static_cast<float>(k * 1000003 + i % 4099);
  CHECK(wrong == 0);
  std::vector<float> big(700'001, r == R - 1 ? 7.5f : 0.0f);
  world().broadcast(big.data(), big.size(), DType::f32, R - 1);
  CHECK(std::count(big.begin(), big.end(), 7.5f) == static_cast<std::ptrdiff_t>(big.size()));
}

TEST_CASE("all_gather puts rank r's block at r, broadcast copies the root's data") {
  const int R = world().size(), r = world().rank();
  const std::size_t n = 3;
  std::vector<float> mine(n, static_cast<float>(r) + 0.5f),
      all(n * static_cast<std::size_t>(R), -1.0f);
  world().all_gather(mine.data(), all.data(), n, DType::f32);
  for (int k = 0; k < R; ++k)
    for (std::size_t i = 0; i < n; ++i)
      CHECK(all[static_cast<std::size_t>(k) * n + i] == static_cast<float>(k) + 0.5f);
  for (int root = 0; root < R; ++root) {
    std::vector<std::uint16_t> data(7, static_cast<std::uint16_t>(r == root ? 1000 + root : 0));
    world().broadcast(data.data(), data.size(), DType::bf16, root);
    for (auto x : data) CHECK(x == 1000 + root);
  }
  world().barrier();
}

namespace {

// The bits rank `from` sends rank `to` at element i of an exchange: every
// (from, to, i) its own value, for 16-bit and 32-bit elements alike, and
// never 0xffff (what a receive buffer starts as).
std::uint32_t bits(int from, int to, std::size_t i, DType t) {
  const auto R = static_cast<std::uint32_t>(world().size());
  const std::uint32_t pair = static_cast<std::uint32_t>(from) * R + static_cast<std::uint32_t>(to);
  if (t == DType::f32) return pair << 24 | static_cast<std::uint32_t>(i & 0xffffff);
  const std::uint32_t span = 65536 / (R * R + 1);
  return pair * span + static_cast<std::uint32_t>(i % span);
}

// An exchange's buffer of n elements of type t.
struct Bits {
  DType t;
  std::vector<std::uint32_t> wide;
  std::vector<std::uint16_t> narrow;
  Bits(DType type, std::size_t n) : t(type) {
    if (t == DType::f32)
      wide.resize(n);
    else
      narrow.resize(n);
  }
  void* data() { return t == DType::f32 ? static_cast<void*>(wide.data()) : narrow.data(); }
  std::uint32_t at(std::size_t i) const { return t == DType::f32 ? wide[i] : narrow[i]; }
  void set(std::size_t i, std::uint32_t v) {
    if (t == DType::f32)
      wide[i] = v;
    else
      narrow[i] = static_cast<std::uint16_t>(v);
  }
};

// An all-to-all over `comm`, whose rank k is world rank world_rank_of[k].
void check_all_to_all(Communicator& comm, const std::vector<int>& world_rank_of) {
  const int R = comm.size(), r = comm.rank();
  const auto ranks = static_cast<std::size_t>(R);
  const int me = world_rank_of[static_cast<std::size_t>(r)];
  // 300001 elements: several chunks of the shared-memory path at any size.
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{300'001}})
    for (DType t : {DType::f32, DType::bf16, DType::f16})
      for (bool async : {false, true}) {
        Bits send(t, n * ranks), recv(t, n * ranks);
        for (std::size_t q = 0; q < ranks; ++q)
          for (std::size_t i = 0; i < n; ++i) {
            send.set(q * n + i, bits(me, world_rank_of[q], i, t));
            recv.set(q * n + i, 0xffff);
          }
        if (async) {
          CommWork w = comm.all_to_all_async(send.data(), recv.data(), n, t);
          w.wait();
          CHECK(w.test());
        } else {
          comm.all_to_all(send.data(), recv.data(), n, t);
        }
        std::size_t wrong = 0;
        for (std::size_t q = 0; q < ranks; ++q)
          for (std::size_t i = 0; i < n; ++i)
            wrong += recv.at(q * n + i) != bits(world_rank_of[q], me, i, t);
        INFO("group of " << R << ", n " << n << ", dtype " << dtype_name(t) << ", async " << async);
        CHECK(wrong == 0);
      }
}

// Every rank passes n elements by `peers_of` (a permutation); each checks
// it holds what its `from` sent.
void check_permute(const std::function<Peers(int)>& peers_of, std::size_t n, DType t) {
  const int r = world().rank();
  const Peers p = peers_of(r);
  Bits send(t, n), recv(t, n);
  for (std::size_t i = 0; i < n; ++i) {
    send.set(i, bits(r, p.to, i, t));
    recv.set(i, 0xffff);
  }
  world().permute(send.data(), recv.data(), n, t, p);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += recv.at(i) != bits(p.from, r, i, t);
  INFO("rank " << r << " to " << p.to << " from " << p.from << ", n " << n << ", dtype "
               << dtype_name(t));
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("all_to_all: rank r's block q arrives as rank q's block r, in the world and a group") {
  std::vector<int> everyone;
  for (int k = 0; k < world().size(); ++k) everyone.push_back(k);
  check_all_to_all(world(), everyone);
  const int r = world().rank();
  auto sub = world().split(r % 2, r);
  std::vector<int> members;
  for (int k = r % 2; k < world().size(); k += 2) members.push_back(k);
  check_all_to_all(*sub, members);
}

TEST_CASE("permute: a ring's pass either way, pairs swapping, ranks keeping their own") {
  const int R = world().size();
  const auto next = [R](int r) { return Peers{(r + 1) % R, (r + R - 1) % R}; };
  const auto back = [R](int r) { return Peers{(r + R - 1) % R, (r + 1) % R}; };
  const auto self = [](int r) { return Peers{r, r}; };
  // Ranks 0 and 1 swap; the others keep their own.
  const auto swap01 = [](int r) { return r < 2 ? Peers{1 - r, 1 - r} : Peers{r, r}; };
  const std::vector<std::function<Peers(int)>> moves = {next, back, self, swap01};
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1001}, std::size_t{700'001}})
    for (DType t : {DType::f32, DType::bf16})
      for (const auto& peers_of : moves) check_permute(peers_of, n, t);
  // Passes in flight together arrive in order, beside other collectives.
  const int r = world().rank();
  std::vector<float> a(4096, static_cast<float>(r)), b(4096, static_cast<float>(10 + r)), ra(4096),
      rb(4096), sum(4096, 1.0f);
  CommWork wa = world().permute_async(a.data(), ra.data(), a.size(), DType::f32, next(r));
  CommWork ws = world().all_reduce_async(sum.data(), sum.size(), DType::f32, ReduceOp::sum);
  CommWork wb = world().permute_async(b.data(), rb.data(), b.size(), DType::f32, back(r));
  wa.wait();
  ws.wait();
  wb.wait();
  CHECK(ra[4095] == static_cast<float>(next(r).from));
  CHECK(rb[0] == static_cast<float>(10 + back(r).from));
  CHECK(sum[7] == static_cast<float>(R));
}

TEST_CASE("permute refuses a peer outside the group before anything is sent") {
  const int R = world().size(), r = world().rank();
  float x = 0, y = 0;
  const std::string outside =
      "both must be ranks of the group (0 to " + std::to_string(R - 1) + ")";
  CHECK_THROWS_WITH_AS(world().permute(&x, &y, 1, DType::f32, Peers{R, r}),
                       doctest::Contains(outside.c_str()), CommError);
  CHECK_THROWS_WITH_AS(world().permute(&x, &y, 1, DType::f32, Peers{r, -1}),
                       doctest::Contains("permute between rank -1 (from)"), CommError);
  CHECK_THROWS_WITH_AS(world().permute(&x, &y, 1, DType::f32, Peers{r, (r + 1) % R}),
                       doctest::Contains("passes to itself receives from itself"), CommError);
  // Nothing was queued: the world still works.
  world().barrier();
}

TEST_CASE("every collective is counted where it runs: calls, and bytes a ring sends") {
  const int R = world().size(), r = world().rank();
  const auto ring = static_cast<std::uint64_t>(R - 1);
  // The calls of kind k since `before`, and the bytes all ranks sent for them.
  const auto check = [&](Collective k, const CommCounters& before, std::uint64_t calls,
                         std::uint64_t job_bytes) {
    const CommCounters d = world().counters().since(before);
    INFO(collective_name(k));
    CHECK(d.calls[kind(k)] == calls);
    CHECK(sum_over_ranks(d.bytes_sent[kind(k)]) == job_bytes);
    for (std::size_t other = 0; other < kCollectiveCount; ++other)
      if (other != kind(k)) CHECK(d.calls[other] == 0);
  };
  CommCounters before = world().counters();
  std::vector<float> v(1001, 1.0f);
  world().all_reduce(v.data(), v.size(), DType::f32, ReduceOp::sum);
  world().all_reduce_async(v.data(), 7, DType::bf16, ReduceOp::average).wait();
  check(Collective::all_reduce, before, 2, 2 * ring * (1001 * 4 + 7 * 2));

  before = world().counters();
  std::vector<float> send(5 * static_cast<std::size_t>(R), 1.0f), recv(5);
  world().reduce_scatter(send.data(), recv.data(), 5, DType::f32, ReduceOp::sum);
  std::vector<std::size_t> counts;
  std::size_t total = 0;
  for (int k = 0; k < R; ++k) total += counts.emplace_back(static_cast<std::size_t>(k * 3 % 5));
  std::vector<float> irregular(total, 1.0f), mine(5);
  world()
      .reduce_scatter_v_async(irregular.data(), mine.data(), counts, DType::f32, ReduceOp::sum)
      .wait();
  check(Collective::reduce_scatter, before, 2,
        ring * (5 * 4 * static_cast<std::uint64_t>(R) + total * 4));

  before = world().counters();
  world().all_gather(recv.data(), send.data(), 5, DType::f32);
  world().all_gather_v_async(mine.data(), irregular.data(), counts, DType::f32).wait();
  check(Collective::all_gather, before, 2,
        ring * (5 * 4 * static_cast<std::uint64_t>(R) + total * 4));

  before = world().counters();
  world().broadcast(v.data(), 10, DType::f16, R - 1);
  check(Collective::broadcast, before, 1, ring * 10 * 2);

  before = world().counters();
  std::vector<float> blocks(5 * static_cast<std::size_t>(R), 1.0f),
      arrived(5 * static_cast<std::size_t>(R));
  world().all_to_all(blocks.data(), arrived.data(), 5, DType::f32);
  world().all_to_all_async(v.data(), arrived.data(), 2, DType::bf16).wait();
  // Every block but the rank's own leaves it.
  check(Collective::all_to_all, before, 2, static_cast<std::uint64_t>(R) * ring * (5 * 4 + 2 * 2));

  before = world().counters();
  world().permute(v.data(), arrived.data(), 7, DType::bf16, Peers{(r + 1) % R, (r + R - 1) % R});
  world().permute(v.data(), arrived.data(), 9, DType::f32, Peers{r, r});  // sends nothing
  check(Collective::permute, before, 2, static_cast<std::uint64_t>(R) * 7 * 2);

  before = world().counters();
  auto sub = world().split(r % 2, r);
  CHECK(world().counters().since(before).total_bytes() == 0);  // forming groups is not traffic
  const CommCounters sub_before = sub->counters();
  before = world().counters();
  sub->all_reduce(v.data(), 100, DType::f32, ReduceOp::sum);
  // The group's collective counts in the group and in the world.
  CHECK(sub->counters().since(sub_before).calls[kind(Collective::all_reduce)] == 1);
  const CommCounters d = world().counters().since(before);
  CHECK(d.calls[kind(Collective::all_reduce)] == 1);
  CHECK(d.bytes_sent[kind(Collective::all_reduce)] ==
        sub->counters().since(sub_before).bytes_sent[kind(Collective::all_reduce)]);
  const std::uint64_t groups_bytes = sum_over_ranks(d.bytes_sent[kind(Collective::all_reduce)]);
  // Two groups (odd and even ranks) each send 2 (size-1) x 400 bytes.
  std::uint64_t want = 0;
  for (int colour = 0; colour < 2 && colour < R; ++colour) {
    const auto members = static_cast<std::uint64_t>((R - colour + 1) / 2);
    want += 2 * (members - 1) * 400;
  }
  CHECK(groups_bytes == want);
}

TEST_CASE("async collectives progress while the caller computes, and keep their order") {
  const int R = world().size();
  std::vector<float> a(1 << 16, 1.0f), b(1 << 16, 2.0f);
  CommWork wa = world().all_reduce_async(a.data(), a.size(), DType::f32, ReduceOp::sum);
  CommWork wb = world().all_reduce_async(b.data(), b.size(), DType::f32, ReduceOp::sum);
  // Not waiting yet: the worker completes both on its own.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!(wa.test() && wb.test()) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(wa.test());
  CHECK(wb.test());
  wa.wait();
  wb.wait();
  CHECK(a[123] == static_cast<float>(R));
  CHECK(b[456] == static_cast<float>(2 * R));
}

TEST_CASE("split by colour forms independent sub-communicators") {
  const int R = world().size(), r = world().rank();
  auto sub = world().split(r % 2, r);
  CHECK(sub->size() == (R + 1 - r % 2) / 2);
  CHECK(sub->rank() == r / 2);
  float x = static_cast<float>(r);
  sub->all_reduce(&x, 1, DType::f32, ReduceOp::sum);
  float want = 0;
  for (int k = r % 2; k < R; k += 2) want += static_cast<float>(k);
  CHECK(x == want);
  float y = 1.0f;
  world().all_reduce(&y, 1, DType::f32, ReduceOp::sum);  // the world still works alongside
  CHECK(y == static_cast<float>(R));
}

TEST_CASE("successive splits each connect their own group") {
  // gloo: every group meets in a store namespace of its own; one reused
  // would hand a rank the addresses of an earlier group's connections.
  const int R = world().size(), r = world().rank();
  std::vector<std::unique_ptr<Communicator>> groups;
  for (int round = 0; round < 12; ++round) {
    groups.push_back(world().split(0, round % 2 ? R - r : r));
    Communicator& g = *groups.back();
    CHECK(g.rank() == (round % 2 ? R - 1 - r : r));
    float x = static_cast<float>(g.rank());
    g.all_reduce(&x, 1, DType::f32, ReduceOp::sum);
    CHECK(x == static_cast<float>(R * (R - 1) / 2));
  }
  for (auto& g : groups) {
    float y = 1.0f;
    g->all_reduce(&y, 1, DType::f32, ReduceOp::sum);  // every group still works
    CHECK(y == static_cast<float>(R));
  }
}

// The mesh's communicators (job/mesh_groups.h) for meshes of this world:
// each dimension's communicator holds exactly its plan's group, this rank
// at its coordinate, and a reduction over it sums its members alone.
TEST_CASE("mesh groups: each dimension's communicator is its plan's group") {
  const int R = world().size(), r = world().rank();
  const ParallelSettings meshes[] = {{},           {R, 1, 1, 1}, {1, R, 1, 1},
                                     {1, 1, R, 1}, {1, 1, 1, R}, {2, 1, 1, 2},
                                     {1, 2, 2, 1}, {2, 2, 1, 1}, {1, 1, 2, 1}};
  int made = 0;
  for (const ParallelSettings& d : meshes) {
    if (R % (d.tensor * d.sequence * d.context * d.pipeline) != 0) continue;
    const MeshPlan plan = plan_mesh(d, {{R}});
    CAPTURE(plan.describe());
    const MeshGroups groups = make_mesh_groups(plan, world());
    for (const MeshDim dim :
         {MeshDim::tensor, MeshDim::sequence, MeshDim::context, MeshDim::data, MeshDim::pipeline}) {
      Communicator& g = groups[dim];
      const std::vector<int> members = plan.group(r, dim);
      REQUIRE(g.size() == static_cast<int>(members.size()));
      CHECK(g.rank() == plan.coordinate(r, dim));
      std::vector<float> seen(members.size());
      const float mine = static_cast<float>(r);
      g.all_gather(&mine, seen.data(), 1, DType::f32);
      for (std::size_t k = 0; k < members.size(); ++k)
        CHECK(seen[k] == static_cast<float>(members[k]));
      float sum = mine;
      g.all_reduce(&sum, 1, DType::f32, ReduceOp::sum);
      float want = 0;
      for (const int m : members) want += static_cast<float>(m);
      CHECK(sum == want);
    }
    ++made;
  }
  CHECK(made >= 5);
}

TEST_CASE("ddp's reduction launches buckets as modules finish backward, none while accumulating") {
  const int R = world().size(), r = world().rank();
  ParamSpecs params;
  auto add = [&](const char* name, std::int64_t n, std::vector<ModuleId> used_by) {
    params.push_back(param(name, n, std::move(used_by)));
  };
  add("embed", 300, {0_module, 3_module});  // tied: complete only after module 0
  add("block0", 500, {1_module});
  add("block1", 500, {2_module});
  add("head", 100, {3_module});
  const shard::FlatLayout layout(params, 1);
  std::vector<float> grads(layout.total());
  auto dev = make_cpu_device(1);
  shard::GradReducer reducer(
      *dev, params, layout, world(),
      shard::make_reduce_plan(params, layout, shard::ReducePolicy::replicate, {600, 100, true}),
      DType::f32, grads.data(), {}, "test");
  const std::size_t buckets = reducer.plan().buckets.size();
  CHECK(buckets >= 3);
  const auto all_reduces = [] { return world().counters().calls[kind(Collective::all_reduce)]; };
  const CommCounters before = world().counters();
  const std::uint64_t calls_before = before.calls[kind(Collective::all_reduce)];
  for (bool last : {false, true}) {  // two micro-steps: accumulate, then reduce
    for (float& g : grads) g += static_cast<float>(r + 1);
    reducer.begin_micro_step(last);
    reducer.module_done(3_module);  // head: its bucket is complete
    reducer.module_done(2_module);
    // Launched during backward only in the last micro-step. A collective
    // is counted when the worker has run it: wait for it (and, while
    // accumulating, long enough that one launched would have been counted).
    const auto deadline = std::chrono::steady_clock::now() +
                          (last ? std::chrono::seconds(30) : std::chrono::seconds(1) / 5);
    while ((!last || all_reduces() == calls_before) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK((all_reduces() > calls_before) == last);
    reducer.module_done(1_module);
    reducer.module_done(0_module);
  }
  reducer.finish();
  float want = 0;
  for (int k = 0; k < R; ++k) want += static_cast<float>(k + 1);
  want = 2.0f * want / static_cast<float>(R);
  for (ParamId p : params.ids()) CHECK(grads[layout.offset(p)] == want);
  // Every bucket reduced exactly once: the ranks sent 2 times the
  // gradient bytes between them.
  const CommCounters d = world().counters().since(before);
  CHECK(d.calls[kind(Collective::all_reduce)] == buckets);
  CHECK(sum_over_ranks(d.bytes_sent[kind(Collective::all_reduce)]) ==
        2 * layout.total() * sizeof(float) * static_cast<std::uint64_t>(R - 1));
}

TEST_CASE("all_gather in place: each rank sends its own block of the result") {
  const int R = world().size(), r = world().rank();
  const std::size_t n = 4;
  std::vector<float> all(n * static_cast<std::size_t>(R), -1.0f);
  for (std::size_t i = 0; i < n; ++i)
    all[static_cast<std::size_t>(r) * n + i] = static_cast<float>(10 * r) + static_cast<float>(i);
  world().all_gather(all.data() + static_cast<std::size_t>(r) * n, all.data(), n, DType::f32);
  for (int k = 0; k < R; ++k)
    for (std::size_t i = 0; i < n; ++i)
      CHECK(all[static_cast<std::size_t>(k) * n + i] ==
            static_cast<float>(10 * k) + static_cast<float>(i));
}

namespace {

ParamSpecs odd_chain() {
  ParamSpecs params;
  auto add = [&](const char* name, std::int64_t n, std::vector<ModuleId> used_by) {
    params.push_back(param(name, n, std::move(used_by)));
  };
  add("embed", 301, {0_module, 3_module});  // odd sizes: shards split parameters mid-way
  add("block0", 499, {1_module});
  add("block1", 503, {2_module});
  add("head", 97, {3_module});
  return params;
}

// The gatherer over `owned` (this rank's range of `full`): three steps of
// the standard trace with every view whole, gathers issued ahead of use,
// and a whole parameter read back.
// max_staged: the most host read-buffer bytes (offload) allowed after any
// fetch (0: not checked).
void check_gatherer(const ParamSpecs& params, const shard::FlatLayout& layout,
                    const std::vector<float>& full, Device& dev, shard::OwnedShard& owned,
                    std::uint64_t read_buffers = 0, std::uint64_t max_staged = 0) {
  const ModuleSpecs modules{{"embed"}, {"block.0"}, {"block.1"}, {"head"}};
  // With a read-buffer cap the prefetch asks for everything at once.
  shard::GatherOptions opts =
      read_buffers ? shard::GatherOptions{2000, 2000, 0, 0} : shard::GatherOptions{600, 1200, 0, 0};
  opts.read_buffers = read_buffers;
  shard::ParamGatherer g(dev, params, modules, layout, world(), owned, opts, "test");
  std::uint64_t most_staged = 0;
  std::vector<shard::GatherEvent> log;
  g.record_events(&log);
  for (int step = 0; step < 3; ++step) {
    g.begin_micro_step();
    for (const auto& [m, backward] : shard::standard_trace(4)) {
      g.fetch(m, backward);
      most_staged = std::max(most_staged, dev.stats().current[Tier::host][Category::offload]);
      for (ParamId p : params.ids()) {
        const auto& u = params[p].used_by;
        if (std::find(u.begin(), u.end(), m) == u.end()) continue;
        const float* got = g.view(p).f32();
        const float* want = full.data() + layout.offset(p);
        CHECK(std::equal(want, want + layout.numel(p), got));
      }
      g.release(m, backward);
    }
    g.end_step();
  }
  bool ahead = false;
  for (const auto& e : log) {
    CHECK(e.live <= opts.max_live_parameters);
    if (e.kind == shard::GatherEvent::Kind::gather && e.position) {
      // A gather issued at position i for a parameter position i does not use.
      const auto& u = g.groups()[e.group].used_by;
      const ModuleId here = shard::standard_trace(4).at(*e.position).module;
      if (std::find(u.begin(), u.end(), here) == u.end()) ahead = true;
    }
  }
  CHECK(ahead);
  if (max_staged) CHECK(most_staged <= max_staged);
  std::vector<float> whole(503);
  g.read(2_param, whole.data());
  CHECK(std::equal(whole.begin(), whole.end(), full.data() + layout.offset(2_param)));
}

}  // namespace

TEST_CASE("zero3's gatherer makes whole parameters from every rank's shard, prefetching ahead") {
  const int R = world().size(), r = world().rank();
  const auto params = odd_chain();
  const shard::FlatLayout layout(params, R);
  std::vector<float> full(layout.total());
  shard::init_flat(params, layout, 11, 0, layout.total(), full.data());
  std::vector<float> mine(full.begin() + static_cast<std::ptrdiff_t>(layout.owned_begin(r)),
                          full.begin() + static_cast<std::ptrdiff_t>(layout.owned_end(r)));
  auto dev = make_cpu_device(1);
  shard::ResidentShard owned(*dev, layout.owned_begin(r), layout.owned_end(r), mine.data(),
                             Tier::host);
  check_gatherer(params, layout, full, *dev, owned);
}

TEST_CASE("zero3's gatherer reads each rank's part from its swap file (offload_param nvme)") {
  const int R = world().size(), r = world().rank();
  const auto params = odd_chain();
  const shard::FlatLayout layout(params, R);
  std::vector<float> full(layout.total());
  shard::init_flat(params, layout, 11, 0, layout.total(), full.data());
  const auto dir =
      std::filesystem::temp_directory_path() / ("ztrain-mpi-gather-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    auto dev = make_cpu_device(1);
    const std::uint64_t b = layout.owned_begin(r), e = layout.owned_end(r);
    shard::SwappedShard owned(*dev, b, e, DType::f32, dir, {}, r);
    owned.write(b, full.data() + b, e - b);
    check_gatherer(params, layout, full, *dev, owned);
    // One read buffer: never two parts in host memory at once, though the
    // prefetch asks for every group at the first module.
    std::uint64_t largest = 0;
    for (const auto& gr : shard::gather_groups(params, layout, 0)) {
      const std::uint64_t pb = std::max(gr.begin, b), pe = std::min(gr.end, e);
      if (pb < pe)
        largest = std::max(largest, shard::SwappedShard::loan_bytes(b, pb, pe, DType::f32));
    }
    check_gatherer(params, layout, full, *dev, owned, 1, largest);
    CHECK(dev->stats().current[Tier::host][Category::offload] == 0);
  }
  CHECK(std::filesystem::is_empty(dir));  // the swap file went with the shard
  std::filesystem::remove_all(dir);
}

TEST_CASE("the sharded gradient reducer averages every rank's gradients into the owner's shard") {
  const int R = world().size(), r = world().rank();
  ParamSpecs params;
  auto add = [&](const char* name, std::int64_t n, std::vector<ModuleId> used_by) {
    params.push_back(param(name, n, std::move(used_by)));
  };
  add("embed", 301, {0_module, 2_module});
  add("block", 499, {1_module});
  add("head", 97, {2_module});
  const shard::FlatLayout layout(params, R);
  const std::uint64_t begin = layout.owned_begin(r), n = layout.owned_end(r) - begin;
  std::vector<float> shard_grads(n, 0.0f);
  auto dev = make_cpu_device(1);
  shard::GradReducer red(
      *dev, params, layout, world(),
      shard::make_reduce_plan(params, layout, shard::ReducePolicy::shard_during_backward,
                              {200, 100, true}),
      DType::f32, {}, std::vector<shard::GradPiece>{{begin, begin + n, shard_grads.data()}},
      "test");
  for (int micro = 0; micro < 2; ++micro) {
    red.begin_micro_step(micro == 1);
    for (std::size_t mi = 3; mi-- > 0;) {
      const auto m = id_at<ModuleId>(mi);
      for (ParamId p : params.ids()) {
        const auto& u = params[p].used_by;
        if (std::find(u.begin(), u.end(), m) == u.end()) continue;
        TensorView gv = red.grad(p);
        for (std::int64_t i = 0; i < gv.numel(); ++i) gv.f32()[i] += static_cast<float>(r + 1);
      }
      red.module_done(m);
    }
  }
  red.finish();
  // Each use adds rank+1; averaged over ranks, summed over two micro-steps.
  const float mean = static_cast<float>(R + 1) / 2.0f;
  for (const auto& seg : layout.segments(begin, begin + n)) {
    const float uses = seg.param == 0_param ? 2.0f : 1.0f;
    for (std::uint64_t i = seg.begin; i < seg.end; ++i)
      CHECK(shard_grads[i - begin] == doctest::Approx(2.0f * uses * mean));
  }
}

// What the ranks agree on after a step: the loss averaged as the
// communicators average (f32 sum divided by the world), a stop if any rank
// was asked, checkpoint parts written only if every rank's is.
TEST_CASE("step agreement: the loss's mean, any rank's stop, every rank's write") {
  Communicator& comm = world();
  const int r = comm.rank(), n = comm.size();
  const float loss = 1.5f + static_cast<float>(r);
  float expected = 0;
  for (int k = 0; k < n; ++k) expected += 1.5f + static_cast<float>(k);
  expected /= static_cast<float>(n);
  const StepAgreement one_asks = StepAgreement::reach(comm, {loss, r == n - 1, r != 0});
  CHECK(one_asks.loss == static_cast<double>(expected));
  CHECK(one_asks.stop);
  CHECK_FALSE(one_asks.written_everywhere);
  const StepAgreement none_asks = StepAgreement::reach(comm, {loss, false, true});
  CHECK_FALSE(none_asks.stop);
  CHECK(none_asks.written_everywhere);
  // Bit for bit the communicators' own average of the same values.
  float mean = loss;
  comm.all_reduce(&mean, 1, DType::f32, ReduceOp::average);
  CHECK(none_asks.loss == static_cast<double>(mean));
}
