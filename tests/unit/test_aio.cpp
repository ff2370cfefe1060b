// The NVMe tier's I/O engine: random data of uneven sizes round-trips at
// uneven offsets under several queue depths, block sizes and submission
// modes, many requests in flight at once; and each way it can fail says
// what and where: a missing or unwritable directory, a file system without
// direct I/O, an unaligned transfer, a disk that fills or fails half-way
// (injected), and swap files are gone when the engine is. And the
// parameter shard kept in a swap file on it (SwappedShard): any range reads
// back what was written, partial-page writes keep their neighbours, and
// every byte is accounted.
#include <doctest/doctest.h>

#include <sys/statfs.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <vector>

#include "shard/aio_fault.h"
#include "support.h"
#include "ztrain/device.h"
#include "ztrain/error.h"
#include "ztrain/shard/aio.h"
#include "ztrain/shard/swapped_shard.h"

namespace {

using namespace ztrain;
using shard::AioEngine;
constexpr std::uint64_t kPage = AioEngine::kAlign;

struct Pages {
  Buffer buffer;
  std::uint8_t* data() { return buffer.as<std::uint8_t>(); }
};

Pages pages(Device& dev, std::uint64_t n) {
  return {dev.allocate(Tier::host, Category::offload, n * kPage)};
}

std::uint64_t in_use(const Device& dev, Tier t, Category c) {
  return dev.stats().current[t][c];
}

}  // namespace

TEST_CASE("aio: random data round-trips at uneven sizes and offsets, many requests in flight") {
  auto dev = make_cpu_device(1);
  test::TempDir dir;
  std::mt19937 rng(5);
  for (auto [depth, block, single] : {std::tuple{1, kPage, false}, std::tuple{4, 3 * kPage, true},
                                      std::tuple{32, 16 * kPage, false}}) {
    INFO("queue depth " << depth << ", block " << block << ", single_submit " << single);
    AioEngine engine({block, depth, single});
    const std::uint64_t file_pages = 211;
    const int f =
        engine.create(dir.path(), "roundtrip." + std::to_string(depth), file_pages * kPage);
    // Requests of 1, 7, 37 and 101 pages at uneven page offsets.
    const std::vector<std::pair<std::uint64_t, std::uint64_t>> spans{
        {0, 1}, {1, 7}, {9, 37}, {47, 101}, {150, 61}};
    std::vector<Pages> out, in;
    std::vector<AioEngine::Ticket> tickets;
    for (auto [at, n] : spans) {
      out.push_back(pages(*dev, n));
      for (std::uint64_t i = 0; i < n * kPage; ++i)
        out.back().data()[i] = static_cast<std::uint8_t>(rng());
      tickets.push_back(engine.write(f, at * kPage, out.back().data(), n * kPage));
    }
    for (auto& t : tickets) engine.wait(t);
    tickets.clear();
    for (auto [at, n] : spans) {
      in.push_back(pages(*dev, n));
      tickets.push_back(engine.read(f, at * kPage, in.back().data(), n * kPage));
    }
    for (std::size_t k = 0; k < spans.size(); ++k) {
      engine.wait(tickets[k]);
      CHECK(std::equal(out[k].data(), out[k].data() + spans[k].second * kPage, in[k].data()));
    }
  }
}

TEST_CASE("aio: swap files are reserved when created and removed with the engine") {
  test::TempDir dir;
  std::filesystem::path path;
  {
    AioEngine engine({});
    path = engine.path(engine.create(dir.path(), "gone", 5 * kPage + 1));
    CHECK(std::filesystem::file_size(path) == 6 * kPage);  // rounded up to whole pages
    CHECK(path.filename().string().find("ztrain-") == 0);
  }
  CHECK(!std::filesystem::exists(path));
}

TEST_CASE("aio: a missing or unwritable directory, and a file system without direct I/O") {
  AioEngine engine({});
  CHECK(test::message_of<IoError>([&] {
          engine.create("/no/such/dir", "x", kPage);
        }).find("nvme_path '/no/such/dir' is not a directory; create it") != std::string::npos);
  const std::string proc = test::message_of<IoError>([&] { engine.create("/proc", "x", kPage); });
  CHECK((proc.find("is not writable") != std::string::npos ||
         proc.find("cannot create /proc/") != std::string::npos));
  struct statfs s {};
  if (::statfs("/dev/shm", &s) == 0 && s.f_type == 0x01021994) {  // tmpfs
    CHECK(test::message_of<IoError>([&] {
            engine.create("/dev/shm", "x", kPage);
          }).find("is on tmpfs, which is memory") != std::string::npos);
  } else {
    MESSAGE("skipped the tmpfs case: /dev/shm is not tmpfs here");
  }
}

TEST_CASE("aio: unaligned transfers are refused") {
  auto dev = make_cpu_device(1);
  test::TempDir dir;
  AioEngine engine({});
  const int f = engine.create(dir.path(), "align", 4 * kPage);
  Pages p = pages(*dev, 2);
  CHECK_THROWS_AS(engine.write(f, 100, p.data(), kPage), InternalError);
  CHECK_THROWS_AS(engine.write(f, 0, p.data() + 8, kPage), InternalError);
  CHECK_THROWS_AS(engine.read(f, 0, p.data(), 1000), InternalError);
}

