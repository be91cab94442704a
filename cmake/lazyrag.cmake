# lazyrag_test(NAME SOURCES... LIBS ... LABELS ... [SERIAL]): a GoogleTest binary registered with
# ctest; SERIAL runs its tests alone (RUN_SERIAL).
function(lazyrag_test name)
  cmake_parse_arguments(T "SERIAL" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest lazyrag_test_main)
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
  set(serial)
  if(T_SERIAL)
    set(serial RUN_SERIAL TRUE)
  endif()
  # One label: gtest_discover_tests (CMake 3.25) cannot pass a list as a property value (the
  # second label would pair with the next property name and the rest would be lost).
  list(LENGTH T_LABELS n_labels)
  if(n_labels GREATER 1)
    message(WARNING "lazyrag_test(${name}): one label only; keeping the first of ${T_LABELS}")
    list(GET T_LABELS 0 T_LABELS)
  endif()
  gtest_discover_tests(${name}
    PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT} ${serial}
    DISCOVERY_TIMEOUT 60)
endfunction()
