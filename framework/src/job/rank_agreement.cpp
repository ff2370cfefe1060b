// Installations and files (data, initial weights) are compared by a
// digest (FNV-1a) of every part's name and id (a CRC and version, or a
// size and sampled CRC): the digests are all-gathered first, and only when
// they differ do the ranks all-gather the parts with their files and hosts,
// so each rank finds the same first difference and raises the same error.
// Both travel as the bits of fp32 elements, which an all-gather copies
// untouched.
#include "job/rank_agreement.h"
#include "core/host_name.h"

#include <unistd.h>

#include <algorithm>
#include <boost/dll/runtime_symbol_info.hpp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "io/crc32c.h"
#include "io/durable_file.h"
#include "loader/plugin_loader.h"
#include "ztrain/error.h"
#include "ztrain/plugin.h"
#include "ztrain/version.h"

namespace ztrain {
namespace {

// FNV-1a over (name, value) pairs in name order, a separator after each.
std::uint64_t digest_of(const std::map<std::string, std::string>& pairs) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& [name, value] : pairs)
    for (const std::string* t : {&name, &value}) {
      for (unsigned char c : *t) h = (h ^ c) * 1099511628211ull;
      h = (h ^ 0xff) * 1099511628211ull;
    }
  return h;
}

// Texts travel as records: one per line, fields separated by \x1f.
void add_record(std::string& text, std::initializer_list<std::string> fields) {
  for (const std::string& f : fields) text += f + '\x1f';
  text.back() = '\n';
}

std::vector<std::vector<std::string>> records(const std::string& text) {
  std::vector<std::vector<std::string>> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string>& f = out.emplace_back();
    std::size_t at = 0;
    for (std::size_t next; (next = line.find('\x1f', at)) != std::string::npos; at = next + 1)
      f.push_back(line.substr(at, next - at));
    f.push_back(line.substr(at));
  }
  return out;
}

// Every rank's 64-bit digest, through an all-gather of two fp32 elements.
std::vector<std::uint64_t> gather_digests(std::uint64_t mine, Communicator& comm) {
  float packed[2];
  std::memcpy(packed, &mine, sizeof mine);
  std::vector<float> all(2 * static_cast<std::size_t>(comm.size()));
  comm.all_gather_async(packed, all.data(), 2, DType::f32).wait();
  std::vector<std::uint64_t> digests(static_cast<std::size_t>(comm.size()));
  std::memcpy(digests.data(), all.data(), all.size() * sizeof(float));
  return digests;
}

// Rank 0's text and that of the first rank whose digest differs from rank
// 0's, with its rank (the same answer on every rank); nullopt when all
// digests agree. The texts travel only then.
struct Unlike {
  std::string first, theirs;
  std::size_t rank = 0;
};
std::optional<Unlike> unlike_rank_0(std::uint64_t digest, const std::string& text,
                                    Communicator& comm) {
  const std::vector<std::uint64_t> digests = gather_digests(digest, comm);
  std::size_t other = 0;
  for (std::size_t r = 1; r < digests.size() && !other; ++r)
    if (digests[r] != digests[0]) other = r;
  if (!other) return std::nullopt;
  auto texts = every_rank_text(text, comm);
  return Unlike{std::move(texts[0]), std::move(texts[other]), other};
}

// One thing every rank must have alike: `part` names it, `id` must be
// equal, `file` is where this rank has it (for the message only).
struct AgreedPart {
  std::string part, id, file;
};

std::string crc_hex(std::uint32_t crc) {
  char text[16];
  std::snprintf(text, sizeof text, "%08x", crc);
  return text;
}

