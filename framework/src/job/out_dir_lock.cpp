// Taking the lock: open (or create) the file, flock it without waiting,
// then check that the path still names the file locked. A holder that ends
// removes the file before it releases the lock; a job that opened the old
// file in between would hold a lock on a file no longer there, while a third
// makes a new one: so a lock on a removed file is dropped and taken again.
// Once held, the file is rewritten with this process's host, pid and start.
#include "job/out_dir_lock.h"
#include "core/host_name.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>

#include "core/hold_points.h"
#include "io/fd_io.h"

#include "ztrain/error.h"

namespace ztrain {
namespace fs = std::filesystem;
namespace {

// Who holds (or held) a lock file: "host vm, pid 4242, since 2026-12-02
// 18:55:01 UTC", from the file's text; empty when it holds none.
struct Holder {
  std::string host;
  long long pid = 0;
  std::string since;
  std::string text() const {
    return "host " + host + ", pid " + std::to_string(pid) +
           (since.empty() ? "" : ", since " + since);
  }
};

std::string read_all(int fd) {
  std::string text;
  char buf[512];
  for (off_t at = 0;;) {
    const ssize_t k = ::pread(fd, buf, sizeof buf, at);
    if (k <= 0) break;
    text.append(buf, static_cast<std::size_t>(k));
    at += k;
  }
  return text;
}

Holder holder_of(int fd) {
  Holder h;
  const nlohmann::json j = nlohmann::json::parse(read_all(fd), nullptr, false);
  if (!j.is_object()) return h;
  h.host = j.value("host", "");
  h.pid = j.value("pid", 0LL);
  h.since = j.value("since", "");
  return h;
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

bool same_file(int fd, const fs::path& path) {
  struct stat a {
  }, b{};
  return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
         a.st_ino == b.st_ino;
}

// What the note says of an earlier holder whose lock was free.
std::string taken_over(const Holder& h) {
  const bool here = h.host == host_name();
  const bool gone =
      here && h.pid > 0 && ::kill(static_cast<pid_t>(h.pid), 0) != 0 && errno == ESRCH;
  return "out_dir: took over the lock of an earlier run that ended without releasing it (" +
         h.text() + (gone ? ", no longer running" : "") + ")";
}

}  // namespace

OutDirLock::OutDirLock(const fs::path& out_dir, std::string& note) : file_(out_dir / kFileName) {
  std::error_code ec;
  for (fs::path p = fs::absolute(file_).lexically_normal().parent_path();
       !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    made_ = p;
    if (p == p.parent_path()) break;
  }
  fs::create_directories(out_dir, ec);
  if (ec || !fs::is_directory(out_dir))
    throw ConfigError("[train] out_dir '" + out_dir.string() + "' cannot be made a directory (" +
                      (ec ? ec.message() : std::string("a file is in the way")) +
                      "); choose another path");
  for (;;) {
    fd_ = ::open(file_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw ConfigError("[train] out_dir '" + out_dir.string() + "': cannot make its lock file " +
                        kFileName + " (" + std::strerror(errno) + "); choose a writable out_dir");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EWOULDBLOCK) {
        const Holder h = holder_of(fd_);
        ::close(fd_);
        fd_ = -1;
        throw ConfigError(
            "[train] out_dir '" + out_dir.string() + "' is in use by a running job (" +
            (h.host.empty() ? std::string("its lock file is being written") : h.text()) +
            "); wait for it to end, or choose another out_dir");
      }
      note = "out_dir: the file system of '" + out_dir.string() + "' has no locks (" +
             std::strerror(err) + "): nothing keeps a second job out of this run's directory";
      break;
    }
    if (same_file(fd_, file_)) break;
    ::close(fd_);  // locked a file its holder had just removed: again
  }
  const Holder earlier = holder_of(fd_);
  if (!earlier.host.empty() && note.empty()) note = taken_over(earlier);
  const std::string mine =
      nlohmann::json{
          {"host", host_name()}, {"pid", static_cast<long long>(::getpid())}, {"since", now_utc()}}
          .dump() +
      "\n";
  if (::ftruncate(fd_, 0) != 0 || write_all(fd_, mine.data(), mine.size()) != 0)
    throw ConfigError("[train] out_dir '" + out_dir.string() + "': cannot write its lock file (" +
                      std::strerror(errno) + ")");
}

// The file goes before the lock: a job that opens the path after the
// unlink makes a new file and waits on nothing; one that opened it before
// finds it removed once it gets the lock (same_file), and tries again.
OutDirLock::~OutDirLock() {
  if (fd_ >= 0) {
    ::unlink(file_.c_str());
    hold_point("lock_release");
    ::close(fd_);
  }
  if (made_.empty()) return;
  std::error_code ec;
  // remove() takes an empty directory only.
  fs::path dir = fs::absolute(file_).lexically_normal().parent_path();
  while (fs::remove(dir, ec) && dir != made_) dir = dir.parent_path();
}

}  // namespace ztrain
