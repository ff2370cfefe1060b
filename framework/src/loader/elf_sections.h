// Named sections of an ELF shared library, read from the file itself: no
// dlopen, so none of the library's code (its constructors included) runs.
// The plugin loader reads a plugin's ABI record this way before it loads
// the plugin.
//
// Only 64-bit little-endian ELF, the form every platform ztrain builds for
// produces. The file is untrusted: every offset and size is checked against
// the file's length before it is used.
//
// Errors: Error naming the file and what is wrong with it (not ELF, another
// class or byte order, a header or section past the end of the file).
// Thread safety: a pure function of the file.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace ztrain {

// The sections of `file` whose names are in `wanted`, by name, with their
// bytes (at most `limit` each: a larger one is an error). A wanted section
// the file does not have is absent from the result.
std::map<std::string, std::string> read_elf_sections(const std::filesystem::path& file,
                                                     const std::vector<std::string>& wanted,
                                                     std::size_t limit);

}  // namespace ztrain
