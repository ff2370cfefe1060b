// DocumentReader: the documents of a corpus, in order, for `ztrain
// prepare`. A .jsonl (or .ndjson) file holds one document per line, the
// string under `field` of each line's object; any other file is one
// document, its whole text. Files come in the order given (globs expanded
// in name order, ztrain/file_list.h), each read once as a stream. An empty
// document (an empty file, an empty string) is skipped and counted: it
// holds nothing to train on.
//
// Text is UTF-8, as the `tokenizers` package and Python's open() read it.
// Bytes that are not (a binary file, a Latin-1 text) are refused naming
// the file and the first bad byte's offset, or, with
// `replace_invalid_utf8`, each invalid sequence becomes U+FFFD, as
// Python's errors="replace" makes it.
//
// Errors: DataError naming file and line (a line that is not a JSON
// object, lacks the field or holds a non-string there; bytes that are not
// UTF-8; a file that cannot be read). Thread safety: one thread.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace ztrain::text {

struct DocumentOptions {
  std::string field = "text";  // of a JSON line's object
  bool replace_invalid_utf8 = false;
};

class DocumentReader {
 public:
  DocumentReader(std::vector<std::string> files, DocumentOptions options);

  // The next non-empty document, or nullopt after the last.
  std::optional<std::string> next();
  // Bytes read so far (of the files' contents).
  std::uint64_t bytes_read() const { return bytes_; }
  // Empty documents skipped so far.
  std::uint64_t empty_documents() const { return empty_; }
  // Invalid UTF-8 sequences replaced so far.
  std::uint64_t replaced_sequences() const { return replaced_; }

 private:
  bool open_next();
  std::optional<std::string> next_any();
  // `bytes`, which start at `offset` of the open file (on `line`, 0 for a
  // whole file), as UTF-8: refused or repaired.
  std::string checked_utf8(std::string bytes, std::uint64_t offset, std::uint64_t line);

  std::vector<std::string> files_;
  DocumentOptions options_;
  std::size_t file_ = 0;  // the next file to open
  std::ifstream in_;
  bool lines_ = false;  // the open file is JSON lines
  std::uint64_t line_ = 0, offset_ = 0, bytes_ = 0, empty_ = 0, replaced_ = 0;
};

}  // namespace ztrain::text
