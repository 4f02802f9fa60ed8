# Which libtorch this tree builds against, and what each flavour needs. One tree builds with
#   - Debian's libtorch 1.13 (CPU; CI and the README's two commands), found on the system path;
#   - the PyTorch wheel's or the libtorch archive's libtorch 2.x, CPU or CUDA: give its location as
#     TORCH_DIR (environment or -DTORCH_DIR=), either the folder holding share/cmake/Torch (the
#     wheel's `torch` package folder, the archive's `libtorch`) or share/cmake itself
#     (python3 -c 'import torch; print(torch.utils.cmake_prefix_path)').
# Sets DS_TORCH_MAJOR, DS_WITH_CUDA, DS_NCCL_HEADERS (CUDA: where nccl.h is), and the targets
# ds_fmt (fmt, whichever copy is usable) and
# ds_link_order (link options every program needs).
if(NOT TORCH_DIR AND DEFINED ENV{TORCH_DIR})
  set(TORCH_DIR $ENV{TORCH_DIR})
endif()
if(TORCH_DIR)
  list(PREPEND CMAKE_PREFIX_PATH ${TORCH_DIR} ${TORCH_DIR}/share/cmake)
endif()
find_package(Torch REQUIRED)
string(REGEX MATCH "^[0-9]+" DS_TORCH_MAJOR "${Torch_VERSION}")
if(NOT DS_TORCH_MAJOR)
  set(DS_TORCH_MAJOR 1)
endif()
set(DS_WITH_CUDA OFF)
if(TORCH_CUDA_LIBRARIES OR TARGET torch_cuda)
  set(DS_WITH_CUDA ON)
endif()
message(STATUS "deepspeed.cpp: libtorch ${Torch_VERSION} at ${TORCH_INSTALL_PREFIX}, CUDA ${DS_WITH_CUDA}")

# fmt: the wheel ships fmt 12 headers inside torch/include, which come first on the include path
# and shadow the system's fmt 9 headers while the system libfmt would be linked (undefined
# fmt::v12::vformat). With such a libtorch, fmt is used header-only from torch's copy.
add_library(ds_fmt INTERFACE)
get_filename_component(DS_TORCH_PREFIX "${TORCH_INSTALL_PREFIX}" REALPATH)
if(EXISTS "${DS_TORCH_PREFIX}/include/fmt/format.h" AND NOT DS_TORCH_PREFIX MATCHES "^/usr(/local)?$")
  target_compile_definitions(ds_fmt INTERFACE FMT_HEADER_ONLY=1)
  message(STATUS "deepspeed.cpp: fmt header-only from libtorch's include/fmt")
else()
  find_package(fmt REQUIRED)
  target_link_libraries(ds_fmt INTERFACE fmt::fmt)
endif()

# Gloo: ProcessGroupGloo.hpp includes Gloo's headers. Debian has them (libgloo-dev); the wheel
# does not ship them: give a Gloo source tree's include folder as DS_GLOO_INCLUDE_DIR.
set(DS_GLOO_INCLUDE_DIR "" CACHE PATH "folder holding gloo/algorithm.h when libtorch lacks it")
if(NOT EXISTS "${TORCH_INSTALL_PREFIX}/include/gloo/algorithm.h")
  find_path(DS_GLOO_HEADERS gloo/algorithm.h HINTS ${DS_GLOO_INCLUDE_DIR})
  if(NOT DS_GLOO_HEADERS)
    message(FATAL_ERROR "deepspeed.cpp: libtorch at ${TORCH_INSTALL_PREFIX} has no Gloo headers "
            "(gloo/algorithm.h) and none were found: install libgloo-dev or pass "
            "-DDS_GLOO_INCLUDE_DIR=<a Gloo source tree of the libtorch's version>")
  endif()
  set(DS_GLOO_INCLUDE_DIR ${DS_GLOO_HEADERS} CACHE PATH "" FORCE)
endif()

# NCCL: ProcessGroupNCCL.hpp (torch_cuda's USE_C10D_NCCL) includes <nccl.h>, which is neither in
# the wheel's torch/include nor in the CUDA toolkit: the wheel's NCCL is the nvidia-nccl package
# beside torch (site-packages/nvidia/<nccl|cu13>/include), the archive's is a system NCCL. The
# header must be the NCCL libtorch was built with (its Options embed ncclConfig_t). Without it the
# NCCL communicator is compiled out, loudly: NCCL is then refused at init_distributed().
set(DS_NCCL_INCLUDE_DIR "" CACHE PATH "folder holding nccl.h (the NCCL of the CUDA libtorch)")
if(DS_WITH_CUDA)
  file(GLOB DS_NCCL_HINTS "${DS_TORCH_PREFIX}/../nvidia/*/include")
  # Searched afresh at every configure (TORCH_DIR or DS_NCCL_INCLUDE_DIR may have changed), the
  # named and the wheel's folders before any default path (a conda or system nccl.h of another
  # version would not match libtorch's).
  unset(DS_NCCL_HEADERS CACHE)
  find_path(DS_NCCL_HEADERS nccl.h
            PATHS ${DS_NCCL_INCLUDE_DIR} $ENV{NCCL_INCLUDE_DIR} ${DS_NCCL_HINTS} NO_DEFAULT_PATH)
  if(NOT DS_NCCL_HEADERS)
    find_path(DS_NCCL_HEADERS nccl.h HINTS $ENV{CUDA_HOME}/include)
  endif()
  if(DS_NCCL_HEADERS)
    message(STATUS "deepspeed.cpp: nccl.h from ${DS_NCCL_HEADERS}")
  else()
    message(WARNING "deepspeed.cpp: CUDA libtorch, but no nccl.h found (looked in "
            "DS_NCCL_INCLUDE_DIR, $NCCL_INCLUDE_DIR, ${DS_TORCH_PREFIX}/../nvidia/*/include): the "
            "NCCL communicator is left out and ranks communicate over Gloo. Pass "
            "-DDS_NCCL_INCLUDE_DIR=<folder with nccl.h> to build it.")
  endif()
endif()

# libtorch 2.x's libtorch.so exports its own statically linked copies of libstdc++'s
# std::filesystem functions (pytorch/pytorch#133437). A program whose libtorch comes before
# libstdc++ in its needed-library order binds std::filesystem::remove_all and friends to those
# copies, which crash. Naming libstdc++ first, before any object or library, makes the dynamic
# linker find the real ones first.
add_library(ds_link_order INTERFACE)
if(DS_TORCH_MAJOR GREATER_EQUAL 2)
  target_link_options(ds_link_order INTERFACE "LINKER:--push-state,--no-as-needed,-lstdc++,--pop-state")
endif()
