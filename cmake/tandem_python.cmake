# The tandem Python package, built into <build>/python/tandem (<build>/python is the folder
# PYTHONPATH names, docs/python.md): one pybind11 extension module, tandem._tandem, built from
# src/python/*.cc, and the package's Python files, src/python/tandem/*.py (tandem/__init__.py
# re-exports the extension; tandem/torch.py is the PyTorch integration), copied beside it; and its
# pytest suites and examples, labelled "python". Included by the top CMakeLists.txt when pybind11
# and Python were found.
file(GLOB tandem_py_srcs CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/python/*.cc)
# NO_EXTRAS: no link-time optimisation or stripping, which would slow the build for nothing here.
pybind11_add_module(tandem_py MODULE NO_EXTRAS ${tandem_py_srcs})
set_target_properties(tandem_py PROPERTIES OUTPUT_NAME _tandem LIBRARY_OUTPUT_DIRECTORY
                                                               ${PROJECT_BINARY_DIR}/python/tandem)
# Bindings sit on top: they link the modules they expose, and nothing links them.
target_link_libraries(tandem_py PRIVATE tandem_flags tandem_tune tandem_exec tandem_schedule tandem_dsl
                                        tandem_comm tandem_core)
# tandem.train and tandem.plan read their keywords through the commands' own flags (src/cli/).
if(TARGET tandem_train)  # tandem_train_flags: defined with the command, below
  target_link_libraries(tandem_py PRIVATE tandem_train_flags)
  target_include_directories(tandem_py PRIVATE ${PROJECT_SOURCE_DIR}/src)
endif()
set(TANDEM_PYTHON_PATH ${PROJECT_BINARY_DIR}/python)
file(GLOB tandem_py_files CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/python/tandem/*.py)
foreach(file ${tandem_py_files})
  get_filename_component(name ${file} NAME)
  configure_file(${file} ${TANDEM_PYTHON_PATH}/tandem/${name} COPYONLY)
endforeach()

if(NOT TANDEM_BUILD_TESTS)
  return()
endif()
execute_process(COMMAND ${Python3_EXECUTABLE} -c "import pytest, numpy"
                RESULT_VARIABLE tandem_no_pytest OUTPUT_QUIET ERROR_QUIET)
if(tandem_no_pytest)
  message(STATUS "tandem Python tests: not registered (python3-pytest or python3-numpy missing: "
                 "run scripts/install-deps.sh)")
  return()
endif()
# One CTest test a pytest file, so that ctest -j runs them side by side; no cache folder is
# written into the source tree (-p no:cacheprovider).
file(GLOB tandem_py_tests CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/python/test_*.py)
foreach(file ${tandem_py_tests})
  get_filename_component(name ${file} NAME_WE)
  add_test(NAME python.${name}
           COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider ${file})
  # TANDEM_COMMAND: the tandem command, whose output some tests compare with the module's
  # (test_tune.py runs it beside tandem.tune).
  set_tests_properties(python.${name} PROPERTIES LABELS "python" TIMEOUT 120
                       ENVIRONMENT "PYTHONPATH=${TANDEM_PYTHON_PATH};TANDEM_COMMAND=$<TARGET_FILE:tandem>")
endforeach()
# scripts/install-python.sh into a throwaway virtual environment, imported from outside the trees.
add_test(NAME python.install
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/python/install_test.sh ${PROJECT_SOURCE_DIR}
                 ${PROJECT_BINARY_DIR} ${Python3_EXECUTABLE})
set_tests_properties(python.install PROPERTIES LABELS "python" TIMEOUT 120)
# The scripts in tests/python/mpi/, one process a rank under mpirun as the C++ mpi suites are
# launched (tests/CMakeLists.txt: root allowed, oversubscribed), labelled "python" and "mpi". A
# script prints "SKIPPED: why" and exits 0 when a package it needs is missing.
file(GLOB tandem_py_mpi_tests CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/python/mpi/*.py)
list(FILTER tandem_py_mpi_tests EXCLUDE REGEX "/_[^/]*$")  # _name.py: what the scripts share
foreach(file ${tandem_py_mpi_tests})
  get_filename_component(name ${file} NAME_WE)
  add_test(NAME python.mpi.${name}.np2
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
                   ${Python3_EXECUTABLE} ${file})
  set_tests_properties(python.mpi.${name}.np2 PROPERTIES
    LABELS "python;mpi" TIMEOUT 120 SKIP_REGULAR_EXPRESSION "SKIPPED:"
    ENVIRONMENT "PYTHONPATH=${TANDEM_PYTHON_PATH};OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
endforeach()
# The examples in examples/python/, run as a user would run them.
if(NOT TANDEM_BUILD_EXAMPLES)
  return()
endif()
file(GLOB tandem_py_examples CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/examples/python/*.py)
foreach(file ${tandem_py_examples})
  get_filename_component(name ${file} NAME_WE)
  add_test(NAME examples.python.${name} COMMAND ${Python3_EXECUTABLE} ${file})
  set_tests_properties(examples.python.${name} PROPERTIES LABELS "examples;python" TIMEOUT 120
                                                          SKIP_REGULAR_EXPRESSION "SKIPPED:"
                                                          ENVIRONMENT "PYTHONPATH=${TANDEM_PYTHON_PATH}")
endforeach()
