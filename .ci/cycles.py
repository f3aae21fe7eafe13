#!/usr/bin/env python3
"""Lists the pairs of files of src/ that import each other and exits 1 when there is one.

    .ci/cycles.py            # src/
    .ci/cycles.py --edges    # every file-to-file reference it resolved, with its line
    .ci/cycles.py DIR        # the src/ of another checkout

A reference is a `use` path (grouped ones such as `use a::{b, c::d}` expanded) or a
`crate::`/`super::`/`self::` path in code, or an intra-doc link (`[`super::x`]`) in a doc comment,
since rustdoc resolves those too. Each is resolved to the file that defines the longest module
prefix of the path (x.rs or x/mod.rs). Test items (`#[cfg(test)]`, brace matched) are skipped; code
after them is read. A parent (x.rs or x/mod.rs) and its own child (x/y.rs) are not a pair: children
use items of their parent (src/sync/gossip/*.rs use items of gossip/mod.rs). lib.rs,
main.rs and src/bin/ (crate roots) are left out.

A pair is broken by moving what both use to where the dependency points one way, or into a small
file of its own.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rust_source import line_of, without_tests  # noqa: E402

USE = re.compile(r"\buse\s+([^;]+);")
PATH = re.compile(r"(?<![\w:])((?:crate|super|self)(?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)+)")
DOC_LINK = re.compile(r"\[`?((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+)")


def module_of(rel):
    """Module path of a file relative to src/: a/b.rs -> [a, b], a/mod.rs -> [a]."""
    parts = rel.removesuffix(".rs").split(os.sep)
    return parts[:-1] if parts[-1] == "mod" else parts


def expand(tree):
    """`a::{b, c::{d, self}}` -> [a::b, a::c::d, a::c]."""
    tree = re.sub(r"\s+", "", tree)
    depth, k = 0, 0
    for k, ch in enumerate(tree):
        if ch == "{":
            break
    else:
        return [re.sub(r"::self$", "", tree)]
    prefix, inner = tree[:k], tree[k + 1:tree.rfind("}")]
    items, start = [], 0
    for j, ch in enumerate(inner):
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            items.append(inner[start:j])
            start = j + 1
    items.append(inner[start:])
    out = []
    for item in filter(None, items):
        out += [re.sub(r"::self$", "", prefix + p) if p != "self" else prefix.rstrip(":") for p in expand(item)]
    return out


def resolve(module, segments, files):
    """The module file that `segments` (a path as written in `module`) points into, or None."""
    if segments[0] == "crate":
        base, rest = [], segments[1:]
    elif segments[0] in ("self", "super"):
        base, rest = list(module), segments
        while rest and rest[0] in ("self", "super"):
            if rest[0] == "super":
                base = base[:-1]
            rest = rest[1:]
    elif tuple(module + [segments[0]]) in files:  # `use child::x` of a module's own child
        base, rest = list(module), segments
    else:
        return None  # an external crate or std
    for n in range(len(rest), -1, -1):
        target = tuple(base + rest[:n])
        if target in files:
            return target
    return None


def references(root):
    """{(from module, to module): (line, file)} over src/, test items skipped."""
    src = os.path.join(root, "src")
    files = {}
    for dirpath, _, names in os.walk(src):
        for f in names:
            rel = os.path.relpath(os.path.join(dirpath, f), src)
            if f.endswith(".rs") and rel not in ("lib.rs", "main.rs") and not rel.startswith("bin" + os.sep):
                files[tuple(module_of(rel))] = rel
    edges = {}
    for module, rel in sorted(files.items(), key=lambda x: x[1]):
        text = open(os.path.join(src, rel), encoding="utf-8").read()
        code, tests = without_tests(text)
        found = []  # (offset, path segments)
        for m in USE.finditer(code):
            body = re.sub(r"^pub(\([^)]*\))?\s+", "", m.group(1).strip())
            body = re.sub(r"\s+as\s+\w+", "", body)
            found += [(m.start(), p.split("::")) for p in expand(body) if p]
        for m in PATH.finditer(code):
            found.append((m.start(), re.sub(r"\s+", "", m.group(1)).split("::")))
        for m in DOC_LINK.finditer(text):
            line_start = text.rfind("\n", 0, m.start()) + 1
            line = text[line_start:text.find("\n", m.start())]
            if not re.match(r"\s*//[/!]", line) or any(a <= m.start() < b for a, b in tests):
                continue
            found.append((m.start(), m.group(1).split("::")))
        for offset, segments in found:
            target = resolve(list(module), segments, files)
            if target is None or target == module:
                continue
            key = (module, target)
            line = line_of(text, offset)
            if key not in edges or line < edges[key][0]:
                edges[key] = (line, rel)
    return files, edges


def parent_and_child(a, b):
    return a[:-1] == b or b[:-1] == a


def main():
    roots = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = roots[0] if roots else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files, edges = references(root)
    if "--edges" in sys.argv:
        for (a, b), (line, rel) in sorted(edges.items(), key=lambda x: (x[1][1], x[1][0])):
            print(f"src/{rel}:{line} -> src/{files[b]}")
        return 0
    pairs = sorted({tuple(sorted((a, b))) for a, b in edges if (b, a) in edges and not parent_and_child(a, b)})
    for a, b in pairs:
        print(f"src/{files[a]}:{edges[(a, b)][0]} <-> src/{files[b]}:{edges[(b, a)][0]}")
    print(f"{len(pairs)} pair(s) of files importing each other", file=sys.stderr)
    return 1 if pairs else 0


if __name__ == "__main__":
    sys.exit(main())
