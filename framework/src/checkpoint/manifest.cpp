// Reading a manifest checks what a resume relies on before any byte of
// state is read: each piece lies inside the declared size of its file,
// carries one checksum per block, and the pieces of each array of each
// parameter, sorted by first element, follow one another from 0 to the
// parameter's size with no gap and no overlap. A rank file that is listed
// but whose pieces are missing, or a manifest edited by hand, fails here
// with the parameter and range named.
#include "checkpoint/manifest.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "ztrain/error.h"

namespace ztrain {
namespace {

using json = nlohmann::json;

json piece_json(std::optional<ParamId> p, const StatePiece& s) {
  json j = {{"array", std::string(state_array_name(s.array))},
            {"file", s.file},
            {"first", s.first},
            {"count", s.count},
            {"offset", s.offset},
            {"crc32c", s.crcs}};
  if (p) j["param"] = index_of(*p);
  return j;
}

StateArray array_of(const std::string& name, const std::string& where) {
  for (std::size_t a = 0; a < kStateArrayCount; ++a)
    if (state_array_name(static_cast<StateArray>(a)) == name) return static_cast<StateArray>(a);
  throw DataError(where + ": unknown state array '" + name + "' (expected master, m or v)");
}

StatePiece piece_of(const json& j, const std::string& where) {
  StatePiece s;
  s.array = array_of(j.at("array").get<std::string>(), where);
  s.file = j.at("file").get<int>();
  s.first = j.at("first").get<std::uint64_t>();
  s.count = j.at("count").get<std::uint64_t>();
  s.offset = j.at("offset").get<std::uint64_t>();
  s.crcs = j.at("crc32c").get<std::vector<std::uint32_t>>();
  return s;
}

std::uint64_t blocks(std::uint64_t count) {
  return (count + kBlockElements - 1) / kBlockElements;
}

void check_tiling(const Manifest& m, const std::string& where) {
  for (const ParamState& p : m.params) {
    if (p.frozen && !p.pieces.empty())
      throw DataError(where + ": frozen parameter " + p.name +
                      " has state pieces; the checkpoint was edited");
    if (p.frozen) continue;
    for (std::size_t a = 0; a < kStateArrayCount; ++a) {
      std::vector<const StatePiece*> pieces;
      for (const auto& s : p.pieces)
        if (static_cast<std::size_t>(s.array) == a) pieces.push_back(&s);
      std::sort(pieces.begin(), pieces.end(),
                [](const StatePiece* x, const StatePiece* y) { return x->first < y->first; });
      std::uint64_t next = 0;
      const std::string array(state_array_name(static_cast<StateArray>(a)));
      for (const StatePiece* s : pieces) {
        if (s->first != next)
          throw DataError(where + ": " + p.name + "'s " + array + " has " +
                          (s->first > next
                               ? "no piece for elements [" + std::to_string(next) + ", " +
                                     std::to_string(s->first) + ")"
                               : "overlapping pieces at element " + std::to_string(s->first)) +
                          "; the checkpoint is incomplete or was edited");
        next = s->first + s->count;
      }
      if (next != p.numel())
        throw DataError(where + ": " + p.name + "'s " + array + " has no piece for elements [" +
                        std::to_string(next) + ", " + std::to_string(p.numel()) +
                        "); the checkpoint is incomplete or was edited");
    }
  }
}

}  // namespace

std::uint64_t ParamState::numel() const {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

std::string manifest_json(const Manifest& m) {
  json config = json::object();
  for (const auto& [k, v] : m.config) config[k] = v;
  json files = json::array(), params = json::array();
  for (const auto& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}});
  for (const auto& p : m.params) {
    json pieces = json::array();
    for (const auto& s : p.pieces) pieces.push_back(piece_json(std::nullopt, s));
    json param = {{"name", p.name}, {"shape", p.shape}, {"dtype", "F32"}, {"pieces", pieces}};
    if (p.frozen) param["frozen"] = true;  // absent: trained, as every checkpoint before LoRA
    params.push_back(std::move(param));
  }
  const auto& pos = m.position;
  const json j = {
      {"format", "ztrain-checkpoint"},
      {"format_version", kCheckpointFormat},
      {"ztrain_version", m.ztrain_version},
      {"world", m.world},
      {"strategy", m.strategy},
      {"precision", m.precision},
      {"position",
       {{"step", pos.step}, {"applied_steps", pos.applied}, {"skipped_steps", pos.skipped}}},
      {"data",
       {{"global_batch_size", m.global_batch},
        {"sequences_read", pos.step * m.global_batch},
        {"micro_steps_per_rank", pos.step * m.grad_accum},
        {"grad_accum", m.grad_accum}}},
      {"rng",
       {{"init_seed", m.seed},
        {"data_seed", m.data_seed},
        {"streams",
         "none advance in training: initial values and data order are functions of "
         "the seeds and the position"}}},
      {"loss_scaler",
       {{"scale", pos.scaler.scale},
        {"hysteresis_left", pos.scaler.hysteresis},
        {"iter", pos.scaler.iter},
        {"last_overflow", pos.scaler.last_overflow}}},
      {"block_elements", kBlockElements},
      {"config", config},
      {"config_toml", m.config_toml},
      {"files", files},
      {"params", params}};
  return j.dump(1) + "\n";
}

