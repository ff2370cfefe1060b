// The ztrain error hierarchy.
//
// Every failure ztrain reports is a ztrain::Error (or a subclass naming its
// domain). Their destructors live in libztrain, so their vtables do too: an
// error thrown by a plugin stays valid after the plugin is unloaded. A message says what was wrong,
// where (file:line:col for config, file and byte offset for data, plugin file for plugins) and what
// to do about it; callers add no decoration beyond a prefix such as the rank. The types are visible
// across the plugin boundary, so a plugin may throw them and the host catches them while the
// plugin's library is still loaded.
//
// Thread safety: the types are values; throwing from any thread is fine.
#pragma once

#include <stdexcept>
#include <string>

#include "ztrain/export.h"

namespace ztrain {

class ZTRAIN_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
  ~Error() override;  // defined in libztrain: one type_info for host and plugins
};

// A run file, preset, --set override or option value that is not acceptable.
class ZTRAIN_API ConfigError : public Error {
 public:
  using Error::Error;
  ~ConfigError() override;
};

// A plugin that cannot be found, loaded, or does not match the host's ABI.
class ZTRAIN_API PluginError : public Error {
 public:
  using Error::Error;
  ~PluginError() override;
};

// Input data (token files, text, weights) that is missing or malformed.
class ZTRAIN_API DataError : public Error {
 public:
  using Error::Error;
  ~DataError() override;
};

// An allocation beyond a tier's budget or beyond what the system could give.
class ZTRAIN_API OutOfMemoryError : public Error {
 public:
  using Error::Error;
  ~OutOfMemoryError() override;
};

// A file that cannot be opened, read or written where ztrain keeps state
// (the NVMe tier's swap files, checkpoints): a missing or unwritable
// directory, a file system without direct I/O, a full disk, a device error.
class ZTRAIN_API IoError : public Error {
 public:
  using Error::Error;
  ~IoError() override;
};

// A collective that failed or timed out.
class ZTRAIN_API CommError : public Error {
 public:
  using Error::Error;
  ~CommError() override;
};

// Training numerics that cannot continue (a non-finite loss, a loss scale
// below its minimum).
class ZTRAIN_API NumericsError : public Error {
 public:
  using Error::Error;
  ~NumericsError() override;
};

// A broken internal invariant: a bug in ztrain or in a plugin, never the
// user's input.
class ZTRAIN_API InternalError : public Error {
 public:
  using Error::Error;
  ~InternalError() override;
};

}  // namespace ztrain
