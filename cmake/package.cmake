# package.cmake — librda.so (built from rda_core's objects), `cmake --install` (the library,
# include/rda.h, rdagen), find_package(rda) with the imported target rda::rda, pkg-config's
# rda.pc, and the CTest tests of the installed package (tests/test_install.sh, valgrind).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

add_library(rda SHARED $<TARGET_OBJECTS:rda_core>)
add_library(rda::rda ALIAS rda)
set_target_properties(rda PROPERTIES
    OUTPUT_NAME rda
    VERSION ${PROJECT_VERSION}
    SOVERSION ${PROJECT_VERSION_MAJOR}
    C_VISIBILITY_PRESET hidden
    LINKER_LANGUAGE C)
target_include_directories(rda PUBLIC
    $<BUILD_INTERFACE:${CMAKE_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
# Lua: Debian's liblua5.4.a is not position-independent (it cannot go into a shared library),
# so librda.so links the shared liblua5.4.so unless RDA_LUA_PIC_STATIC names a PIC archive.
set(RDA_LUA_PIC_STATIC "" CACHE FILEPATH "A position-independent liblua5.4.a to link into librda.so")
if(RDA_LUA_PIC_STATIC)
  set(rda_so_lua ${RDA_LUA_PIC_STATIC})
elseif(LUA_SHARED)
  set(rda_so_lua ${LUA_SHARED})
else()
  message(FATAL_ERROR "librda.so needs the shared liblua5.4.so (liblua5.4-dev) or RDA_LUA_PIC_STATIC")
endif()
target_link_libraries(rda PRIVATE ${rda_so_lua} ${NVRTC_LIB} ${CMAKE_DL_LIBS} m pthread)
target_link_options(rda PRIVATE -Wl,--exclude-libs,ALL -Wl,--no-undefined)
add_dependencies(rda rda_core)

install(TARGETS rda EXPORT rdaTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS rdagen RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${CMAKE_SOURCE_DIR}/include/rda.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(RDA_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/rda)
install(EXPORT rdaTargets NAMESPACE rda:: DESTINATION ${RDA_CMAKE_DIR} FILE rdaTargets.cmake)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/rdaConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/rdaConfig.cmake
                              INSTALL_DESTINATION ${RDA_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/rdaConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/rdaConfig.cmake ${CMAKE_BINARY_DIR}/rdaConfigVersion.cmake
        DESTINATION ${RDA_CMAKE_DIR})
file(RELATIVE_PATH RDA_PC_UP /r/${CMAKE_INSTALL_LIBDIR}/pkgconfig /r) # "../..", or deeper
string(REGEX REPLACE "/$" "" RDA_PC_UP "${RDA_PC_UP}")
configure_file(${CMAKE_SOURCE_DIR}/cmake/rda.pc.in ${CMAKE_BINARY_DIR}/rda.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/rda.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# The installed package, used as a consumer would: install to a temporary prefix, build
# examples/ with find_package(rda) and with pkg-config, run it on the emulator device.
# Sanitized builds build the example sanitized too (the library needs the runtime first).
string(REPLACE ";" " " rda_install_test_flags "${RDA_SAN_FLAGS} ${RDA_TSAN_FLAGS}")
add_test(NAME test_install
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/test_install.sh ${CMAKE_BINARY_DIR}
                 ${CMAKE_SOURCE_DIR} "${rda_install_test_flags}")
set(rda_install_test_env "RDA_CACHE_DIR=${RDA_TEST_CACHE};RDA_HOME=${CMAKE_SOURCE_DIR}")
set(rda_tsan_options ${RDA_TEST_ENV})
list(FILTER rda_tsan_options INCLUDE REGEX "^TSAN_OPTIONS=") # the RDA_TSAN build's, if any
list(APPEND rda_install_test_env ${rda_tsan_options})
set_tests_properties(test_install PROPERTIES ENVIRONMENT "${rda_install_test_env}" TIMEOUT 600)

# A create/destroy loop through the public API under valgrind (only where valgrind exists,
# and not in sanitized builds: the two do not mix).
find_program(RDA_VALGRIND valgrind)
if(RDA_VALGRIND AND NOT RDA_SANITIZE AND NOT RDA_TSAN AND TARGET test_api)
  add_test(NAME test_api_valgrind
           COMMAND ${RDA_VALGRIND} --error-exitcode=99 --leak-check=full
                   --errors-for-leak-kinds=definite --show-leak-kinds=definite
                   $<TARGET_FILE:test_api> --create-destroy-loop 3)
  set_tests_properties(test_api_valgrind PROPERTIES
      ENVIRONMENT "RDA_CACHE_DIR=${RDA_TEST_CACHE};RDA_HOME=${CMAKE_SOURCE_DIR}"
      TIMEOUT 600)
endif()