// A file's identity without reading all of it: its size and a
// CRC-32C of 16 blocks of 64 KiB spread evenly from its start to its end
// (the whole file when smaller). A file on a shared file system is read
// by every rank, so this costs 1 MiB per file and rank.
std::string sampled_digest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::error_code ec;
  const std::uint64_t size = std::filesystem::file_size(path, ec);
  if (!in || ec)
    throw DataError("cannot read '" + path + "' on host " + host_name() + ": " +
                    (ec ? ec.message() : std::string("unreadable")));
  constexpr std::uint64_t kBlock = 64 * 1024, kBlocks = 16;
  std::vector<char> block(kBlock);
  std::uint32_t crc = 0;
  for (std::uint64_t k = 0; k < kBlocks; ++k) {
    const std::uint64_t at = size > kBlock ? (size - kBlock) * k / (kBlocks - 1) : 0;
    in.seekg(static_cast<std::streamoff>(at));
    in.read(block.data(), static_cast<std::streamsize>(std::min(kBlock, size)));
    crc = crc32c(block.data(), static_cast<std::size_t>(in.gcount()), crc);
    if (size <= kBlock) break;
  }
  return std::to_string(size) + " bytes, sampled crc32c " + crc_hex(crc);
}

// One record per part: part, id, file, host; part and id must agree.
std::string parts_text(const std::vector<AgreedPart>& parts) {
  const std::string host = host_name();
  std::string text;
  for (const AgreedPart& p : parts) add_record(text, {p.part, p.id, p.file, host});
  return text;
}

struct Held {
  std::string id, file, host;
};

std::map<std::string, Held> parse_parts(const std::string& text) {
  std::map<std::string, Held> parts;
  for (const auto& f : records(text))
    if (f.size() == 4) parts[f[0]] = {f[1], f[2], f[3]};
  return parts;
}

std::uint64_t parts_digest(const std::vector<AgreedPart>& parts) {
  std::map<std::string, std::string> ids;
  for (const AgreedPart& p : parts) ids[p.part] = p.id;
  return digest_of(ids);
}

// E on every rank, naming the first part that differs between rank 0 and
// the first rank unlike it: "<differ>: <part> is ... on rank 0 (host a)
// but ... on rank r (host b); <fix>".
template <class E>
void check_parts_agree(const std::vector<AgreedPart>& mine, const std::string& differ,
                       const std::string& fix, Communicator& comm) {
  if (comm.size() == 1) return;
  const auto unlike = unlike_rank_0(parts_digest(mine), parts_text(mine), comm);
  if (!unlike) return;
  const std::size_t other = unlike->rank;
  const auto first = parse_parts(unlike->first), theirs = parse_parts(unlike->theirs);
  const auto said = [](const std::map<std::string, Held>& parts, const std::string& part,
                       std::size_t rank) {
    const auto it = parts.find(part);
    const std::string where = " on rank " + std::to_string(rank);
    if (it == parts.end()) return "absent" + where;
    return "'" + it->second.file + "' (" + it->second.id + ")" + where + " (host " +
           it->second.host + ")";
  };
  std::vector<std::string> names;
  for (const auto* parts : {&first, &theirs})
    for (const auto& [part, p] : *parts) names.push_back(part);
  for (const std::string& part : names) {
    const auto a = first.find(part), b = theirs.find(part);
    if (a != first.end() && b != theirs.end() && a->second.id == b->second.id) continue;
    throw E(differ + ": " + part + " is " + said(first, part, 0) + " but " +
            said(theirs, part, other) + "; " + fix);
  }
}

}  // namespace

std::vector<std::uint64_t> every_rank_count(std::uint64_t mine, Communicator& comm) {
  float packed[2];
  std::memcpy(packed, &mine, sizeof mine);
  std::vector<float> all(2 * static_cast<std::size_t>(comm.size()));
  comm.all_gather(packed, all.data(), 2, DType::f32);
  std::vector<std::uint64_t> counts(static_cast<std::size_t>(comm.size()));
  std::memcpy(counts.data(), all.data(), all.size() * sizeof(float));
  return counts;
}

