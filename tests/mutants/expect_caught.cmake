# Proves that `make verify` catches one mutant without running the whole
# suite: make verify runs every fixture of fixtures/golden under VERIFY_ARGS
# (read from the Makefile), so a FAIL of the mutant on any of them under those
# options is a FAIL of make verify. Asserts, under make verify's options:
#   - the mutant's own fixture exits 1 (FAIL, not an input error);
#   - at least two different fixtures of that fixture's folder FAIL it, so the
#     catch does not hang on a single witness.
#   cmake -DCLI=attn-mutants -DMAKEFILE=Makefile -DBACKEND=<mutant> -DCASE=<fixture.h5> -DOUT=<dir> -P expect_caught.cmake
file(STRINGS ${MAKEFILE} line REGEX "^VERIFY_ARGS [?]?= ")
if(NOT line)
  message(FATAL_ERROR "${MAKEFILE} has no VERIFY_ARGS line")
endif()
string(REGEX REPLACE "^VERIFY_ARGS [?]?= " "" args "${line}")
separate_arguments(args UNIX_COMMAND "${args}")
if(NOT EXISTS ${CASE})
  message(FATAL_ERROR "${BACKEND}: its fixture ${CASE} does not exist")
endif()

execute_process(COMMAND ${CLI} verify ${CASE} --backend ${BACKEND} ${args} --quiet
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "${BACKEND} on ${CASE} with make verify's options (${args}): exit ${rc}, expected 1\n${out}\n${err}")
endif()

cmake_path(GET CASE PARENT_PATH folder)
file(MAKE_DIRECTORY ${OUT})
set(json ${OUT}/${BACKEND}.json)
execute_process(COMMAND ${CLI} verify ${folder} --backend ${BACKEND} ${args} --quiet --json ${json}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "${BACKEND} on ${folder}: exit ${rc}, expected 1\n${out}\n${err}")
endif()
file(READ ${json} text)
string(JSON count LENGTH "${text}" results)
set(failed "")
math(EXPR last "${count} - 1")
foreach(i RANGE ${last})
  string(JSON verdict GET "${text}" results ${i} verdict)
  if(verdict STREQUAL "FAIL")
    string(JSON fixture GET "${text}" results ${i} fixture)
    list(APPEND failed ${fixture})
  endif()
endforeach()
list(REMOVE_DUPLICATES failed)
list(LENGTH failed witnesses)
if(witnesses LESS 2)
  message(FATAL_ERROR "${BACKEND}: only ${witnesses} fixture of ${folder} catches it (${failed}); add a second witness")
endif()
message(STATUS "${BACKEND}: caught by ${witnesses} fixtures of ${folder}: ${failed}")
