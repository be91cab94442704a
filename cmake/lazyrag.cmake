# lazyrag_test(NAME SOURCES... LIBS ... LABELS ...): a GoogleTest binary registered with ctest.
function(lazyrag_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main)
  if(LAZYRAG_TSAN_ABSL_SHIM)
    target_sources(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/sanitizers/tsan_absl_shim.cc)
    target_link_libraries(${name} PRIVATE absl::synchronization ${CMAKE_DL_LIBS})
  endif()
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  gtest_discover_tests(${name}
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
    DISCOVERY_TIMEOUT 60)
endfunction()
