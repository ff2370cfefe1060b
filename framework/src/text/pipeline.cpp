#include "text/pipeline.h"

#include <cctype>
#include <cstdlib>

#include "text/utf8.h"

namespace ztrain::text {
namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  std::size_t at = 0;
  for (std::size_t hit; (hit = s.find(from, at)) != std::string::npos; at = hit + from.size())
    out.append(s, at, hit - at).append(to);
  out.append(s, at, std::string::npos);
  s = std::move(out);
}

// One piece cut at `cuts` ([begin, end) matches), kept as `behavior` says;
// only the first part of a piece keeps its at_start.
void cut(const Piece& p, const std::vector<std::pair<std::size_t, std::size_t>>& cuts,
         SplitBehavior behavior, std::vector<Piece>& out) {
  std::vector<std::string> parts;
  std::size_t at = 0;
  std::string carry;  // merged_with_previous: nothing; merged_with_next: the match waiting
  for (const auto& [b, e] : cuts) {
    std::string gap = p.text.substr(at, b - at), match = p.text.substr(b, e - b);
    switch (behavior) {
      case SplitBehavior::isolated:
        parts.push_back(std::move(gap));
        parts.push_back(std::move(match));
        break;
      case SplitBehavior::removed:
        parts.push_back(std::move(gap));
        break;
      case SplitBehavior::merged_with_previous:
        parts.push_back(gap + match);
        break;
      case SplitBehavior::merged_with_next:
        parts.push_back(carry + gap);
        carry = std::move(match);
        break;
    }
    at = e;
  }
  parts.push_back(carry + p.text.substr(at));
  bool first = true;
  for (std::string& part : parts) {
    if (part.empty()) continue;
    out.push_back({std::move(part), p.at_start && first});
    first = false;
  }
}

bool is_byte_token(const std::string& t) {
  return t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
         std::isxdigit(static_cast<unsigned char>(t[3])) &&
         std::isxdigit(static_cast<unsigned char>(t[4]));
}

}  // namespace

Normalize prepend_normalizer(std::string s) {
  return [s = std::move(s)](std::string& text) {
    if (!text.empty()) text.insert(0, s);
  };
}

Normalize replace_normalizer(std::string from, std::string to) {
  return [from = std::move(from), to = std::move(to)](std::string& text) {
    replace_all(text, from, to);
  };
}

Normalize sequence_normalizer(std::vector<Normalize> steps) {
  return [steps = std::move(steps)](std::string& text) {
    for (const auto& step : steps) step(text);
  };
}

PreTokenize split_pre_tokenizer(std::shared_ptr<const Regex> pattern, SplitBehavior behavior) {
  return [pattern = std::move(pattern), behavior](std::vector<Piece>& pieces) {
    std::vector<Piece> out;
    for (const Piece& p : pieces) cut(p, pattern->matches(p.text), behavior, out);
    pieces = std::move(out);
  };
}

const std::string& gpt2_pattern() {
  static const std::string pattern =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  return pattern;
}

PreTokenize byte_level_pre_tokenizer(bool add_prefix_space, std::shared_ptr<const Regex> gpt2) {
  return [add_prefix_space, gpt2 = std::move(gpt2)](std::vector<Piece>& pieces) {
    std::vector<Piece> out;
    for (Piece p : pieces) {
      if (add_prefix_space && p.text.rfind(' ', 0) != 0) p.text.insert(0, " ");
      if (gpt2)
        cut(p, gpt2->matches(p.text), SplitBehavior::isolated, out);
      else
        out.push_back(std::move(p));
    }
    for (Piece& p : out) p.text = byte_level(p.text);
    pieces = std::move(out);
  };
}

