#!/usr/bin/env python3
"""Lists the Rust functions longer than a limit (default 120 lines, the project's rule), longest
first, and exits 1 when there is one.

    .ci/fn-lengths.py                 # src/, limit 120
    .ci/fn-lengths.py --max 80 src/sync
    .ci/fn-lengths.py --all src/train # every function with its length

A function's length runs from the line of its `fn` keyword to the line of its closing brace.
Braces inside strings, characters and comments are skipped by a small lexer (format strings
such as "{x}" would otherwise count); nested functions are measured on their own too.
"""
import argparse
import os
import re
import sys

FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


def code_only(text):
    """`text` with comments, strings and character literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif (m := re.match(r'b?r(#*)"', text[i:i + 300])) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            # A character literal ('x', '\n', '\u{..}', '{') or a lifetime ('a): a literal closes
            # within a few characters.
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:i + 12])
            if m:
                out.append(" " * m.end())
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def block_end(code, k):
    """Offset of the `}` that closes the block opening at `code[k]` (a `{`), or len(code) if none:
    `code` is the output of `code_only`, so braces in strings and comments are already gone."""
    depth = 0
    while k < len(code):
        if code[k] == "{":
            depth += 1
        elif code[k] == "}":
            depth -= 1
            if depth == 0:
                return k
        k += 1
    return k


def functions(path):
    """(name, first line, length) of every function with a body in the file."""
    text = code_only(open(path, encoding="utf-8").read())
    line_at = [0] * (len(text) + 1)
    line = 1
    for k, ch in enumerate(text):
        line_at[k] = line
        if ch == "\n":
            line += 1
    line_at[len(text)] = line
    found = []
    for m in FN.finditer(text):
        # The body starts at the first `{` after the signature, unless a `;` ends it first
        # (a trait method without a default body).
        k = m.end()
        while k < len(text) and text[k] not in "{;":
            k += 1
        if k >= len(text) or text[k] == ";":
            continue
        j = block_end(text, k)
        first, last = line_at[m.start()], line_at[j]
        found.append((m.group(1), first, last - first + 1))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", default=["src"])
    ap.add_argument("--max", type=int, default=120, help="longest allowed function, in lines")
    ap.add_argument("--all", action="store_true", help="list every function, not only the long ones")
    args = ap.parse_args()
    rows = []
    for root in args.paths:
        files = [root] if root.endswith(".rs") else [
            os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".rs")]
        for path in sorted(files):
            rows += [(length, path, first, name) for name, first, length in functions(path)]
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    long = [r for r in rows if r[0] > args.max]
    for length, path, first, name in rows if args.all else long:
        print(f"{length:5} {path}:{first} {name}")
    sys.stdout.flush()
    if not args.all:
        print(f"{len(long)} function(s) over {args.max} lines, of {len(rows)}", file=sys.stderr)
    return 1 if long else 0


if __name__ == "__main__":
    sys.exit(main())
