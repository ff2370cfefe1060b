// The nccl communicator on GPUs: alone (world 1, bootstrapped by the local
// communicator) and, under mpirun with one GPU per rank, between ranks:
// every collective and type against values each rank can compute, the
// ordering against compute-stream work without host waits, the counters,
// and split.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "comm/world.h"
#include "cuda/nccl_communicator.h"
#include "gpu_support.h"
#include "ztrain/comm.h"

namespace {

using gpu::Array;
using gpu::Vec;
using ztrain::DType;
using ztrain::ReduceOp;

ztrain::Communicator& bootstrap() {
  static const auto b = ztrain::launched_by_mpi() ? ztrain::make_mpi_communicator(60.0)
                                                  : ztrain::make_local_communicator();
  return *b;
}

ztrain::Communicator& nccl() {
  static const auto c = ztrain::cuda::make_nccl_communicator(bootstrap(), gpu::device(), 60.0);
  return *c;
}

// Rank r's value i: distinct per rank and element, exact in bf16.
Vec values(int r, std::size_t n) {
  Vec v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>((r + 1) * 4 + static_cast<int>(i % 13));
  return v;
}

}  // namespace

TEST_CASE("the communicator has the bootstrap's ranks") {
  CHECK(nccl().rank() == bootstrap().rank());
  CHECK(nccl().size() == bootstrap().size());
  CHECK(nccl().backend() == "nccl");
}

TEST_CASE("all_reduce sums and averages in every type, after compute-stream writes") {
  const int N = nccl().size(), r = nccl().rank();
  const std::size_t n = 100003;
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::average}) {
      CAPTURE(ztrain::dtype_name(t));
      Array a(n, t);
      // Written on the compute stream, right before the collective: the
      // collective must see these values, not the zeros.
      const Vec mine = values(r, n);
      Array src(mine, t);
      gpu::device().copy_async(a.data(), src.data(), n * ztrain::dtype_size(t),
                               gpu::device().compute());
      nccl().all_reduce_async(a.data(), n, t, op).wait();
      Vec want(n, 0.0f);
      for (int q = 0; q < N; ++q) {
        const Vec v = values(q, n);
        for (std::size_t i = 0; i < n; ++i) want[i] += v[i];
      }
      if (op == ReduceOp::average)
        for (auto& x : want) x /= static_cast<float>(N);
      gpu::check_close(a.get(), gpu::rounded(want, t), t == DType::f32 ? 1e-6 : 1e-2, 0,
                       "all_reduce");
    }
  }
}

// Which rank holds an element's maximum varies with the element.
TEST_CASE("all_reduce takes the maximum in every type") {
  const int N = nccl().size(), r = nccl().rank();
  const std::size_t n = 4099;
  const auto peaky = [](int q, std::size_t i) {
    return static_cast<float>((q * 7 + static_cast<int>(i % 1000) * 3) % 11) - 5.0f;
  };
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    CAPTURE(ztrain::dtype_name(t));
    Vec mine(n), want(n, -INFINITY);
    for (std::size_t i = 0; i < n; ++i) mine[i] = peaky(r, i);
    for (int q = 0; q < N; ++q)
      for (std::size_t i = 0; i < n; ++i) want[i] = std::max(want[i], peaky(q, i));
    Array a(mine, t);
    nccl().all_reduce(a.data(), n, t, ReduceOp::max);
    gpu::check_close(a.get(), want, 0, 0, "all_reduce max");
  }
}

TEST_CASE("reduce_scatter, all_gather and broadcast place every block") {
  const int N = nccl().size(), r = nccl().rank();
  const std::size_t block = 1001;
  const Vec mine = values(r, block * N);
  Array send(mine), recv(block), gathered(block * N), own(values(r, block));
  nccl().reduce_scatter(send.data(), recv.data(), block, DType::f32, ReduceOp::sum);
  Vec want(block, 0.0f);
  for (int q = 0; q < N; ++q) {
    const Vec v = values(q, block * N);
    for (std::size_t i = 0; i < block; ++i) want[i] += v[r * block + i];
  }
  gpu::check_close(recv.get(), want, 1e-6, 0, "reduce_scatter");
  nccl().all_gather(own.data(), gathered.data(), block, DType::f32);
  Vec all;
  for (int q = 0; q < N; ++q) {
    const Vec v = values(q, block);
    all.insert(all.end(), v.begin(), v.end());
  }
  gpu::check_close(gathered.get(), all, 0, 0, "all_gather");
  Array b(values(r, 77));
  nccl().broadcast(b.data(), 77, DType::f32, N - 1);
  gpu::check_close(b.get(), values(N - 1, 77), 0, 0, "broadcast");
}