PreTokenize metaspace_pre_tokenizer(std::string replacement, std::string scheme, bool split) {
  return [replacement = std::move(replacement), scheme = std::move(scheme),
          split](std::vector<Piece>& pieces) {
    std::vector<Piece> out;
    for (Piece p : pieces) {
      replace_all(p.text, " ", replacement);
      const bool prepend = scheme == "always" || (scheme == "first" && p.at_start);
      if (prepend && p.text.rfind(replacement, 0) != 0) p.text.insert(0, replacement);
      if (!split) {
        out.push_back(std::move(p));
        continue;
      }
      std::vector<std::pair<std::size_t, std::size_t>> cuts;
      for (std::size_t at = p.text.find(replacement); at != std::string::npos;
           at = p.text.find(replacement, at + replacement.size()))
        cuts.emplace_back(at, at + replacement.size());
      cut(p, cuts, SplitBehavior::merged_with_next, out);
    }
    pieces = std::move(out);
  };
}

PreTokenize sequence_pre_tokenizer(std::vector<PreTokenize> steps) {
  return [steps = std::move(steps)](std::vector<Piece>& pieces) {
    for (const auto& step : steps) step(pieces);
  };
}

// A token whose every character is a ByteLevel byte is those bytes; one
// with another character (an added token's own text) is its UTF-8 as is.
Decode byte_level_decoder() {
  return [](std::vector<std::string>& tokens) {
    std::string bytes;
    for (const std::string& t : tokens) {
      std::string mine;
      bool all = true;
      for (std::size_t at = 0; at < t.size() && all; at += utf8_length(t, at)) {
        const int b = char_byte(code_point(t, at));
        all = b >= 0;
        mine += static_cast<char>(b);
      }
      bytes += all ? mine : t;
    }
    tokens = {lossy_utf8(bytes)};
  };
}

Decode replace_decoder(std::string from, std::string to) {
  return [from = std::move(from), to = std::move(to)](std::vector<std::string>& tokens) {
    for (std::string& t : tokens) replace_all(t, from, to);
  };
}

// Runs of <0xXX> tokens become their bytes when those are valid UTF-8, else
// one U+FFFD per byte (Hugging Face's ByteFallback).
Decode byte_fallback_decoder() {
  return [](std::vector<std::string>& tokens) {
    std::vector<std::string> out;
    std::string bytes;
    std::size_t count = 0;
    const auto flush = [&] {
      if (count == 0) return;
      if (lossy_utf8(bytes) == bytes) {
        out.push_back(bytes);
      } else {
        for (std::size_t i = 0; i < count; ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      bytes.clear();
      count = 0;
    };
    for (std::string& t : tokens) {
      if (is_byte_token(t)) {
        bytes += static_cast<char>(std::strtol(t.substr(3, 2).c_str(), nullptr, 16));
        ++count;
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    tokens = std::move(out);
  };
}

Decode fuse_decoder() {
  return [](std::vector<std::string>& tokens) {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens = {all};
  };
}

Decode strip_decoder(std::string content, std::size_t start, std::size_t stop) {
  return [content = std::move(content), start, stop](std::vector<std::string>& tokens) {
    for (std::string& t : tokens) {
      for (std::size_t i = 0; i < start && t.rfind(content, 0) == 0; ++i)
        t.erase(0, content.size());
      for (std::size_t i = 0; i < stop && t.size() >= content.size() &&
                              t.compare(t.size() - content.size(), content.size(), content) == 0;
           ++i)
        t.erase(t.size() - content.size());
    }
  };
}

// As Hugging Face's: in the first token every replacement character goes
// (not only a leading one) unless the scheme is "never"; in the others
// each becomes a space.
Decode metaspace_decoder(std::string replacement, bool drop_in_first) {
  return [replacement = std::move(replacement), drop_in_first](std::vector<std::string>& tokens) {
    for (std::size_t i = 0; i < tokens.size(); ++i)
      replace_all(tokens[i], replacement, i == 0 && drop_in_first ? "" : " ");
  };
}

Decode sequence_decoder(std::vector<Decode> steps) {
  return [steps = std::move(steps)](std::vector<std::string>& tokens) {
    for (const auto& step : steps) step(tokens);
  };
}

}  // namespace ztrain::text
