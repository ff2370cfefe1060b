// A static constructor for test plugins: loading the library (dlopen) runs
// it, and it writes the file ZTRAIN_TEST_LOAD_MARK names, so a test can see
// whether any of a plugin's code ran.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace {
[[gnu::constructor]] void ztrain_test_load_mark() {
  if (const char* path = std::getenv("ZTRAIN_TEST_LOAD_MARK"))
    if (std::FILE* f = std::fopen(path, "w")) std::fclose(f);
}
}  // namespace
