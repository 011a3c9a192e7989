#!/usr/bin/env python3
"""Lines of code of each .rs file before its tests: lines that are not
blank and not comments, up to the file's `#[cfg(test)] mod tests {`.
Files that are tests themselves (a `tests.rs`, anything under a `tests/`
folder, benches, fuzz targets) are listed apart.
Usage: loc.py ROOT [LIMIT]"""
import os, re, sys

root = sys.argv[1] if len(sys.argv) > 1 else "."
limit = int(sys.argv[2]) if len(sys.argv) > 2 else 900
TEST_MOD = re.compile(r"\s*(pub(\([a-z]+\))?\s+)?mod tests\s*\{")

def code_lines(path):
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    code, in_block = 0, False
    for i, line in enumerate(lines):
        s = line.strip()
        if s == "#[cfg(test)]" and i + 1 < len(lines) and TEST_MOD.match(lines[i + 1]):
            break
        if in_block:
            in_block = "*/" not in s
            continue
        if s.startswith("/*"):
            in_block = "*/" not in s
            continue
        if s and not s.startswith("//"):
            code += 1
    return code, len(lines)

source, tests = [], []
for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = [d for d in dirnames if d not in ("target", ".git", "node_modules")]
    for name in filenames:
        if not name.endswith(".rs"):
            continue
        path = os.path.join(dirpath, name)
        rel = os.path.relpath(path, root)
        parts = rel.split(os.sep)
        is_test = name == "tests.rs" or any(p in ("tests", "benches", "fuzz") for p in parts[:-1])
        code, total = code_lines(path)
        (tests if is_test else source).append((code, rel, total))

for title, rows in (("source files", source), ("test files (all tests)", tests)):
    over = sorted((r for r in rows if r[0] > limit), reverse=True)
    print(f"{title} over {limit} code lines: {len(over)}")
    for code, rel, total in over:
        print(f"  {code:5} code lines ({total} in all)  {rel}")
