# ZTRAIN_GIT_COMMIT: the source tree's commit at configure time (short hash,
# "-dirty" when it has uncommitted changes), "unknown" outside git. The
# reports print it beside the version; re-run cmake to refresh it.
set(ZTRAIN_GIT_COMMIT "unknown")
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} OUTPUT_VARIABLE _commit
    OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc ERROR_QUIET)
  if(_rc EQUAL 0 AND _commit)
    execute_process(COMMAND ${GIT_EXECUTABLE} status --porcelain --untracked-files=no
      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} OUTPUT_VARIABLE _changes ERROR_QUIET)
    set(ZTRAIN_GIT_COMMIT "${_commit}")
    if(_changes)
      string(APPEND ZTRAIN_GIT_COMMIT "-dirty")
    endif()
  endif()
endif()
