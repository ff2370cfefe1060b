// Regex: a compiled PCRE2 pattern with Unicode classes (\p{L}, \s as
// Unicode white space), for the pre-tokenizers' split patterns, which
// Hugging Face writes for Oniguruma and which PCRE2 reads alike.
//
// Ownership: owns the compiled code (freed on destruction); move-only.
// Thread safety: matches() may run on several threads at once (each call
// has its own match data). Errors: ConfigError naming `where` and the
// pattern's fault at construction.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ztrain::text {

class Regex {
 public:
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Every non-overlapping match in `s`, left to right: [begin, end) byte
  // offsets. An empty match advances one character.
  std::vector<std::pair<std::size_t, std::size_t>> matches(std::string_view s) const;

 private:
  struct Code;
  std::unique_ptr<Code> code_;
};

}  // namespace ztrain::text
