// A fixed table of path slots, so the signal handler never allocates: a
// slot is claimed by an atomic exchange, its path copied in, then marked
// live; the handler (core/signals.cpp) unlinks the live ones.
#include "core/temp_files.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cstring>

#include "core/signals.h"

#include "ztrain/error.h"

namespace ztrain {
namespace {

constexpr int kSlots = 256;
constexpr std::size_t kPathMax = 4096;

struct Slot {
  std::atomic<int> state{0};  // 0 free, 1 claimed, 2 live
  char path[kPathMax];
};
std::array<Slot, kSlots> g_slots;

}  // namespace

void remove_temp_files() noexcept {
  for (Slot& s : g_slots)
    if (s.state.load() == 2) ::unlink(s.path);
}

TempFile::TempFile(std::filesystem::path path) : path_(std::move(path)), slot_(-1) {
  const std::string text = path_.string();
  if (text.size() >= kPathMax)
    throw IoError("path too long for a swap file: " + text + "; choose a shorter nvme_path");
  install_signal_handler();
  for (int i = 0; i < kSlots && slot_ < 0; ++i) {
    int free = 0;
    if (g_slots[static_cast<std::size_t>(i)].state.compare_exchange_strong(free, 1)) slot_ = i;
  }
  if (slot_ < 0) throw InternalError("more than 256 temporary files at once");
  Slot& s = g_slots[static_cast<std::size_t>(slot_)];
  std::memcpy(s.path, text.c_str(), text.size() + 1);
  s.state.store(2);
}

TempFile::~TempFile() {
  std::error_code ec;
  std::filesystem::remove(path_, ec);
  g_slots[static_cast<std::size_t>(slot_)].state.store(0);
}

}  // namespace ztrain
