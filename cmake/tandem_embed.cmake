# tandem_embed_text(TARGET IN NAME HEADER): compiles into TARGET a generated file defining
# `std::string_view tandem::codegen::NAME()`, declared in HEADER, that returns IN's text as
# embed_text.cmake prepares it; regenerated when IN changes.
function(tandem_embed_text target in name header)
  set(out ${PROJECT_BINARY_DIR}/generated/${name}.cc)
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DIN=${in} -DOUT=${out} -DNAME=${name} -DNAMESPACE=tandem::codegen
            -DHEADER=${header} -P ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/embed_text.cmake
    DEPENDS ${in} ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/embed_text.cmake
    COMMENT "Embedding ${in} for the code emitters")
  target_sources(${target} PRIVATE ${out})
endfunction()