TEST_CASE("aio: a disk that fills or fails half-way stops the request with the file and offset") {
  auto dev = make_cpu_device(1);
  test::TempDir dir;
  for (const char* inject : {"ENOSPC:3", "EIO:2"}) {
    ztrain::shard::plan_aio_error(inject[1] == 'N' ? ENOSPC : EIO, inject[1] == 'N' ? 3 : 2);
    AioEngine engine({kPage, 2, false});
    ztrain::shard::plan_aio_error(0, 0);
    const int f = engine.create(dir.path(), std::string("fail") + inject[1], 8 * kPage);
    Pages p = pages(*dev, 8);
    auto t = engine.write(f, 0, p.data(), 8 * kPage);
    const std::string msg = test::message_of<IoError>([&] { engine.wait(t); });
    INFO(msg);
    CHECK(msg.find("writing " + engine.path(f).string() + " at byte ") == 0);
    if (inject[1] == 'N')
      CHECK(msg.find("the disk under nvme_path is full") != std::string::npos);
    else
      CHECK(msg.find("Input/output error") != std::string::npos);
    // The engine still works for the next request.
    auto again = engine.read(f, 0, p.data(), kPage);
    engine.wait(again);
  }
}

TEST_CASE(
    "swapped shard: any range reads back what was written, and partial pages keep neighbours") {
  test::TempDir dir;
  std::mt19937 rng(11);
  for (DType t : {DType::f32, DType::bf16}) {
    INFO("dtype " << dtype_name(t));
    auto dev = make_cpu_device(1);
    const std::size_t p = dtype_size(t);
    const std::uint64_t begin = 1001, end = begin + 9001;  // odd bounds, unaligned pages
    std::vector<std::uint8_t> model((end - begin) * p);
    for (auto& b : model) b = static_cast<std::uint8_t>(rng());
    std::filesystem::path file;
    {
      shard::SwappedShard shard(*dev, begin, end, t, dir.path(), {kPage, 4, false}, 3);
      CHECK(shard.tier() == Tier::nvme);
      CHECK(!shard.resident());
      CHECK(in_use(*dev, Tier::nvme, Category::params) ==
            shard::SwappedShard::file_bytes(end - begin, t));
      shard.write(begin, {model.data(), t}, end - begin);
      // Overwrites of odd ranges, inside one page, across pages, at both ends.
      for (auto [b, e] : {std::pair{begin + 3, begin + 5},
                          {begin + 700, begin + 4100},
                          {begin, begin + 1},
                          {end - 17, end}}) {
        std::vector<std::uint8_t> fresh((e - b) * p);
        for (auto& x : fresh) x = static_cast<std::uint8_t>(rng());
        shard.write(b, {fresh.data(), t}, e - b);
        std::copy(fresh.begin(), fresh.end(),
                  model.begin() + static_cast<std::ptrdiff_t>((b - begin) * p));
      }
      for (auto [b, e] : {std::pair{begin, end},
                          {begin + 1, begin + 2},
                          {begin + 2047, begin + 6001},
                          {end - 1, end}}) {
        const shard::ShardLoan loan = shard.lend(b, e);
        CHECK(std::equal(model.begin() + static_cast<std::ptrdiff_t>((b - begin) * p),
                         model.begin() + static_cast<std::ptrdiff_t>((e - begin) * p),
                         static_cast<const std::uint8_t*>(loan.data.data)));
        CHECK(loan.staging.bytes() == shard::SwappedShard::loan_bytes(begin, b, e, t));
      }
      CHECK(in_use(*dev, Tier::host, Category::offload) ==
            0);  // the loans' host buffers are gone with them
      // write_async takes page-aligned pieces only: a page start, and a page
      // end or the range's end.
      const std::uint64_t per_page = kPage / p;
      Buffer src = dev->allocate(Tier::host, Category::offload, 2 * kPage);
      CHECK_THROWS_AS(shard.write_async(begin + 1, {src.data(), t}, per_page), InternalError);
      CHECK_THROWS_AS(shard.write_async(begin, {src.data(), t}, per_page + 1), InternalError);
      auto done = shard.write_async(begin, {src.data(), t}, per_page);
      shard.wait(done);
      const shard::ShardLoan zeros = shard.lend(begin, begin + per_page + 1);
      const auto* z = static_cast<const std::uint8_t*>(zeros.data.data);
      CHECK(std::all_of(z, z + kPage, [](std::uint8_t x) { return x == 0; }));
      CHECK(
          std::equal(z + kPage, z + kPage + p, model.begin() + static_cast<std::ptrdiff_t>(kPage)));
      file = dir.path();
    }
    CHECK(in_use(*dev, Tier::nvme, Category::params) == 0);
    CHECK(std::filesystem::is_empty(file));
  }
}
