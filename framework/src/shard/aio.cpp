// The engine's thread owns the io_uring. Requests wait in a queue; the
// thread hands out their pieces while fewer than queue_depth are in flight,
// submits them (in one batch unless single_submit), then blocks for a
// completion and retires it: a piece that moved fewer bytes than asked is
// resubmitted for the rest, a failed one marks its request failed and stops
// its remaining pieces, and a request whose pieces have all ended wakes its
// waiters.
#include "ztrain/shard/aio.h"

#include "shard/aio_fault.h"

#include <fcntl.h>
#include <liburing.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "core/hold_points.h"
#include "core/temp_files.h"
#include "shard/swap_files.h"
#include "ztrain/error.h"
#include "ztrain/units.h"

namespace ztrain::shard {

void declare_aio_options(OptionList& o) {
  o.size("aio.block_size", 1 << 20, "bytes per I/O request piece").at_least(AioEngine::kAlign);
  o.integer("aio.queue_depth", 8, "I/O request pieces in flight at once").at_least(1).at_most(4096);
  o.flag("aio.single_submit", false, "submit each piece on its own instead of in batches");
  o.integer("aio.intra_op_parallelism", 1,
            "DeepSpeed's I/O threads per request (accepted; one engine thread overlaps every "
            "request with the computation)")
      .at_least(1);
  o.flag("aio.overlap_events", true,
         "DeepSpeed's overlap of submission and completion (always so here)");
}

AioOptions aio_options(const Options& o) {
  const std::uint64_t block = o.get_size("aio.block_size");
  if (block % AioEngine::kAlign != 0)
    throw ConfigError(o.where("aio.block_size") +
                      ": [strategy] aio.block_size = " + std::to_string(block) +
                      " is not a multiple of " + std::to_string(AioEngine::kAlign) +
                      " bytes, which direct I/O needs; use e.g. 1048576");
  return {block, static_cast<int>(o.get_int("aio.queue_depth")), o.get_bool("aio.single_submit")};
}

namespace {

struct Request {
  int file;
  int fd;
  bool write;
  std::uint64_t offset;
  char* buffer;
  std::uint64_t bytes;
  std::uint64_t next = 0;  // bytes handed out as pieces
  int in_flight = 0;
  int error = 0;  // errno of the first failure
  std::uint64_t error_at = 0;
  bool finished = false;
};

struct Piece {
  std::shared_ptr<Request> request;
  std::uint64_t at, bytes;  // within the request
};

bool memory_fs(const std::filesystem::path& dir) {
  struct statfs s {};
  return ::statfs(dir.c_str(), &s) == 0 && (static_cast<unsigned long>(s.f_type) == TMPFS_MAGIC ||
                                            static_cast<unsigned long>(s.f_type) == RAMFS_MAGIC);
}

std::string fs_name(const std::filesystem::path& dir) {
  struct statfs s {};
  if (::statfs(dir.c_str(), &s) != 0) return "this file system";
  switch (static_cast<unsigned long>(s.f_type)) {
    case TMPFS_MAGIC:
      return "tmpfs";
    case RAMFS_MAGIC:
      return "ramfs";
    case OVERLAYFS_SUPER_MAGIC:
      return "overlayfs";
    case NFS_SUPER_MAGIC:
      return "nfs";
    default:
      return "this file system";
  }
}

// A test's fault, planned by the host (shard/aio_fault.h): a disk that
// fills or fails half-way without one.
struct Injection {
  int error = 0;
  long after = 0;
};
std::mutex planned_mu;
Injection planned;

Injection injection() {
  std::lock_guard lock(planned_mu);
  return planned;
}

}  // namespace

void plan_aio_error(int error, long after) {
  std::lock_guard lock(planned_mu);
  planned = {error, after};
}

struct AioEngine::Impl {
  AioOptions options;
  Injection inject = injection();
  long writes = 0;
  io_uring ring{};
  struct File {
    std::filesystem::path path;
    int fd;
    std::unique_ptr<TempFile> temp;
  };
  std::vector<File> files;
  std::mutex mu;
  std::condition_variable work, done;
  std::deque<std::shared_ptr<Request>> queue;
  int in_flight = 0;
  bool stop = false;
  std::thread thread;

