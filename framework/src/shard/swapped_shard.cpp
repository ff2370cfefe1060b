#include "ztrain/shard/swapped_shard.h"

#include <cstring>
#include <string>

#include "ztrain/error.h"

namespace ztrain::shard {
namespace {

constexpr std::uint64_t kPage = AioEngine::kAlign;

std::uint64_t page_down(std::uint64_t bytes) {
  return bytes / kPage * kPage;
}
std::uint64_t page_up(std::uint64_t bytes) {
  return (bytes + kPage - 1) / kPage * kPage;
}

}  // namespace

SwappedShard::SwappedShard(Device& device, std::uint64_t begin, std::uint64_t end, DType dtype,
                           const std::filesystem::path& dir, const AioOptions& aio, int rank)
    : OwnedShard(begin, end, dtype),
      device_(device),
      engine_(aio),
      file_bytes_(file_bytes(end - begin, dtype)) {
  file_ = engine_.create(dir, "rank" + std::to_string(rank) + ".params", file_bytes_);
  device_.account(Tier::nvme, Category::params, static_cast<std::int64_t>(file_bytes_));
}

SwappedShard::~SwappedShard() {
  device_.account(Tier::nvme, Category::params, -static_cast<std::int64_t>(file_bytes_));
}

std::uint64_t SwappedShard::file_bytes(std::uint64_t elements, DType dtype) {
  return page_up(elements * dtype_size(dtype));
}

std::uint64_t SwappedShard::loan_bytes(std::uint64_t begin, std::uint64_t b, std::uint64_t e,
                                       DType dtype) {
  if (b == e) return 0;
  const std::size_t p = dtype_size(dtype);
  return page_up((e - begin) * p) - page_down((b - begin) * p);
}

ShardLoan SwappedShard::lend(std::uint64_t b, std::uint64_t e) {
  check(b, e);
  if (b == e) return {Buffer(), {nullptr, dtype()}};
  const std::uint64_t at = (b - begin()) * dtype_size(dtype()), from = page_down(at);
  const std::uint64_t bytes = loan_bytes(begin(), b, e, dtype());
  ShardLoan loan{device_.allocate(Tier::host, Category::offload, bytes, Fill::undefined), {}};
  AioEngine::Ticket t = engine_.read(file_, from, loan.staging.data(), bytes);
  engine_.wait(t);
  loan.data = {loan.staging.as<char>() + (at - from), dtype()};
  return loan;
}

void SwappedShard::write(std::uint64_t b, ConstTypedPtr src, std::uint64_t n) {
  check(b, b + n);
  if (n == 0) return;
  const std::size_t p = dtype_size(dtype());
  const std::uint64_t at = (b - begin()) * p, till = at + n * p;
  const std::uint64_t from = page_down(at), to = page_up(till);
  // The pages holding the range, read first where it covers them only in
  // part, so the elements around it keep their values.
  const bool partial = at != from || till != to;
  ShardLoan pages;
  if (partial)
    pages = lend(b, b + n);
  else
    pages.staging = device_.allocate(Tier::host, Category::offload, to - from, Fill::undefined);
  std::memcpy(pages.staging.as<char>() + (at - from), src.data, n * p);
  AioEngine::Ticket t = engine_.write(file_, from, pages.staging.data(), to - from);
  engine_.wait(t);
}

AioEngine::Ticket SwappedShard::write_async(std::uint64_t b, ConstTypedPtr src, std::uint64_t n) {
  check(b, b + n);
  const std::size_t p = dtype_size(dtype());
  const std::uint64_t at = (b - begin()) * p, till = at + n * p;
  if (at % kPage || (till % kPage && b + n != end()) ||
      reinterpret_cast<std::uintptr_t>(src.data) % kPage)
    throw InternalError("swapped parameter shard: write_async of elements [" + std::to_string(b) +
                        ", " + std::to_string(b + n) + ") is not page-aligned");
  if (n == 0) return {};
  return engine_.write(file_, at, src.data, page_up(till) - at);
}

}  // namespace ztrain::shard
