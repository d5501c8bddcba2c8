# Compiler flags shared by every longctx target: warnings on, sanitizers when asked.
add_library(longctx_flags INTERFACE)
target_compile_options(longctx_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wno-missing-field-initializers>)

if(LONGCTX_SANITIZE)
  set(_san -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  target_compile_options(longctx_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX,C>:${_san}>)
  target_link_options(longctx_flags INTERFACE ${_san})
endif()

# Marks the vector kernels of the calling folder (sources relative to it).
# Their tiles of accumulators are arrays of vectors that live in registers only
# once the loops over them are unrolled (-O3) and only where ASan gives no
# local array a stack slot with redzones of its own. Sanitized at -O2 with
# stack checks, the f32 prefill GEMM ran 24x slower than the same build
# without sanitizers, and test_server spent most of its 16 minutes there. So
# in a sanitized build they are compiled at -O3 (as in Release) without ASan's
# stack instrumentation: every heap and global byte they read or write is
# still checked, and UBSan is unchanged.
function(longctx_vector_kernels)
  if(LONGCTX_SANITIZE)
    set_property(SOURCE ${ARGN} APPEND PROPERTY COMPILE_OPTIONS -O3 --param=asan-stack=0)
  endif()
endfunction()

# Adds a library target for one folder of the tree: sources are the folder's
# src/*.cpp, public headers live in <folder>/include/longctx/<folder>/.
function(longctx_add_library name folder)
  file(GLOB _srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/${folder}/src/*.cpp)
  add_library(${name} STATIC ${_srcs})
  target_include_directories(${name} PUBLIC ${CMAKE_SOURCE_DIR}/${folder}/include)
  target_link_libraries(${name} PUBLIC longctx_flags)
endfunction()
