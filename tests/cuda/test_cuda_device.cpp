// The cuda device on a real GPU: the budget makes a small GPU of a large
// one (the caching allocator stays under it), blocks are reused, the host
// tier is pinned, copies and stream ordering deliver the bytes.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_device.h"
#include "ztrain/error.h"

namespace {

using ztrain::Category;
using ztrain::Fill;
using ztrain::Tier;
using ztrain::cuda::CudaDevice;

std::unique_ptr<ztrain::Device> open(bool pinned = true) {
  ztrain::cuda::CudaOptions o;
  o.pin_memory = pinned;
  return ztrain::cuda::make_cuda_device(o);
}

}  // namespace

TEST_CASE("a budget below the card's memory is a smaller GPU: the allocator holds no more") {
  auto dev = open();
  auto& cuda = static_cast<CudaDevice&>(*dev);
  CHECK(dev->kind() == ztrain::DeviceKind::cuda);
  CHECK(dev->name().find("cuda:0") == 0);
  const std::uint64_t budget = 64ull << 20;
  dev->set_budget(Tier::device, budget);
  std::vector<ztrain::Buffer> held;
  std::string error;
  try {
    for (int i = 0; i < 100; ++i)
      held.push_back(dev->allocate(Tier::device, Category::activations, 5 << 20));
  } catch (const ztrain::OutOfMemoryError& e) {
    error = e.what();
  }
  INFO(error);
  CHECK(held.size() == 12);  // 12 x 5 MiB fit under 64 MiB, the 13th does not
  CHECK(error.find("budget") != std::string::npos);
  CHECK(cuda.allocator_stats().reserved <= budget);
  // Freed blocks come back for the same size without new device memory.
  const auto misses = cuda.allocator_stats().misses;
  held.clear();
  cuda.synchronize();
  for (int i = 0; i < 12; ++i)
    held.push_back(dev->allocate(Tier::device, Category::activations, 5 << 20));
  CHECK(cuda.allocator_stats().misses == misses);
  // Another size under the same budget: the cache gives blocks back.
  held.clear();
  cuda.synchronize();
  auto big = dev->allocate(Tier::device, Category::params, 40 << 20);
  CHECK(cuda.allocator_stats().reserved <= budget);
  CHECK(dev->stats().tier_peak[Tier::device] >= (60u << 20));
}

TEST_CASE("zero-filled device blocks read as zeros, even when reused") {
  auto dev = open();
  auto& cuda = static_cast<CudaDevice&>(*dev);
  std::vector<float> ones(1 << 18, 1.0f), back(1 << 18, -1.0f);
  {
    auto b = dev->allocate(Tier::device, Category::grads, ones.size() * 4, Fill::undefined);
    cuda.copy_async(b.data(), ones.data(), ones.size() * 4, cuda.compute());
    cuda.synchronize();
  }
  const auto hits = cuda.allocator_stats().hits;
  auto z = dev->allocate(Tier::device, Category::grads, ones.size() * 4);
  CHECK(cuda.allocator_stats().hits == hits + 1);  // the block of ones, reused
  cuda.copy_async(back.data(), z.data(), back.size() * 4, cuda.compute());
  cuda.synchronize();
  for (float x : back) REQUIRE(x == 0.0f);
}

TEST_CASE("the host tier is pinned when asked, pageable when not") {
  for (bool pinned : {true, false}) {
    auto dev = open(pinned);
    auto h = dev->allocate(Tier::host, Category::offload, 1 << 20);
    cudaPointerAttributes attr{};
    REQUIRE(cudaPointerGetAttributes(&attr, h.data()) == cudaSuccess);
    CHECK((attr.type == cudaMemoryTypeHost) == pinned);
    CHECK(static_cast<const char*>(h.data())[12345] == 0);
    // Checkpoint snapshots never are (the host writes them to disk).
    auto c = dev->allocate(Tier::host, Category::checkpoint, 1 << 20);
    REQUIRE(cudaPointerGetAttributes(&attr, c.data()) == cudaSuccess);
    CHECK(attr.type != cudaMemoryTypeHost);
  }
}

TEST_CASE("copies between tiers and across streams arrive in order") {
  auto dev = open();
  auto& cuda = static_cast<CudaDevice&>(*dev);
  const std::size_t n = 1 << 22;
  auto host = dev->allocate(Tier::host, Category::offload, n * 4, Fill::undefined);
  auto back = dev->allocate(Tier::host, Category::offload, n * 4);
  auto d = dev->allocate(Tier::device, Category::params, n * 4, Fill::undefined);
  for (std::size_t i = 0; i < n; ++i) host.as<float>()[i] = static_cast<float>(i);
  // Up, then a change on the compute stream, then down: each step after the
  // last.
  SUBCASE("on the copy stream, ordered by order()") {
    cuda.copy_async(d.data(), host.data(), n * 4, cuda.copy());
    cuda.order(cuda.compute(), cuda.copy());
    REQUIRE(cudaMemsetAsync(d.data(), 0, 4096, cuda.compute()) == cudaSuccess);
    cuda.order(cuda.copy(), cuda.compute());
    cuda.copy_async(back.data(), d.data(), n * 4, cuda.copy());
    cuda.synchronize();
  }
  SUBCASE("Device::copy_async: after the kernels queued before it, before those after wait()") {
    ztrain::CopyWork up = dev->copy_async(d.data(), host.data(), n * 4);
    up.wait();
    CHECK(up.done());
    REQUIRE(cudaMemsetAsync(d.data(), 0, 4096, cuda.compute()) == cudaSuccess);
    ztrain::CopyWork down = dev->copy_async(back.data(), d.data(), n * 4);
    down.wait();
  }
  for (std::size_t i = 0; i < 1024; ++i) REQUIRE(back.as<float>()[i] == 0.0f);
  for (std::size_t i = 1024; i < n; i += 997) REQUIRE(back.as<float>()[i] == static_cast<float>(i));
}

TEST_CASE("a GPU that does not exist is named in the error") {
  ztrain::cuda::CudaOptions o;
  o.ordinal = 1000;
  CHECK_THROWS_WITH_AS(ztrain::cuda::make_cuda_device(o), doctest::Contains("GPU 1000 asked for"),
                       ztrain::Error);
}
