// The reader walks the ELF header to the section header table, takes the
// section-name string table (e_shstrndx), then copies out each wanted
// section's bytes. SHT_NOBITS sections (.bss) have no bytes in the file and
// read as zeros of their size.
#include "loader/elf_sections.h"

#include <elf.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <system_error>
#include "ztrain/error.h"

namespace ztrain {
namespace {

// The file, read a range at a time (a plugin may be large; its headers and
// the few sections wanted are small).
class ElfFile {
 public:
  explicit ElfFile(const std::filesystem::path& file)
      : name_(file.string()), in_(file, std::ios::binary) {
    std::error_code ec;
    size_ = std::filesystem::file_size(file, ec);
    if (!in_ || ec) throw Error(name_ + ": cannot open");
  }

  // The bytes at [offset, offset + size), checked against the file.
  std::string at(std::uint64_t offset, std::uint64_t size, const char* what) {
    if (offset > size_ || size > size_ - offset)
      throw Error(name_ + ": its " + what + " lies past the end of the file (truncated?)");
    std::string bytes(size, '\0');
    in_.seekg(static_cast<std::streamoff>(offset));
    if (!in_.read(bytes.data(), static_cast<std::streamsize>(size)))
      throw Error(name_ + ": cannot read its " + what);
    return bytes;
  }
  template <class T>
  T read(std::uint64_t offset, const char* what) {
    T v;
    std::memcpy(&v, at(offset, sizeof v, what).data(), sizeof v);
    return v;
  }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::ifstream in_;
  std::uint64_t size_ = 0;
};

Elf64_Ehdr header_of(ElfFile& f) {
  const std::string ident = f.at(0, EI_NIDENT, "ELF identification");
  if (std::memcmp(ident.data(), ELFMAG, SELFMAG) != 0) throw Error(f.name() + ": not an ELF file");
  if (ident[EI_CLASS] != ELFCLASS64 || ident[EI_DATA] != ELFDATA2LSB)
    throw Error(f.name() + ": not a 64-bit little-endian ELF file");
  const auto h = f.read<Elf64_Ehdr>(0, "ELF header");
  if (h.e_shentsize != sizeof(Elf64_Shdr))
    throw Error(f.name() + ": unexpected section header size " + std::to_string(h.e_shentsize));
  if (h.e_shstrndx >= h.e_shnum) throw Error(f.name() + ": no section name table");
  return h;
}

}  // namespace

std::map<std::string, std::string> read_elf_sections(const std::filesystem::path& file,
                                                     const std::vector<std::string>& wanted,
                                                     std::size_t limit) {
  ElfFile f(file);
  const Elf64_Ehdr h = header_of(f);
  f.at(h.e_shoff, std::uint64_t{h.e_shnum} * sizeof(Elf64_Shdr), "section header table");
  const auto section = [&](std::uint64_t i) {
    return f.read<Elf64_Shdr>(h.e_shoff + i * sizeof(Elf64_Shdr), "section header table");
  };
  const Elf64_Shdr names = section(h.e_shstrndx);
  const std::string table = f.at(names.sh_offset, names.sh_size, "section name table");
  std::map<std::string, std::string> out;
  for (std::uint64_t i = 0; i < h.e_shnum; ++i) {
    const Elf64_Shdr s = section(i);
    if (s.sh_name >= names.sh_size) throw Error(f.name() + ": a section name past its table");
    const std::string name = table.c_str() + s.sh_name;
    if (std::find(wanted.begin(), wanted.end(), name) == wanted.end()) continue;
    if (s.sh_size > limit)
      throw Error(f.name() + ": section " + name + " holds " + std::to_string(s.sh_size) +
                  " bytes, more than the " + std::to_string(limit) + " it may");
    out[name] = s.sh_type == SHT_NOBITS ? std::string(s.sh_size, '\0')
                                        : f.at(s.sh_offset, s.sh_size, "section");
  }
  return out;
}

}  // namespace ztrain
