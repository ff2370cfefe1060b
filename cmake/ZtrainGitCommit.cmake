# Writes OUT, a header defining ZTRAIN_GIT_COMMIT: the source tree's commit
# (short hash, "-dirty" when tracked files have uncommitted changes),
# "unknown" outside git. Run at every build (framework/CMakeLists.txt), it
# rewrites OUT only when the text changes, so the reports' metadata follows
# the tree and a build with the same commit recompiles nothing.
#
# usage: cmake -DSOURCE_DIR=DIR -DOUT=FILE -P ZtrainGitCommit.cmake
set(commit "unknown")
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD
    WORKING_DIRECTORY ${SOURCE_DIR} OUTPUT_VARIABLE head
    OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_QUIET)
  if(rc EQUAL 0 AND head)
    execute_process(COMMAND ${GIT_EXECUTABLE} status --porcelain --untracked-files=no
      WORKING_DIRECTORY ${SOURCE_DIR} OUTPUT_VARIABLE changes ERROR_QUIET)
    set(commit "${head}")
    if(changes)
      string(APPEND commit "-dirty")
    endif()
  endif()
endif()
set(text "// Written by cmake/ZtrainGitCommit.cmake at each build.\n#pragma once\n#define ZTRAIN_GIT_COMMIT \"${commit}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
