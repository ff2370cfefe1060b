#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "io/durable_file.h"
#include "ztrain/error.h"

namespace ztrain {
namespace {

using json = nlohmann::json;

std::string dtype_tag(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
  }
  return "?";
}

std::uint64_t read_le64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

SafetensorsReader::SafetensorsReader(const std::filesystem::path& path) : file_(path) {
  const std::string where = path.string() + ": ";
  const std::uint64_t size = file_.size();
  if (size < 8)
    throw DataError(where + "not a safetensors file: " + std::to_string(size) +
                    " bytes, shorter than the 8-byte header length");
  const std::uint64_t header_len = read_le64(file_.data());
  if (header_len > size - 8)
    throw DataError(where + "truncated or not a safetensors file: the header claims " +
                    std::to_string(header_len) + " bytes but the file has " +
                    std::to_string(size - 8) + " after the length");
  json header;
  try {
    header = json::parse(file_.data() + 8, file_.data() + 8 + header_len);
  } catch (const json::exception& e) {
    throw DataError(where + "malformed safetensors header (not valid JSON: " + e.what() + ")");
  }
  if (!header.is_object())
    throw DataError(where + "malformed safetensors header (not a JSON object)");
  const std::uint64_t data_start = 8 + header_len;
  const std::uint64_t data_size = size - data_start;
  for (const auto& [name, spec] : header.items()) {
    if (name == "__metadata__") {
      if (!spec.is_object()) throw DataError(where + "__metadata__ is not an object");
      for (const auto& [k, v] : spec.items())
        metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
      continue;
    }
    const std::string at = where + "tensor '" + name + "': ";
    if (!spec.is_object() || !spec.contains("dtype") || !spec.contains("shape") ||
        !spec.contains("data_offsets"))
      throw DataError(at + "needs dtype, shape and data_offsets");
    if (!spec["dtype"].is_string()) throw DataError(at + "dtype is not a string");
    const std::string tag = spec["dtype"].get<std::string>();
    SafetensorsEntry e;
    e.name = name;
    if (tag == "F32")
      e.dtype = DType::f32;
    else if (tag == "BF16")
      e.dtype = DType::bf16;
    else if (tag == "F16")
      e.dtype = DType::f16;
    else
      throw DataError(at + "dtype " + tag + " is not supported (F32, BF16 or F16)");
    const auto& shape = spec["shape"];
    const auto& offs = spec["data_offsets"];
    if (!shape.is_array() || !offs.is_array() || offs.size() != 2)
      throw DataError(at + "shape must be a list and data_offsets a pair");
    std::vector<std::int64_t> dims;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned()) throw DataError(at + "shape holds a non-integer dimension");
      dims.push_back(d.get<std::int64_t>());
    }
    e.shape = Shape(std::move(dims));
    if (!offs[0].is_number_unsigned() || !offs[1].is_number_unsigned())
      throw DataError(at + "data_offsets are not non-negative integers");
    const auto begin = offs[0].get<std::uint64_t>(), end = offs[1].get<std::uint64_t>();
    if (begin > end || end > data_size)
      throw DataError(at + "bytes [" + std::to_string(begin) + ", " + std::to_string(end) +
                      ") lie outside the " + std::to_string(data_size) +
                      " data bytes; the file is truncated or corrupt");
    e.bytes = end - begin;
    if (e.bytes != static_cast<std::uint64_t>(e.shape.numel()) * dtype_size(e.dtype))
      throw DataError(
          at + "shape " + e.shape.str() + " of " + tag + " needs " +
          std::to_string(e.shape.numel() * static_cast<std::int64_t>(dtype_size(e.dtype))) +
          " bytes but data_offsets span " + std::to_string(e.bytes));
    e.offset = data_start + begin;
    entries_.push_back(std::move(e));
  }
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : entries_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->offset < b->offset; });
  for (std::size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->offset < by_offset[i - 1]->offset + by_offset[i - 1]->bytes)
      throw DataError(where + "tensors '" + by_offset[i - 1]->name + "' and '" +
                      by_offset[i]->name + "' overlap; the file is corrupt");
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

void SafetensorsReader::read_f32(const SafetensorsEntry& e, float* out) const {
  read_f32(e, 0, static_cast<std::uint64_t>(e.shape.numel()), out);
}

void SafetensorsReader::read_f32(const SafetensorsEntry& e, std::uint64_t first,
                                 std::uint64_t count, float* out) const {
  const auto n = static_cast<std::uint64_t>(e.shape.numel());
  if (first > n || count > n - first)
    throw InternalError("safetensors: elements [" + std::to_string(first) + ", +" +
                        std::to_string(count) + ") of '" + e.name + "' (" + std::to_string(n) +
                        " elements)");
  convert(file_.data() + e.offset + first * dtype_size(e.dtype), e.dtype, out, DType::f32,
          static_cast<std::size_t>(count));
}

SafetensorsWriter::SafetensorsWriter(const std::filesystem::path& path,
                                     std::vector<SafetensorsTensor> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), tmp_(path.string() + ".tmp"), tensors_(std::move(tensors)) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& t : tensors_) {
    if (header.contains(t.name))
      throw InternalError("safetensors: tensor '" + t.name + "' written twice");
    const std::uint64_t bytes = static_cast<std::uint64_t>(t.shape.numel()) * dtype_size(t.dtype);
    header[t.name] = {{"dtype", dtype_tag(t.dtype)},
                      {"shape", t.shape.dims()},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  file_ = std::make_unique<DurableFile>(tmp_);
  std::uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(text.size() >> (8 * i));
  file_->write(len, 8);
  file_->write(text.data(), text.size());
}

// The partial file goes whatever stops the write (a full disk, an I/O
// error): only a whole file ever takes the target's name.
SafetensorsWriter::~SafetensorsWriter() {
  if (!file_) return;
  file_.reset();
  std::error_code ignored;
  std::filesystem::remove(tmp_, ignored);
}

void SafetensorsWriter::put(const void* data) {
  if (!file_ || next_ >= tensors_.size())
    throw InternalError("safetensors: more tensors put than declared for " + path_.string());
  const SafetensorsTensor& t = tensors_[next_++];
  file_->write(data, static_cast<std::size_t>(t.shape.numel()) * dtype_size(t.dtype));
}

void SafetensorsWriter::finish() {
  if (!file_ || next_ != tensors_.size())
    throw InternalError("safetensors: " + std::to_string(next_) + " of " +
                        std::to_string(tensors_.size()) + " tensors put into " + path_.string());
  file_->finish();
  rename_durably(tmp_, path_);
  file_.reset();
}

void write_safetensors(const std::filesystem::path& path,
                       const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter w(path, tensors, metadata);
  for (const auto& t : tensors) w.put(t.data);
  w.finish();
}

}  // namespace ztrain
