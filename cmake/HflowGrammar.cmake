# HflowGrammar.cmake: generate the hflow parser from compiler/frontend/Hflow.g4
# with the antlr4 tool at build time and compile it into a static library.
#
# Included by compiler/frontend/CMakeLists.txt (the main build, g++) and by
# test/fuzz/CMakeLists.txt (the libFuzzer build, clang++), so both use the
# same antlr4 command line. Including it finds the ANTLR4 runtime (the
# imported target antlr4_shared, ANTLR4_INCLUDE_DIR) and the antlr4 tool.
#
#   hflow_add_grammar(<target> <grammar.g4>)
#
# adds the static library <target> built from the generated HflowLexer.cpp
# and HflowParser.cpp (namespace hflowgrammar, no listener, no visitor). Its
# users get the generated headers and the ANTLR4 runtime headers and library.
include_guard(DIRECTORY)

find_package(antlr4-runtime REQUIRED CONFIG)
find_program(HFLOW_ANTLR4 antlr4 REQUIRED)

function(hflow_add_grammar target grammar)
  get_filename_component(grammar "${grammar}" ABSOLUTE)
  # Under the build tree's include root: "compiler/frontend/grammar/HflowParser.h".
  set(out ${CMAKE_BINARY_DIR}/compiler/frontend/grammar)
  set(sources ${out}/HflowLexer.cpp ${out}/HflowParser.cpp)
  add_custom_command(
    OUTPUT ${sources} ${out}/HflowLexer.h ${out}/HflowParser.h
    COMMAND ${HFLOW_ANTLR4} -Dlanguage=Cpp -no-listener -no-visitor
            -package hflowgrammar -Xexact-output-dir -o ${out}
            ${grammar}
    DEPENDS ${grammar}
    COMMENT "antlr4: generating the hflow parser")

  add_library(${target} STATIC ${sources})
  target_include_directories(${target} PUBLIC ${CMAKE_BINARY_DIR} ${ANTLR4_INCLUDE_DIR})
  target_link_libraries(${target} PUBLIC antlr4_shared)
  # Generated code: its warnings are ANTLR's, not ours.
  target_compile_options(${target} PRIVATE -w)
endfunction()