std::vector<std::string> every_rank_text(const std::string& mine, Communicator& comm) {
  const auto world = static_cast<std::size_t>(comm.size());
  const std::vector<std::uint64_t> bytes = every_rank_count(mine.size(), comm);
  std::vector<std::size_t> counts(world);
  std::size_t total = 0;
  for (std::size_t r = 0; r < world; ++r) total += counts[r] = (bytes[r] + 3) / 4;
  std::vector<float> send(counts[static_cast<std::size_t>(comm.rank())], 0.0f), all(total);
  if (!mine.empty()) std::memcpy(send.data(), mine.data(), mine.size());
  comm.all_gather_v_async(send.data(), all.data(), counts, DType::f32).wait();
  std::vector<std::string> texts;
  std::size_t at = 0;
  for (std::size_t r = 0; r < world; ++r) {
    texts.emplace_back(reinterpret_cast<const char*>(all.data() + at), bytes[r]);
    at += counts[r];
  }
  return texts;
}

std::string rank_0_text(const std::string& text, Communicator& comm) {
  std::uint64_t length = text.size();
  float packed[2];
  std::memcpy(packed, &length, sizeof length);
  comm.broadcast(packed, 2, DType::f32, 0);
  std::memcpy(&length, packed, sizeof length);
  std::vector<float> words((length + 3) / 4, 0.0f);
  if (comm.rank() == 0) std::memcpy(words.data(), text.data(), text.size());
  comm.broadcast(words.data(), words.size(), DType::f32, 0);
  return std::string(reinterpret_cast<const char*>(words.data()), length);
}

void check_installations_agree(const std::vector<InstalledPart>& plugins, Communicator& comm) {
  if (comm.size() == 1) return;
  std::vector<InstalledPart> installed = {
      {"ztrain library", sdk_library_path(), std::string(ZTRAIN_VERSION) + ", " + host_build_id()},
      {"ztrain executable", boost::dll::program_location(), ZTRAIN_VERSION}};
  installed.insert(installed.end(), plugins.begin(), plugins.end());
  std::vector<AgreedPart> parts;
  for (const InstalledPart& p : installed) {
    // A part this rank does not have differs from rank 0's like any other,
    // rather than failing here alone while the others wait to compare.
    std::error_code ec;
    if (!std::filesystem::exists(p.file, ec)) {
      parts.push_back({p.part, "missing", p.file.string()});
      continue;
    }
    const std::string bytes = read_whole_file(p.file);
    parts.push_back(
        {p.part, "crc32c " + crc_hex(crc32c(bytes.data(), bytes.size())) + ", version " + p.version,
         p.file.string()});
  }
  check_parts_agree<PluginError>(parts, "the ranks run different builds",
                                 "install the same ztrain build and plugins on every host", comm);
}

void check_files_agree(const std::string& what, const std::vector<std::string>& files,
                       Communicator& comm) {
  if (comm.size() == 1) return;
  std::vector<AgreedPart> parts;
  for (std::size_t i = 0; i < files.size(); ++i) {
    // A file this rank cannot read differs from rank 0's like any other
    // (every rank then raises the same error), rather than failing here
    // alone while the others wait in the comparison.
    std::string id;
    try {
      id = sampled_digest(files[i]);
    } catch (const DataError& e) {
      id = std::string("unreadable: ") + e.what();
    }
    // Several files are told apart by name: a host whose pattern found
    // fewer files lacks the ones it did not find, not the n-th.
    parts.push_back({what + (files.size() > 1 ? " " + files[i] : ""), id, files[i]});
  }
  check_parts_agree<DataError>(parts, "the ranks read different files",
                               "give every host the same file (or one on a shared file system)",
                               comm);
}

bool any_rank(bool mine, Communicator& comm) {
  float count = mine ? 1.0f : 0.0f;
  if (comm.size() > 1) comm.all_reduce_async(&count, 1, DType::f32, ReduceOp::sum).wait();
  return count != 0.0f;
}

}  // namespace ztrain