TEST_CASE("irregular blocks: empty, uneven and in place") {
  const int N = nccl().size(), r = nccl().rank();
  std::vector<std::size_t> counts(static_cast<std::size_t>(N));
  for (int q = 0; q < N; ++q) counts[static_cast<std::size_t>(q)] = q == 0 ? 0 : 37 * q + 5;
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  std::size_t offset = 0;
  for (int q = 0; q < r; ++q) offset += counts[static_cast<std::size_t>(q)];
  const std::size_t own = counts[static_cast<std::size_t>(r)];
  Array send(values(r, total)), recv(std::max<std::size_t>(own, 1));
  nccl().reduce_scatter_v_async(send.data(), recv.data(), counts, DType::f32, ReduceOp::sum).wait();
  Vec want(own, 0.0f);
  for (int q = 0; q < N; ++q) {
    const Vec v = values(q, total);
    for (std::size_t i = 0; i < own; ++i) want[i] += v[offset + i];
  }
  Vec got = recv.get();
  got.resize(own);
  gpu::check_close(got, want, 1e-6, 0, "reduce_scatter_v");
  // In place: each rank's block already sits in the result.
  Vec mine_all(total, -1.0f);
  const Vec block = values(r, own);
  std::copy(block.begin(), block.end(), mine_all.begin() + static_cast<std::ptrdiff_t>(offset));
  Array all(mine_all);
  nccl().all_gather_v_async(all.f() + offset, all.data(), counts, DType::f32).wait();
  Vec want_all;
  for (int q = 0; q < N; ++q) {
    const Vec v = values(q, counts[static_cast<std::size_t>(q)]);
    want_all.insert(want_all.end(), v.begin(), v.end());
  }
  gpu::check_close(all.get(), want_all, 0, 0, "all_gather_v in place");
}

TEST_CASE("all_to_all trades blocks and permute passes a ring's block, on GPU and host memory") {
  const int N = nccl().size(), r = nccl().rank();
  const std::size_t block = 1001;
  // Rank q's block for rank p: values(q * N + p, block).
  Vec mine;
  for (int p = 0; p < N; ++p) {
    const Vec v = values(r * N + p, block);
    mine.insert(mine.end(), v.begin(), v.end());
  }
  Vec want;
  for (int q = 0; q < N; ++q) {
    const Vec v = values(q * N + r, block);
    want.insert(want.end(), v.begin(), v.end());
  }
  Array send(mine), recv(block * N);
  nccl().all_to_all(send.data(), recv.data(), block, DType::f32);
  gpu::check_close(recv.get(), want, 0, 0, "all_to_all");
  Vec host(block * N, -1.0f);  // staged through GPU copies
  nccl().all_to_all(mine.data(), host.data(), block, DType::f32);
  gpu::check_close(host, want, 0, 0, "all_to_all from host memory");

  const ztrain::Peers ring{(r + 1) % N, (r + N - 1) % N};
  Array out(values(r, 777)), in(777);
  nccl().permute(out.data(), in.data(), 777, DType::f32, ring);
  gpu::check_close(in.get(), values(ring.from, 777), 0, 0, "permute");
  const auto before = nccl().counters();
  nccl().permute(out.data(), in.data(), 777, DType::f32, ztrain::Peers{r, r});
  gpu::check_close(in.get(), values(r, 777), 0, 0, "permute to itself");
  const auto d = nccl().counters().since(before);
  CHECK(d.calls[static_cast<std::size_t>(ztrain::Collective::permute)] == 1);
  CHECK(d.bytes_sent[static_cast<std::size_t>(ztrain::Collective::permute)] == 0);
}

TEST_CASE("completed collectives are counted with the bytes a ring sends") {
  const int N = nccl().size();
  const auto before = nccl().counters();
  Array a(4096);
  nccl().all_reduce(a.data(), 4096, DType::f32, ReduceOp::sum);
  nccl().barrier();
  const auto d = nccl().counters().since(before);
  const auto ar = static_cast<std::size_t>(ztrain::Collective::all_reduce);
  CHECK(d.calls[ar] == 1);
  CHECK(d.bytes_sent[ar] == (N == 1 ? 0u : 2u * 4096 * 4 * (N - 1) / N));
  CHECK(d.calls[static_cast<std::size_t>(ztrain::Collective::barrier)] == 1);
}

TEST_CASE("split groups ranks by colour") {
  const int r = nccl().rank();
  auto part = nccl().split(r % 2, r);
  CHECK(part->size() == (nccl().size() + 1 - r % 2) / 2);
  Array one(Vec(8, 1.0f));
  part->all_reduce(one.data(), 8, DType::f32, ReduceOp::sum);
  CHECK(one.get()[7] == static_cast<float>(part->size()));
}
