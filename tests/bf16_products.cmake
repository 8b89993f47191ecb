# ctest verify.bf16_products_other: blocked and streaming multiply bfloat16
# cases the way this machine does not choose (ATTN_BF16_PRODUCTS: float32
# where it measured bfloat16 pairs faster, pairs where it measured float32
# faster), over every bfloat16 fixture, forward, backward and invariance, so
# that both paths stay tested whichever host runs the tests.
#   cmake -DCLI=attn -DFIXTURES=dir -DWORK=dir -P bf16_products.cmake
execute_process(COMMAND ${CLI} list RESULT_VARIABLE rc OUTPUT_VARIABLE listing ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "attn list: exit ${rc}\n${err}")
endif()
if(listing MATCHES "bfloat16 products: in bfloat16 pairs")
  set(other float32)
elseif(listing MATCHES "bfloat16 products: widened to float32")
  set(other dot)
else()
  message(FATAL_ERROR "attn list names no bfloat16 products:\n${listing}")
endif()
set(ENV{ATTN_BF16_PRODUCTS} ${other})
execute_process(COMMAND ${CLI} list RESULT_VARIABLE rc OUTPUT_VARIABLE forced ERROR_VARIABLE err)
if(NOT forced MATCHES "ATTN_BF16_PRODUCTS=${other}")
  message(FATAL_ERROR "ATTN_BF16_PRODUCTS=${other} is not what attn list shows:\n${forced}${err}")
endif()
execute_process(COMMAND ${CLI} verify ${FIXTURES} --backend blocked --backend streaming -t bfloat16 --quiet --skip-check relations
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("ATTN_BF16_PRODUCTS=${other}\n${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ATTN_BF16_PRODUCTS=${other} attn verify: exit ${rc}, expected 0\n${err}")
endif()
# And the variable really changed the arithmetic: the same bfloat16 cases
# give other errors (other bits) than on the machine's own path.
file(MAKE_DIRECTORY ${WORK})
foreach(run other own)
  if(run STREQUAL own)
    unset(ENV{ATTN_BF16_PRODUCTS})
  endif()
  execute_process(COMMAND ${CLI} verify ${FIXTURES}/basic ${FIXTURES}/decode --backend streaming -t bfloat16 --quiet
                          --skip-check relations --json ${WORK}/${run}.json
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "attn verify (${run} path): exit ${rc}\n${err}")
  endif()
  file(READ ${WORK}/${run}.json json)
  string(REGEX MATCHALL "\"rms_error\": [^,]+" errors_${run} "${json}")
endforeach()
list(LENGTH errors_own n)
if(n EQUAL 0)
  message(FATAL_ERROR "no error in ${WORK}/own.json")
endif()
if(errors_own STREQUAL errors_other)
  message(FATAL_ERROR "ATTN_BF16_PRODUCTS=${other} changed no error of ${n}: the kernels ignore the choice")
endif()
