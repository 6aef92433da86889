# The compiler suite: .mlir and .hflow files with RUN lines.
import os
import sys
import lit.formats

sys.path.insert(0, os.path.join(config.hflow_src_root, "test"))
import hflow_lit

config.name = "hflow-compiler"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".hflow", ".test"]
config.test_source_root = os.path.dirname(__file__)
config.excludes = ["Inputs", "lit.cfg.py", "grammar.test.py"]
hflow_lit.configure(config, lit)