  void loop();
  void hand_out();
  void submit(const std::shared_ptr<Request>& r, std::uint64_t at, std::uint64_t bytes);
  void retire(io_uring_cqe* cqe);
  std::shared_ptr<Request> enqueue(int file, bool write, std::uint64_t offset, char* buffer,
                                   std::uint64_t bytes);
};

void AioEngine::Impl::submit(const std::shared_ptr<Request>& r, std::uint64_t at,
                             std::uint64_t bytes) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring);
  if (!sqe) {  // the queue holds what was prepared but not yet submitted
    io_uring_submit(&ring);
    sqe = io_uring_get_sqe(&ring);
  }
  auto* piece = new Piece{r, at, bytes};
  if (r->write)
    io_uring_prep_write(sqe, r->fd, r->buffer + at, static_cast<unsigned>(bytes), r->offset + at);
  else
    io_uring_prep_read(sqe, r->fd, r->buffer + at, static_cast<unsigned>(bytes), r->offset + at);
  io_uring_sqe_set_data(sqe, piece);
  ++r->in_flight;
  ++in_flight;
  if (options.single_submit) io_uring_submit(&ring);
}

// Under the lock: pieces of the queued requests while room is left.
void AioEngine::Impl::hand_out() {
  while (in_flight < options.queue_depth && !queue.empty()) {
    const std::shared_ptr<Request> r = queue.front();
    const std::uint64_t bytes = std::min(options.block_size, r->bytes - r->next);
    submit(r, r->next, bytes);
    r->next += bytes;
    if (r->next == r->bytes) queue.pop_front();
  }
}

void AioEngine::Impl::retire(io_uring_cqe* cqe) {
  std::unique_ptr<Piece> piece(static_cast<Piece*>(io_uring_cqe_get_data(cqe)));
  Request& r = *piece->request;
  int res = cqe->res;
  if (r.write && inject.error && res > 0 && ++writes == inject.after) res = -inject.error;
  std::lock_guard lock(mu);
  --in_flight;
  --r.in_flight;
  if (res < 0 && !r.error) {
    r.error = -res;
    r.error_at = r.offset + piece->at;
    // What is still queued of this request is not done.
    queue.erase(std::remove(queue.begin(), queue.end(), piece->request), queue.end());
    r.next = r.bytes;
  } else if (res >= 0 && static_cast<std::uint64_t>(res) < piece->bytes && !r.error) {
    if (res == 0) {  // end of file inside a request: the file is shorter than said
      r.error = EIO;
      r.error_at = r.offset + piece->at;
    } else {
      submit(piece->request, piece->at + static_cast<std::uint64_t>(res),
             piece->bytes - static_cast<std::uint64_t>(res));
      io_uring_submit(&ring);
    }
  }
  if (r.in_flight == 0 && r.next == r.bytes) {
    r.finished = true;
    done.notify_all();
  }
}

void AioEngine::Impl::loop() {
  for (;;) {
    {
      std::unique_lock lock(mu);
      if (in_flight == 0) work.wait(lock, [&] { return stop || !queue.empty(); });
      if (stop && queue.empty() && in_flight == 0) return;
      hand_out();
    }
    io_uring_submit(&ring);
    io_uring_cqe* cqe = nullptr;
    if (io_uring_wait_cqe(&ring, &cqe) < 0) continue;  // interrupted: look again
    do {
      retire(cqe);
      io_uring_cqe_seen(&ring, cqe);
    } while (io_uring_peek_cqe(&ring, &cqe) == 0);
  }
}

std::shared_ptr<Request> AioEngine::Impl::enqueue(int file, bool write, std::uint64_t offset,
                                                  char* buffer, std::uint64_t bytes) {
  const File& f = files.at(static_cast<std::size_t>(file));
  if (reinterpret_cast<std::uintptr_t>(buffer) % kAlign || offset % kAlign || bytes % kAlign)
    throw InternalError("direct I/O on " + f.path.string() + " needs " + std::to_string(kAlign) +
                        "-byte aligned buffers, offsets and lengths");
  auto r = std::make_shared<Request>(Request{file, f.fd, write, offset, buffer, bytes});
  if (bytes == 0) {
    r->finished = true;
    return r;
  }
  {
    std::lock_guard lock(mu);
    queue.push_back(r);
  }
  work.notify_one();
  return r;
}

AioEngine::AioEngine(const AioOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  const int rc = io_uring_queue_init(static_cast<unsigned>(options.queue_depth), &impl_->ring, 0);
  if (rc < 0)
    throw IoError(std::string("cannot start io_uring for the NVMe tier: ") + std::strerror(-rc) +
                  "; a container may forbid it (seccomp): allow io_uring_setup, or keep state in "
                  "host memory (zero3_offload)");
  impl_->thread = std::thread([this] { impl_->loop(); });
}

