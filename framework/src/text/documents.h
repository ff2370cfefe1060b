// DocumentReader: the documents of a corpus, in order, for `ztrain
// prepare`. A .jsonl (or .json lines) file holds one document per line,
// the string under `field` of each line's object; any other file is one
// document, its whole text. Files come in the order given (globs expanded
// in name order, ztrain/file_list.h), each read once as a stream.
//
// Errors: DataError naming file and line (a line that is not a JSON
// object, lacks the field or holds a non-string there; a file that cannot
// be read). Thread safety: one thread.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace ztrain::text {

class DocumentReader {
 public:
  DocumentReader(std::vector<std::string> files, std::string field);

  // The next document, or nullopt after the last.
  std::optional<std::string> next();
  // Bytes read so far (of the files' contents).
  std::uint64_t bytes_read() const { return bytes_; }

 private:
  bool open_next();

  std::vector<std::string> files_;
  std::string field_;
  std::size_t file_ = 0;  // the next file to open
  std::ifstream in_;
  bool lines_ = false;  // the open file is JSON lines
  std::uint64_t line_ = 0, bytes_ = 0;
};

}  // namespace ztrain::text
