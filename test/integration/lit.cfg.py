# The integration suite: hflow-run on several local processes over loopback.
import os
import sys
import lit.formats

sys.path.insert(0, os.path.join(config.hflow_src_root, "test"))
import hflow_lit

config.name = "hflow-integration"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".test"]
config.test_source_root = os.path.dirname(__file__)
config.excludes = ["Inputs", "lit.cfg.py"]
# Multi-process tests each use several processes: run two at a time at most.
lit_config.parallelism_groups["hflow-workers"] = 2
config.parallelism_group = "hflow-workers"
hflow_lit.configure(config, lit)
