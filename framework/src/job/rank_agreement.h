// Every rank of a job must run the same build of ztrain and its plugins,
// and read the same data. (The configuration cannot differ: every rank
// runs rank 0's, job_start.h.) Ranks are started separately, on hosts
// that each have their own installation and files; when those differ, the
// ranks would compute different things and still exit 0.
//
// check_installations_agree compares what the ranks run: ztrain
// itself (version, toolchain, and a CRC-32C of the library's and the
// executable's bytes) and each plugin the run loaded (a CRC-32C of its
// file, its version). Hosts may install ztrain under different paths; the
// bytes must be the same. A difference raises the same PluginError on
// every rank, naming the part, both files and digests, and both hosts.
// check_files_agree compares files every rank reads (the data, initial
// weights) the same way, by size and a CRC-32C of blocks sampled across
// each file.
//
// stop_together makes the checks one rank (or one host) makes before
// training (or the parts of a checkpoint) stop every rank: each passes its
// own reason (empty: none), and when any rank has one, every rank raises
// the error, its own reason or `others` where it had none, instead of some
// ranks going on into collectives the refusing ones never join.
//
// Thread safety: collective; the training thread only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ztrain/comm.h"
#include "ztrain/error.h"

namespace ztrain {

// One part of what a rank runs: `part` names it ("strategy zero3"),
// `file` is where it was loaded from on this host.
struct InstalledPart {
  std::string part;
  std::filesystem::path file;
  std::string version;
};
// ztrain's own parts (library and executable) are added to `plugins`.
void check_installations_agree(const std::vector<InstalledPart>& plugins, Communicator& comm);
// Files every rank reads, `what` naming them ("data file"): the same size
// and sampled contents on every rank, else DataError naming both paths and
// hosts.
void check_files_agree(const std::string& what, const std::vector<std::string>& files,
                       Communicator& comm);
// Texts between ranks, as their 64-bit lengths and then their bytes, both
// as the bits of fp32 elements, which collectives copy untouched.
// rank_0_text: rank 0's `text` on every rank (the others' is not read);
// every_rank_text: every rank's, in rank order, on every rank.
std::string rank_0_text(const std::string& text, Communicator& comm);
std::vector<std::string> every_rank_text(const std::string& mine, Communicator& comm);
// every_rank_count: every rank's count, in rank order, on every rank,
// exact at any size (8 bytes each, gathered as two f32 elements: copied,
// not added).
std::vector<std::uint64_t> every_rank_count(std::uint64_t mine, Communicator& comm);
// Whether any rank passes true (every rank learns the same answer).
bool any_rank(bool mine, Communicator& comm);
// E: the error every rank raises (a refused configuration by default; a
// checkpoint that could not be written raises DataError).
template <class E = ConfigError>
void stop_together(const std::string& why, const std::string& others, Communicator& comm) {
  if (any_rank(!why.empty(), comm)) throw E(why.empty() ? others : why);
}

}  // namespace ztrain
