# The extension must use the one libstdc++ that torch's process has loaded. A second, static
# copy inside liblocks_torch.so brings its own locale facets, never initialised: the first
# std::ostringstream that formats a number dies (SIGSEGV in std::codecvt, seen on the H200,
# whose toolchain links libstdc++.a into shared libraries). So the extension links the
# runtime libstdc++.so.6 that `import torch` maps, by path, ahead of the compiler's implicit
# -lstdc++ (every C++ symbol then binds to it, nothing is copied in), and a post-build check
# fails the build if the library still does not depend on libstdc++.so.6.
function(locks_link_shared_libstdcxx target)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    return()
  endif()
  _torch_query(_rt "print(next((l.split()[-1] for l in open('/proc/self/maps') if 'libstdc++.so' in l), ''))")
  if(_rt AND EXISTS "${_rt}")
    message(STATUS "locks: linking torch's runtime libstdc++ ${_rt}")
    target_link_libraries(${target} PRIVATE "${_rt}")
  else()
    message(STATUS "locks: torch's process maps no libstdc++.so (statically linked torch?)")
  endif()
  find_program(LOCKS_READELF NAMES readelf "${CMAKE_READELF}")
  if(LOCKS_READELF)
    add_custom_command(TARGET ${target} POST_BUILD
      COMMAND ${CMAKE_COMMAND} -DREADELF=${LOCKS_READELF} -DLIB=$<TARGET_FILE:${target}>
              -P "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/check_shared_libstdcxx.cmake"
      VERBATIM)
  endif()
endfunction()
