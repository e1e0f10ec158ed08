# Cross-compiling for arm64 Linux with Debian's g++-aarch64-linux-gnu and the
# arm64 multiarch -dev packages (dpkg --add-architecture arm64), e.g.
#   cmake -S . -B build-arm64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# Tests run under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR); scripts/test_arm64.sh
# does all of it.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Libraries and CMake packages come from the arm64 multiarch paths of the host
# (/usr/lib/aarch64-linux-gnu, /usr/include shared with the host for the
# header-only ones); programs (ninja, pkg-config's own binary) from the host.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")

# Run the test executables (and gtest_discover_tests' listing) under qemu.
# No -L /usr/aarch64-linux-gnu: the loader and libc must come from the same
# glibc build, and the multiarch libc6:arm64 (a dependency of every :arm64
# -dev package) is found at /lib/ld-linux-aarch64.so.1 as on arm64 itself.
# With -L, qemu took the cross toolchain's ld.so (libc6-arm64-cross) but the
# multiarch libc.so.6 of another Debian revision, and pthread_create then
# looped forever in the loader's stack list (any OpenMP region hung).
find_program(PTLLM_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(PTLLM_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${PTLLM_QEMU_AARCH64})
endif()
