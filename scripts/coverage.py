#!/usr/bin/env python3
"""coverage.py: gcov's line and branch counts for harness/, reference/, cases/ and receipts/ from a --coverage build
(scripts/coverage.sh runs it after the cpu tests), a table per folder and the floor; gcov and the standard library only.

Usage: coverage.py BUILD_DIR FLOOR_LINES FLOOR_BRANCHES
Prints the table, writes BUILD_DIR/uncovered.txt (the branches never taken in the checks and judges, file:line) and
exits 1 naming each figure below its floor.
"""
import json
import os
import subprocess
import sys

FOLDERS = ("harness", "reference", "cases", "receipts")


def gcov_json(note_files, cwd):
    """gcov's JSON for each .gcno (a missing .gcda reads as never run: zero counts). One document per input."""
    docs = []
    # in batches: one gcov process for the lot is fast, but the argument list is kept well under any limit
    for start in range(0, len(note_files), 40):
        batch = note_files[start:start + 40]
        run = subprocess.run(["gcov", "--json-format", "--stdout", "--branch-probabilities", "--branch-counts", *batch],
                             cwd=cwd, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"coverage: gcov failed ({run.returncode}): {run.stderr.strip()[:2000]}")
        decoder, text, at = json.JSONDecoder(), run.stdout, 0
        while True:
            while at < len(text) and text[at].isspace():
                at += 1
            if at >= len(text):
                break
            doc, at = decoder.raw_decode(text, at)
            docs.append(doc)
    return docs


def merge(docs, root):
    """Per source line (a header's inline code counts once, summed over the objects that include it):
    {path: {line: [count, [branch counts], function]}} and {path: [(start, end, name)]}, paths relative to root."""
    lines, funcs = {}, {}
    for doc in docs:
        for f in doc.get("files", []):
            path = os.path.normpath(os.path.join(doc.get("current_working_directory", root), f["file"]))
            rel = os.path.relpath(path, root)
            if rel.split(os.sep)[0] not in FOLDERS:
                continue
            per = lines.setdefault(rel, {})
            for ln in f.get("lines", []):
                entry = per.setdefault(ln["line_number"], [0, [], ln.get("function_name", "")])
                entry[0] += ln["count"]
                counts = [b["count"] for b in ln.get("branches", []) if not b.get("throw")]
                if len(entry[1]) < len(counts):
                    entry[1].extend([0] * (len(counts) - len(entry[1])))
                for i, c in enumerate(counts):
                    entry[1][i] += c
            known = funcs.setdefault(rel, [])
            for fn in f.get("functions", []):
                item = (fn["start_line"], fn["end_line"], fn["name"])
                if item not in known:
                    known.append(item)
    return lines, funcs


def pct(hit, total):
    return 100.0 * hit / total if total else 100.0


def judged(rel, start, end, name):
    """The checks and judges whose untaken branches uncovered.txt lists."""
    base = os.path.basename(rel)
    if rel in ("harness/checks.c", "harness/tolerance.c", "harness/rule.c"):
        return True
    if rel.startswith("harness/") and base.endswith(("_family.c", "_rule.c", "_batch.c")):
        return True
    if rel.startswith("reference/") and ("judge" in base or "judge" in name):
        return True
    return False


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    build, floor_lines, floor_branches = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = os.path.abspath(build)
    notes = []
    for d, _, names in os.walk(os.path.join(build, "CMakeFiles")):
        for n in names:
            if n.endswith(".gcno"):
                notes.append(os.path.join(d, n))
    if not notes:
        sys.exit(f"coverage: no .gcno files under {build}/CMakeFiles: is it a KP_COVERAGE=ON build?")
    lines, funcs = merge(gcov_json(sorted(notes), build), root)

    rows, totals = [], [0, 0, 0, 0]
    for folder in FOLDERS:
        lh = lt = bh = bt = 0
        for rel, per in lines.items():
            if rel.split(os.sep)[0] != folder:
                continue
            for count, branches, _ in per.values():
                lt += 1
                lh += count != 0  # a count raced below zero (a build without atomic updates) still ran
                bt += len(branches)
                bh += sum(1 for c in branches if c != 0)
        rows.append((folder + "/", lh, lt, bh, bt))
        for i, v in enumerate((lh, lt, bh, bt)):
            totals[i] += v
    rows.append(("total", *totals))
    print(f"{'folder':<11} {'lines':>13} {'%':>6}   {'branches':>13} {'%':>6}")
    for name, lh, lt, bh, bt in rows:
        print(f"{name:<11} {lh:>6}/{lt:<6} {pct(lh, lt):>6.1f}   {bh:>6}/{bt:<6} {pct(bh, bt):>6.1f}")
    print("(lines: run at least once; branches: taken at least once, of every branch gcov counts)")

    # The untaken branches of the checks and judges, for a person to read: file:line, function, taken/total, source.
    out = []
    for rel in sorted(lines):
        spans = funcs.get(rel, [])
        try:
            with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
                src = fh.read().split("\n")
        except OSError:
            src = []
        for line in sorted(lines[rel]):
            count, branches, fname = lines[rel][line]
            if not branches or all(c != 0 for c in branches):
                continue
            span = next(((s, e, n) for s, e, n in spans if s <= line <= e), (0, 0, fname))
            if not judged(rel, *span):
                continue
            taken = sum(1 for c in branches if c != 0)
            text = src[line - 1].strip() if 0 < line <= len(src) else ""
            state = "line never run" if count == 0 else f"{taken}/{len(branches)} taken"
            out.append(f"{rel}:{line}: {span[2]}: {state}: {text}")
    path = os.path.join(build, "uncovered.txt")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("# Branches never taken by the cpu tests in the checks and judges (scripts/coverage.sh):\n")
        fh.write("# file:line: function: branches taken/total (or the line never ran): the source line\n")
        fh.write("\n".join(out) + ("\n" if out else ""))
    print(f"coverage: {len(out)} lines with untaken branches in the checks and judges listed in {path}")

    _, lh, lt, bh, bt = rows[-1]
    failed = False
    if pct(lh, lt) < floor_lines:
        print(f"coverage: line coverage {pct(lh, lt):.1f}% is below its floor {floor_lines:g}% (--floor-lines)",
              file=sys.stderr)
        failed = True
    if pct(bh, bt) < floor_branches:
        print(f"coverage: branch coverage {pct(bh, bt):.1f}% is below its floor {floor_branches:g}% (--floor-branches)",
              file=sys.stderr)
        failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
