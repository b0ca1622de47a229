# Post-build check (shared_libstdcxx.cmake): LIB must depend on libstdc++.so.6, i.e. share
# torch's C++ runtime instead of carrying a static copy of it.
execute_process(COMMAND "${READELF}" -d "${LIB}" OUTPUT_VARIABLE dyn RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "readelf -d ${LIB} failed")
endif()
if(NOT dyn MATCHES "NEEDED[^\n]*libstdc\\+\\+\\.so")
  message(FATAL_ERROR "${LIB} does not link libstdc++.so dynamically: a static libstdc++ copy "
                      "next to torch's crashes on the first formatted error message. Use a "
                      "compiler whose libstdc++.so is installed (e.g. the distribution's g++).")
endif()
