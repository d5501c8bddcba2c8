# Compiler flags shared by every longctx target: warnings on, sanitizers when asked.
add_library(longctx_flags INTERFACE)
target_compile_options(longctx_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wno-missing-field-initializers>)

if(LONGCTX_SANITIZE)
  set(_san -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  target_compile_options(longctx_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX,C>:${_san}>)
  target_link_options(longctx_flags INTERFACE ${_san})
endif()

# Adds a library target for one folder of the tree: sources are the folder's
# src/*.cpp, public headers live in <folder>/include/longctx/<folder>/.
function(longctx_add_library name folder)
  file(GLOB _srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/${folder}/src/*.cpp)
  add_library(${name} STATIC ${_srcs})
  target_include_directories(${name} PUBLIC ${CMAKE_SOURCE_DIR}/${folder}/include)
  target_link_libraries(${name} PUBLIC longctx_flags)
endfunction()
