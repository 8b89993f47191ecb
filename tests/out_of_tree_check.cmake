# Run by ctest: configure attnbench with an out-of-tree backend folder, check
# the generated backend list names it, and compile the backend's source.
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE} -B ${BINARY} -G Ninja -DATTN_WITH_CUDA=OFF -DATTN_BUILD_TESTS=OFF
                        -DATTN_EXTRA_BACKEND_DIRS=${EXTRA}
                RESULT_VARIABLE configured OUTPUT_VARIABLE output ERROR_VARIABLE errors)
if(NOT configured EQUAL 0)
  message(FATAL_ERROR "configure failed:\n${output}\n${errors}")
endif()
if(NOT output MATCHES "attnbench backends: [^\n]*example-oot")
  message(FATAL_ERROR "the backend list does not name example-oot:\n${output}")
endif()
file(READ ${BINARY}/generated/backend_list.cpp list)
if(NOT list MATCHES "\"example-oot\", &make_example_oot_backend")
  message(FATAL_ERROR "generated/backend_list.cpp lacks the example:\n${list}")
endif()
# Its object alone: the libraries it links are this build's, already built and tested.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BINARY}
                        --target extra-backends/out_of_tree_backend/CMakeFiles/attn_backend_example_oot.dir/example_oot.cpp.o
                RESULT_VARIABLE built OUTPUT_VARIABLE output ERROR_VARIABLE errors)
if(NOT built EQUAL 0)
  message(FATAL_ERROR "building the example backend failed:\n${output}\n${errors}")
endif()
message(STATUS "example-oot registered and built")
