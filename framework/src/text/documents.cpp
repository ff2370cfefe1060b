#include "text/documents.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "text/utf8.h"
#include "ztrain/error.h"

namespace ztrain::text {
namespace {

bool json_lines(const std::string& file) {
  for (const char* ext : {".jsonl", ".ndjson"})
    if (file.size() >= std::string(ext).size() &&
        file.compare(file.size() - std::string(ext).size(), std::string::npos, ext) == 0)
      return true;
  return false;
}

// U+FFFD characters in `s` (as UTF-8).
std::uint64_t replacement_chars(const std::string& s) {
  std::uint64_t n = 0;
  for (std::size_t at = 0; (at = s.find("\xEF\xBF\xBD", at)) != std::string::npos; at += 3) ++n;
  return n;
}

}  // namespace

DocumentReader::DocumentReader(std::vector<std::string> files, DocumentOptions options)
    : files_(std::move(files)), options_(std::move(options)) {}

bool DocumentReader::open_next() {
  if (file_ >= files_.size()) return false;
  in_ = std::ifstream(files_[file_], std::ios::binary);
  if (!in_) throw DataError("cannot read '" + files_[file_] + "'");
  lines_ = json_lines(files_[file_]);
  line_ = offset_ = 0;
  ++file_;
  return true;
}

std::optional<std::string> DocumentReader::next() {
  while (auto doc = next_any()) {
    if (!doc->empty()) return doc;
    ++empty_;
  }
  return std::nullopt;
}

std::string DocumentReader::checked_utf8(std::string bytes, std::uint64_t offset,
                                         std::uint64_t line) {
  const auto bad = first_invalid_utf8(bytes);
  if (!bad) return bytes;
  if (options_.replace_invalid_utf8) {
    std::string text = lossy_utf8(bytes);
    replaced_ += replacement_chars(text) - replacement_chars(bytes);
    return text;
  }
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned char>(bytes[*bad]));
  throw DataError(files_[file_ - 1] + (line ? ":" + std::to_string(line) : std::string()) +
                  ": byte " + std::to_string(offset + *bad) + " of the file (" + byte +
                  ") is not UTF-8 text: prepare reads text as the tokenizers package does (a "
                  "binary file or another encoding?); convert it to UTF-8, or pass "
                  "--replace-invalid-utf8 to read each invalid sequence as U+FFFD");
}

std::optional<std::string> DocumentReader::next_any() {
  while (true) {
    if (!in_.is_open() && !open_next()) return std::nullopt;
    if (!lines_) {
      std::ostringstream all;
      all << in_.rdbuf();
      in_.close();
      std::string text = all.str();
      bytes_ += text.size();
      return checked_utf8(std::move(text), 0, 0);
    }
    std::string line;
    if (!std::getline(in_, line)) {
      in_.close();
      continue;
    }
    ++line_;
    const std::uint64_t at = offset_;
    offset_ += line.size() + 1;
    bytes_ += line.size() + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    line = checked_utf8(std::move(line), at, line_);
    const std::string where = files_[file_ - 1] + ":" + std::to_string(line_);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(where + ": not a JSON object: " + e.what());
    }
    const std::string& field = options_.field;
    const auto it = j.is_object() ? j.find(field) : j.end();
    if (it == j.end())
      throw DataError(where + ": no \"" + field +
                      "\" field; name the documents' field with --text-field");
    if (!it->is_string())
      throw DataError(where + ": \"" + field + "\" is " + std::string(it->type_name()) +
                      ", not a string");
    return it->get<std::string>();
  }
}

}  // namespace ztrain::text
