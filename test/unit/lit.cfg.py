# The unit suite: every gtest executable named *-tests in build/bin, one lit
# test per gtest case.
import os
import sys
import lit.formats

sys.path.insert(0, os.path.join(config.hflow_src_root, "test"))
import hflow_lit

config.name = "hflow-unit"
config.test_format = lit.formats.GoogleTest(".", "-tests")
config.test_source_root = config.hflow_tools_dir
config.test_exec_root = config.hflow_tools_dir
hflow_lit.configure(config, lit)
