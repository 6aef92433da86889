import json
import re
import sys

grammar = json.load(open(sys.argv[1]))
g4 = open(sys.argv[2]).read()

regexes = []
def walk(node):
    if isinstance(node, dict):
        for key in ("match", "begin", "end"):
            if key in node:
                regexes.append(node[key])
        for v in node.values():
            walk(v)
    elif isinstance(node, list):
        for v in node:
            walk(v)
walk(grammar)
for r in regexes:
    re.compile(r)  # Python's re is close enough to Oniguruma for these

keywords = set(re.findall(r"'([a-z_]+)'", g4))
missing = [k for k in sorted(keywords)
           if not any(re.match(r, k + " name") for r in regexes if "\\b" in r)]
if missing:
    sys.exit("keywords not highlighted: " + ", ".join(missing))
print("ok: %d regexes, %d keywords" % (len(regexes), len(keywords)))
