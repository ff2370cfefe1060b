// Symbol visibility for the SDK.
//
// libztrain is built with hidden visibility (framework/CMakeLists.txt):
// ZTRAIN_API marks what the SDK promises plugins, and nothing else leaves
// the library but the host's kit (src/kit/kit_export.h).
// framework/exported_symbols.txt lists every exported symbol and a test
// holds the built library to it. Interface and exception types carry
// ZTRAIN_API so that their type_info is one object across the plugin
// boundary (dynamic_cast and catch by SDK type work in host and plugin
// alike).
#pragma once

#define ZTRAIN_API __attribute__((visibility("default")))