Manifest parse_manifest(const std::string& text, const std::filesystem::path& where) {
  const std::string w = where.string();
  Manifest m;
  try {
    const json j = json::parse(text);
    if (!j.is_object() || !j.contains("format") || j.at("format") != "ztrain-checkpoint")
      throw DataError(w + ": not a ztrain checkpoint manifest");
    const int version = j.at("format_version").get<int>();
    if (version != kCheckpointFormat)
      throw DataError(w + ": checkpoint format " + std::to_string(version) +
                      "; this ztrain reads format " + std::to_string(kCheckpointFormat));
    if (j.at("block_elements").get<std::uint64_t>() != kBlockElements)
      throw DataError(w + ": checksum blocks of " + j.at("block_elements").dump() +
                      " elements; this ztrain writes and reads " + std::to_string(kBlockElements));
    m.ztrain_version = j.at("ztrain_version").get<std::string>();
    m.world = j.at("world").get<int>();
    m.strategy = j.at("strategy").get<std::string>();
    m.precision = j.at("precision").get<std::string>();
    const json& pos = j.at("position");
    m.position.step = pos.at("step").get<std::int64_t>();
    m.position.applied = pos.at("applied_steps").get<std::int64_t>();
    m.position.skipped = pos.at("skipped_steps").get<std::int64_t>();
    const json& sc = j.at("loss_scaler");
    m.position.scaler = {sc.at("scale").get<double>(), sc.at("hysteresis_left").get<std::int64_t>(),
                         sc.at("iter").get<std::int64_t>(),
                         sc.at("last_overflow").get<std::int64_t>()};
    m.global_batch = j.at("data").at("global_batch_size").get<std::int64_t>();
    m.grad_accum = j.at("data").at("grad_accum").get<std::int64_t>();
    m.seed = j.at("rng").at("init_seed").get<std::uint64_t>();
    m.data_seed = j.at("rng").at("data_seed").get<std::uint64_t>();
    for (const auto& [k, v] : j.at("config").items())
      m.config.emplace_back(k, v.get<std::string>());
    m.config_toml = j.at("config_toml").get<std::string>();
    for (const auto& f : j.at("files"))
      m.files.push_back({f.at("name").get<std::string>(), f.at("bytes").get<std::uint64_t>()});
    for (const auto& p : j.at("params")) {
      ParamState ps;
      ps.name = p.at("name").get<std::string>();
      ps.shape = p.at("shape").get<std::vector<std::int64_t>>();
      std::uint64_t n = 1;
      for (auto d : ps.shape) {
        if (d < 0 || d > (std::int64_t{1} << 40) ||
            (d > 0 && n > (std::uint64_t{1} << 50) / static_cast<std::uint64_t>(d)))
          throw DataError(w + ": parameter " + ps.name + " has an impossible shape");
        n *= static_cast<std::uint64_t>(d);
      }
      ps.frozen = p.value("frozen", false);
      for (const auto& s : p.at("pieces")) ps.pieces.push_back(piece_of(s, w));
      m.params.push_back(std::move(ps));
    }
  } catch (const json::exception& e) {
    throw DataError(w + ": malformed checkpoint manifest (" + e.what() + ")");
  }
  check_manifest(m, w);
  return m;
}

void check_manifest(const Manifest& m, const std::string& w) {
  if (m.world < 1 || m.position.step < 0 || m.position.applied < 0 || m.position.skipped < 0 ||
      m.position.applied + m.position.skipped != m.position.step)
    throw DataError(w + ": inconsistent world size or position in the manifest");
  for (const ParamState& p : m.params)
    for (const StatePiece& s : p.pieces) {
      const bool in_file =
          s.file >= 0 && static_cast<std::size_t>(s.file) < m.files.size() &&
          s.count <= (std::uint64_t{1} << 60) / 4 &&
          s.offset <= m.files[static_cast<std::size_t>(s.file)].bytes &&
          s.count * 4 <= m.files[static_cast<std::size_t>(s.file)].bytes - s.offset;
      if (!in_file || s.crcs.size() != blocks(s.count))
        throw DataError(w + ": a piece of " + p.name + "'s " +
                        std::string(state_array_name(s.array)) +
                        " lies outside its file or lacks checksums; the manifest is corrupt");
    }
  check_tiling(m, w);
}

std::string pieces_json(const std::vector<std::pair<ParamId, StatePiece>>& pieces) {
  json j = json::array();
  for (const auto& [p, s] : pieces) j.push_back(piece_json(p, s));
  return j.dump();
}

std::vector<std::pair<ParamId, StatePiece>> parse_pieces(const std::string& text,
                                                         const std::filesystem::path& where) {
  std::vector<std::pair<ParamId, StatePiece>> out;
  try {
    for (const auto& j : json::parse(text))
      out.emplace_back(id_at<ParamId>(j.at("param").get<std::size_t>()),
                       piece_of(j, where.string()));
  } catch (const json::exception& e) {
    throw DataError(where.string() + ": malformed piece list (" + e.what() + ")");
  }
  return out;
}

}  // namespace ztrain