AioEngine::~AioEngine() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->work.notify_one();
  impl_->thread.join();
  io_uring_queue_exit(&impl_->ring);
  for (auto& f : impl_->files) ::close(f.fd);
}

int AioEngine::create(const std::filesystem::path& dir, const std::string& name,
                      std::uint64_t bytes) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw IoError("nvme_path '" + dir.string() +
                  "' is not a directory; create it, or point nvme_path at a directory on a local "
                  "NVMe drive");
  if (::access(dir.c_str(), W_OK) != 0)
    throw IoError("nvme_path '" + dir.string() + "' is not writable by this process (" +
                  std::strerror(errno) + "); choose a directory it may write");
  if (memory_fs(dir))
    throw IoError("nvme_path '" + dir.string() + "' is on " + fs_name(dir) +
                  ", which is memory: swap files there would take host RAM instead of saving it "
                  "(and older kernels refuse its direct I/O); point nvme_path at a directory on "
                  "a local disk (ext4, xfs)");
  // What a killed run left here goes first; what other runs hold is named if
  // the disk has no room for this file.
  const SwapSweep swept = sweep_swap_files(dir);
  if (!swept.removed.empty()) {
    std::fprintf(stderr, "%s\n", swept.removed.c_str());
    std::fflush(stderr);
  }
  const std::filesystem::path path = dir / swap_file_name(name);
  auto temp = std::make_unique<TempFile>(path);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EINVAL)
      throw IoError("nvme_path '" + dir.string() + "' is on " + fs_name(dir) +
                    ", which has no direct I/O (O_DIRECT): the NVMe tier bypasses the page "
                    "cache; point nvme_path at a directory on a local disk (ext4, xfs)");
    throw IoError("cannot create " + path.string() + ": " + std::strerror(errno));
  }
  const std::uint64_t size = (bytes + kAlign - 1) / kAlign * kAlign;
  struct statvfs vs {};
  const std::uint64_t free =
      ::fstatvfs(fd, &vs) == 0 ? static_cast<std::uint64_t>(vs.f_bavail) * vs.f_frsize : 0;
  // Reserved now, so a full disk is met here and not half-way through a step.
  const int rc = size ? ::posix_fallocate(fd, 0, static_cast<off_t>(size)) : 0;
  if (rc != 0) {
    ::close(fd);
    if (rc == ENOSPC)
      throw IoError(
          "the NVMe tier needs " + format_bytes(size) + " in " + path.string() + ", but only " +
          format_bytes(free) + " are free under nvme_path '" + dir.string() + "'" +
          (swept.others.empty() ? std::string()
                                : "; it also holds the swap files of other runs: " + swept.others +
                                      " (remove those no run uses)") +
          "; free space, or choose another nvme_path");
    throw IoError("cannot reserve " + format_bytes(size) + " for " + path.string() + ": " +
                  std::strerror(rc));
  }
  impl_->files.push_back({path, fd, std::move(temp)});
  hold_point("swap_created");
  return static_cast<int>(impl_->files.size()) - 1;
}

const std::filesystem::path& AioEngine::path(int file) const {
  return impl_->files.at(static_cast<std::size_t>(file)).path;
}

AioEngine::Ticket AioEngine::read(int file, std::uint64_t offset, void* buffer,
                                  std::uint64_t bytes) {
  Ticket t;
  t.state_ = impl_->enqueue(file, false, offset, static_cast<char*>(buffer), bytes);
  return t;
}

AioEngine::Ticket AioEngine::write(int file, std::uint64_t offset, const void* buffer,
                                   std::uint64_t bytes) {
  Ticket t;
  t.state_ =
      impl_->enqueue(file, true, offset, static_cast<char*>(const_cast<void*>(buffer)), bytes);
  return t;
}

void AioEngine::wait(Ticket& ticket) {
  if (!ticket.state_) return;
  const auto r = std::static_pointer_cast<Request>(ticket.state_);
  ticket.state_.reset();
  std::unique_lock lock(impl_->mu);
  impl_->done.wait(lock, [&] { return r->finished; });
  if (!r->error) return;
  const std::string what = std::string(r->write ? "writing " : "reading ") +
                           path(r->file).string() + " at byte " + std::to_string(r->error_at) +
                           " failed: " + std::strerror(r->error);
  if (r->error == ENOSPC)
    throw IoError(what +
                  "; the disk under nvme_path is full: free space or choose another "
                  "nvme_path (the run's state there is lost; its swap files are removed)");
  throw IoError(what + "; check the drive (dmesg) or choose another nvme_path");
}

}  // namespace ztrain::shard
