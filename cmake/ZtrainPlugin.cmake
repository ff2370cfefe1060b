# ztrain_add_plugin(<target> KIND strategy|model|data|schedule SOURCES ... [NO_INSTALL])
# Builds one plugin shared library: hidden visibility (only the ztrain section
# alias is exported), linked to the SDK alone (every symbol resolved there), placed where the host discovers it
# (in ztrain's tree, beside its own plugins; elsewhere <build>/plugins, for
# `ztrain --plugin-path`), and installed into <prefix>/lib/ztrain/plugins,
# where an installed ztrain looks (<bin>/../lib/ztrain/plugins), unless
# NO_INSTALL (ztrain's test plugins).
# ztrain_no_undefined(<target>): link <target> with --no-undefined, so a
# symbol it uses that its libraries do not export fails its link. Not in
# sanitizer builds: clang leaves the sanitizer runtime's symbols in a shared
# library for the executable to resolve.
function(ztrain_no_undefined target)
  if(NOT "${CMAKE_CXX_FLAGS} ${CMAKE_SHARED_LINKER_FLAGS} ${CMAKE_MODULE_LINKER_FLAGS}" MATCHES
     "-fsanitize")
    target_link_options(${target} PRIVATE -Wl,--no-undefined)
  endif()
endfunction()

function(ztrain_add_plugin target)
  cmake_parse_arguments(ARG "NO_INSTALL" "KIND;OUTPUT_DIR" "SOURCES;LIBRARIES" ${ARGN})
  if(NOT ARG_KIND MATCHES "^(strategy|model|data|schedule)$")
    message(FATAL_ERROR "ztrain_add_plugin(${target}): KIND must be strategy, model, data or schedule, got '${ARG_KIND}'")
  endif()
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE ztrain::sdk ${ARG_LIBRARIES})
  if(TARGET ztrain_warnings)
    target_link_libraries(${target} PRIVATE ztrain_warnings)
  endif()
  if(NOT ARG_OUTPUT_DIR)
    if(ZTRAIN_PLUGIN_OUTPUT_DIR)
      set(ARG_OUTPUT_DIR ${ZTRAIN_PLUGIN_OUTPUT_DIR})
    else()
      set(ARG_OUTPUT_DIR ${CMAKE_BINARY_DIR}/plugins)
    endif()
  endif()
  set_target_properties(${target} PROPERTIES
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    PREFIX "libztrain_${ARG_KIND}_"
    OUTPUT_NAME ${target}
    LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIR})
  # Every symbol a plugin uses resolved against the SDK when it is linked:
  # a call into what libztrain does not export fails the build, not a run.
  ztrain_no_undefined(${target})
  if(NOT ARG_NO_INSTALL)
    install(TARGETS ${target} LIBRARY DESTINATION lib/ztrain/plugins)
  endif()
endfunction()

function(ztrain_add_strategy target)
  ztrain_add_plugin(${target} KIND strategy ${ARGN})
endfunction()
function(ztrain_add_model target)
  ztrain_add_plugin(${target} KIND model ${ARGN})
endfunction()
function(ztrain_add_data target)
  ztrain_add_plugin(${target} KIND data ${ARGN})
endfunction()
function(ztrain_add_schedule target)
  ztrain_add_plugin(${target} KIND schedule ${ARGN})
endfunction()
