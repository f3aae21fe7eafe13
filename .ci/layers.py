#!/usr/bin/env python3
"""Lists the upward imports between the layers of src/ (lib.rs: graph, data, model, comm at the
bottom; sync above them; the training loop, configuration and command line on top) and exits 1
when there is one. Test items (`#[cfg(test)]`: the `mod tests { ... }` block, found by brace
matching that skips braces in strings, characters and comments) may reach up; the rest of the
file, code after the tests included, is read. It also exits 1 when a mode file of src/sync/
declares its `pub const MODE` after a test module (the declaration belongs before the tests).

    .ci/layers.py            # src/
    .ci/layers.py --list     # every module with its layer

This is the check a split into workspace crates would give through the compiler, without the
split (docs/sync-modes.md, "Crates and an in-process transport: measured").
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rust_source import line_of, without_tests  # noqa: E402

# Module (first path component under src/, or file stem) -> layer; higher may use lower.
LAYER = {
    "graph": 0, "data": 0, "model": 0, "comm": 0, "rng": 0, "values": 0,
    "sync": 1,
    "train": 2, "config": 2, "cli": 2, "cluster": 2, "bench": 2, "plot": 2, "predict": 2,
}
USE = re.compile(r"\bcrate::([a-z_]+)")
MODE = re.compile(r"\bpub\s+const\s+MODE\b")


def upward(root):
    found = []
    for dirpath, _, files in os.walk(os.path.join(root, "src")):
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, os.path.join(root, "src"))
            module = rel.split(os.sep)[0].removesuffix(".rs")
            if module not in LAYER:
                continue
            body, tests = without_tests(open(path, encoding="utf-8").read())
            if module == "sync" and tests:
                for m in MODE.finditer(body, tests[0][1]):
                    found.append(f"src/{rel}:{line_of(body, m.start())}: `pub const MODE` comes after the test module "
                                 f"(line {line_of(body, tests[0][0])}): move MODE before the tests")
            for i, line in enumerate(body.splitlines(), 1):
                for m in USE.finditer(line):
                    target = m.group(1)
                    if target in LAYER and LAYER[target] > LAYER[module]:
                        found.append(f"src/{rel}:{i}: {module} (layer {LAYER[module]}) uses {target} (layer {LAYER[target]})")
    return found


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if "--list" in sys.argv:
        for m, l in sorted(LAYER.items(), key=lambda x: (x[1], x[0])):
            print(l, m)
        return 0
    unknown = [f.removesuffix(".rs") for f in os.listdir(os.path.join(root, "src"))
               if f.removesuffix(".rs") not in LAYER and f not in ("lib.rs", "main.rs", "bin")]
    found = upward(root)
    for line in found:
        print(line)
    for u in unknown:
        print(f"src/{u}: a module of no layer: add it to LAYER in .ci/layers.py")
    print(f"{len(found)} finding(s)", file=sys.stderr)
    return 1 if found or unknown else 0


if __name__ == "__main__":
    sys.exit(main())
