// expand_files: the files a `files` option names (ztrain/options.h), for
// data plugins that read one file or many (llm.c's FineWeb comes as a
// hundred fineweb_train_*.bin shards).
//
// Each entry is a file name or a glob pattern (*, ?, [...]): a pattern's
// matches in name order, entries in the order given. A name that is not
// there, a pattern that matches nothing and a file named twice are
// DataErrors naming the entry and `where` (the option's place, from
// Options::where), so a typo is never a run on fewer files. Directories
// are not files: a pattern's directories are skipped, a named one refused.
//
// Thread safety: reads the file system; call from one thread.
#pragma once

#include <string>
#include <vector>

#include "ztrain/export.h"

namespace ztrain {

ZTRAIN_API std::vector<std::string> expand_files(const std::vector<std::string>& entries,
                                                 const std::string& where);

}  // namespace ztrain
