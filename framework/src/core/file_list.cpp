#include "ztrain/file_list.h"

#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>

#include "ztrain/error.h"

namespace ztrain {
namespace {

bool is_pattern(const std::string& entry) {
  return entry.find_first_of("*?[") != std::string::npos;
}

// The directory glob could not read, and why (glob's error callback takes
// no context: one per thread).
thread_local std::string unreadable_dir;
thread_local int unreadable_errno = 0;

int note_unreadable(const char* path, int error) {
  unreadable_dir = path;
  unreadable_errno = error;
  return 1;  // stop: GLOB_ERR's behaviour
}

// A pattern's regular files, in name order (glob sorts them).
std::vector<std::string> matches(const std::string& pattern, const std::string& where) {
  glob_t g{};
  unreadable_dir.clear();
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, note_unreadable, &g);
  const std::unique_ptr<glob_t, void (*)(glob_t*)> freed(&g, ::globfree);
  if (rc == GLOB_NOMATCH)
    throw DataError(where + ": '" + pattern + "' matches no file (from the working directory " +
                    std::filesystem::current_path().string() + ")");
  if (rc == GLOB_ABORTED && !unreadable_dir.empty())
    throw DataError(where + ": '" + pattern + "': cannot read the directory '" + unreadable_dir +
                    "': " + std::strerror(unreadable_errno) +
                    (unreadable_errno == ENOENT ? " (check the path's directories)" : ""));
  if (rc != 0) throw DataError(where + ": cannot read the directories of '" + pattern + "'");
  std::vector<std::string> files;
  for (std::size_t i = 0; i < g.gl_pathc; ++i)
    if (std::filesystem::is_regular_file(g.gl_pathv[i])) files.emplace_back(g.gl_pathv[i]);
  if (files.empty())
    throw DataError(where + ": '" + pattern + "' matches only directories, no file");
  return files;
}

}  // namespace

std::vector<std::string> expand_files(const std::vector<std::string>& entries,
                                      const std::string& where) {
  std::vector<std::string> files;
  std::set<std::string> seen;
  for (const std::string& entry : entries) {
    std::vector<std::string> found;
    if (is_pattern(entry)) {
      found = matches(entry, where);
    } else {
      if (!std::filesystem::exists(entry))
        throw DataError(where + ": cannot open '" + entry + "': " + std::strerror(ENOENT));
      if (std::filesystem::is_directory(entry))
        throw DataError(where + ": '" + entry +
                        "' is a directory; name its files or a pattern such as '" + entry +
                        "/*.bin'");
      found.push_back(entry);
    }
    for (std::string& f : found) {
      const std::string key = std::filesystem::weakly_canonical(f).string();
      if (!seen.insert(key).second)
        throw DataError(where + ": '" + f + "' is named twice (by '" + entry +
                        "' and an earlier entry); each file is read once");
      files.push_back(std::move(f));
    }
  }
  return files;
}

}  // namespace ztrain
