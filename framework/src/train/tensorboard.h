// TensorBoard event files: a run's scalars where TensorBoard reads them.
//
// A TensorBoardFile writes one events.out.tfevents.<seconds>.<host> file in
// its directory (a resumed run starts a new one beside the first; TensorBoard
// reads a directory's files as one run and drops what a restart repeats).
// The file is TFRecord framing of Event messages (framework/proto/
// tensorboard_event.proto, TensorFlow's field numbers, encoded by libprotobuf):
// first a file_version event, then one event per scalars() call whose
// summary holds every (tag, value) of that step. Each record is written
// whole and flushed, as TensorBoard's own writers do, so a run killed
// mid-way keeps every step written before.
//
// Ownership: owns its file. Thread safety: one thread. Errors: Error naming
// the directory or file when it cannot be made or written.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ztrain {

class TensorBoardFile {
 public:
  explicit TensorBoardFile(const std::filesystem::path& dir);
  TensorBoardFile(const TensorBoardFile&) = delete;
  TensorBoardFile& operator=(const TensorBoardFile&) = delete;

  // One event at `step` holding each value under its tag ("train/loss").
  void scalars(std::int64_t step, const std::vector<std::pair<std::string, double>>& values);
  const std::filesystem::path& path() const { return path_; }

 private:
  // One TFRecord: length, its masked CRC-32C, the bytes, their masked CRC.
  void record(const std::string& bytes);

  std::filesystem::path path_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file_;
};

// TFRecord's checksum: CRC-32C rotated right by 15 bits plus 0xa282ead8, so
// that a CRC of data that holds CRCs is not trivially related to them.
std::uint32_t tfrecord_masked_crc(const void* data, std::size_t n);

}  // namespace ztrain
