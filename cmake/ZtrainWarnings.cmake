# Warnings every target of ours compiles with; -Werror when ZTRAIN_WERROR is on (CI).
add_library(ztrain_warnings INTERFACE)
target_compile_options(ztrain_warnings INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align -Wunused
  -Woverloaded-virtual -Wimplicit-fallthrough
  $<$<BOOL:${ZTRAIN_WERROR}>:-Werror>
  # GCC 12 reports -Wrestrict false positives inside libstdc++'s string
  # concatenation (GCC bug 105329).
  $<$<AND:$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>:-Wno-restrict>)
if(ZTRAIN_NATIVE)
  target_compile_options(ztrain_warnings INTERFACE -march=native)
endif()
