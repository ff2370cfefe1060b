#include "text/hf_tokenizer.h"

#include <algorithm>

namespace ztrain::text {

HfTokenizer::HfTokenizer(TokenizerParts parts) : parts_(std::move(parts)) {
  for (AddedToken& a : parts_.added) {
    names_.emplace(a.content, a.id);
    if (a.normalized && parts_.normalizer) parts_.normalizer(a.content);
  }
  std::int32_t top = -1;
  for (const auto& [token, id] : parts_.model->vocab()) top = std::max(top, id);
  for (const AddedToken& a : parts_.added) top = std::max(top, a.id);
  tokens_.resize(static_cast<std::size_t>(top + 1));
  for (const auto& [token, id] : parts_.model->vocab())
    tokens_[static_cast<std::size_t>(id)] = token;
  for (const AddedToken& a : parts_.added) tokens_[static_cast<std::size_t>(a.id)] = a.content;
  for (std::size_t i = 0; i < parts_.added.size(); ++i) {
    const AddedToken& a = parts_.added[i];
    if (!a.content.empty())
      starting_with_[a.normalized][static_cast<unsigned char>(a.content[0])].push_back(i);
  }
  for (auto& kind : starting_with_)
    for (auto& list : kind)
      std::stable_sort(list.begin(), list.end(), [&](std::size_t x, std::size_t y) {
        return parts_.added[x].content.size() > parts_.added[y].content.size();
      });
}

std::optional<std::int32_t> HfTokenizer::token_id(const std::string& token) const {
  if (const auto it = names_.find(token); it != names_.end()) return it->second;
  return parts_.model->id(token);
}

// The added tokens of one kind (raw or normalized) cut out of `text`:
// at each position the longest token that starts there, the leftmost
// position first; the text between them stays text. Only the tokens
// starting with the position's byte are tried (a Llama 3 file has 256
// added tokens; prepare runs this over every byte of the corpus).
std::vector<HfTokenizer::Segment> HfTokenizer::split_added(std::string text, bool at_start,
                                                           bool normalized) const {
  std::vector<Segment> out;
  std::size_t from = 0;
  for (std::size_t at = 0; at < text.size();) {
    const AddedToken* best = nullptr;
    for (const std::size_t i : starting_with_[normalized][static_cast<unsigned char>(text[at])])
      if (text.compare(at, parts_.added[i].content.size(), parts_.added[i].content) == 0) {
        best = &parts_.added[i];
        break;
      }
    if (!best) {
      ++at;
      continue;
    }
    if (at > from)
      out.push_back({text.substr(from, at - from), std::nullopt, at_start && from == 0});
    out.push_back({best->content, best->id, false});
    at += best->content.size();
    from = at;
  }
  if (from < text.size()) out.push_back({text.substr(from), std::nullopt, at_start && from == 0});
  return out;
}

void HfTokenizer::encode_segment(const Segment& s, std::vector<std::int32_t>& out) const {
  if (s.added) {
    out.push_back(*s.added);
    return;
  }
  std::vector<Piece> pieces{{s.text, s.at_start}};
  if (parts_.pre) parts_.pre(pieces);
  for (const Piece& p : pieces) parts_.model->encode_word(p.text, out);
}

std::vector<std::int32_t> HfTokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> ids;
  for (Segment& raw : split_added(std::string(text), true, false)) {
    if (raw.added) {
      encode_segment(raw, ids);
      continue;
    }
    if (parts_.normalizer) parts_.normalizer(raw.text);
    for (const Segment& s : split_added(std::move(raw.text), raw.at_start, true))
      if (!s.text.empty()) encode_segment(s, ids);
  }
  return ids;
}

std::string HfTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::vector<std::string> tokens;
  for (const std::int32_t id : ids)
    if (id >= 0 && static_cast<std::size_t>(id) < tokens_.size())
      tokens.push_back(tokens_[static_cast<std::size_t>(id)]);
  if (parts_.decoder) parts_.decoder(tokens);
  std::string text;
  for (const std::string& t : tokens) text += t;
  return text;
}

}  // namespace ztrain::text
