#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/regex.h"

#include <pcre2.h>

#include "text/utf8.h"
#include "ztrain/error.h"

namespace ztrain::text {

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern, const std::string& where)
    : code_(std::make_unique<Code>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (!code_->code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    throw ConfigError(where + ": the pattern /" + pattern + "/ does not compile at offset " +
                      std::to_string(offset) + ": " + reinterpret_cast<const char*>(message));
  }
  pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE);  // where JIT is missing, matching still works
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

std::vector<std::pair<std::size_t, std::size_t>> Regex::matches(std::string_view s) const {
  std::vector<std::pair<std::size_t, std::size_t>> found;
  const std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> data(
      pcre2_match_data_create_from_pattern(code_->code, nullptr), pcre2_match_data_free);
  std::size_t at = 0;
  while (at <= s.size()) {
    const int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), at, 0,
                               data.get(), nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* v = pcre2_get_ovector_pointer(data.get());
    if (v[1] == v[0]) {  // empty: step over one character
      if (v[0] >= s.size()) break;
      at = v[0] + utf8_length(s, v[0]);
      continue;
    }
    found.emplace_back(v[0], v[1]);
    at = v[1];
  }
  return found;
}

}  // namespace ztrain::text
