#include "text/documents.h"

#include <nlohmann/json.hpp>
#include <sstream>

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

}  // namespace

DocumentReader::DocumentReader(std::vector<std::string> files, std::string field)
    : files_(std::move(files)), field_(std::move(field)) {}

bool DocumentReader::open_next() {
  if (file_ >= files_.size()) return false;
  in_ = std::ifstream(files_[file_], std::ios::binary);
  if (!in_) throw DataError("cannot read '" + files_[file_] + "'");
  lines_ = json_lines(files_[file_]);
  line_ = 0;
  ++file_;
  return true;
}

std::optional<std::string> DocumentReader::next() {
  while (true) {
    if (!in_.is_open() && !open_next()) return std::nullopt;
    if (!lines_) {
      std::ostringstream all;
      all << in_.rdbuf();
      in_.close();
      bytes_ += static_cast<std::uint64_t>(all.tellp());
      return all.str();
    }
    std::string line;
    if (!std::getline(in_, line)) {
      in_.close();
      continue;
    }
    ++line_;
    bytes_ += line.size() + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = files_[file_ - 1] + ":" + std::to_string(line_);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(where + ": not a JSON object: " + e.what());
    }
    const auto it = j.is_object() ? j.find(field_) : j.end();
    if (it == j.end())
      throw DataError(where + ": no \"" + field_ +
                      "\" field; name the documents' field with --text-field");
    if (!it->is_string())
      throw DataError(where + ": \"" + field_ + "\" is " + std::string(it->type_name()) +
                      ", not a string");
    return it->get<std::string>();
  }
}

}  // namespace ztrain::text
