// safetensors files: the weight format of the Hugging Face world.
//
// Layout: an 8-byte little-endian header length, a JSON header mapping each
// tensor name to {dtype, shape, data_offsets} (plus an optional
// "__metadata__" map of strings), then the tensor bytes. The reader maps the
// file and validates everything before handing out a tensor: header size,
// JSON syntax, dtypes, that each tensor's byte range matches its shape and
// lies inside the file, and that ranges do not overlap. It reads F32, BF16
// and F16 tensors (converting to fp32 on request). The writer writes to a
// temporary file, one tensor at a time, syncs it and renames it into place.
//
// Errors: DataError naming the file and what is wrong.
// Thread safety: a reader is immutable after construction.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ztrain/dtype.h"
#include "ztrain/export.h"
#include "ztrain/mapped_file.h"
#include "ztrain/tensor.h"

namespace ztrain {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  std::uint64_t offset = 0;  // from the start of the file
  std::uint64_t bytes = 0;
};

class ZTRAIN_API SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::filesystem::path& path);
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor's elements converted to fp32 (out holds shape.numel()).
  void read_f32(const SafetensorsEntry& e, float* out) const;
  // Elements [first, first + count) of the tensor (flat, row-major) in
  // fp32; only their pages of the file are read. InternalError past the end.
  void read_f32(const SafetensorsEntry& e, std::uint64_t first, std::uint64_t count,
                float* out) const;
  const std::filesystem::path& path() const { return file_.path(); }

 private:
  MappedFile file_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  const void* data = nullptr;  // shape.numel() elements of dtype
};

// Writes a file tensor by tensor, so no more than one tensor need be in
// memory: the header from each tensor's name, dtype and shape (data
// unused), then put() the tensors' bytes in that order; finish() syncs the
// file and renames it into place. Destroyed unfinished (an error on the
// way), the partial file is removed.
class DurableFile;
class ZTRAIN_API SafetensorsWriter {
 public:
  SafetensorsWriter(const std::filesystem::path& path, std::vector<SafetensorsTensor> tensors,
                    const std::map<std::string, std::string>& metadata);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  // The next tensor's shape.numel() elements of its dtype.
  void put(const void* data);
  void finish();

 private:
  std::filesystem::path path_, tmp_;
  std::vector<SafetensorsTensor> tensors_;
  std::size_t next_ = 0;
  std::unique_ptr<DurableFile> file_;
};

// All at once: tensors' data given.
ZTRAIN_API void write_safetensors(const std::filesystem::path& path,
                                  const std::vector<SafetensorsTensor>& tensors,
                                  const std::map<std::string, std::string>& metadata);

}  // namespace ztrain
