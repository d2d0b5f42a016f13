#!/usr/bin/env python3
"""bundle-digests.py BUNDLE: one line per digest a bundle's receipts record of the data itself (each
case's inputs, its reference and each impl's output), sorted, so two bundles of the same config can be
compared with diff whatever else changed (binaries, timings, receipt layout)."""
import json, os, sys

def main(bundle):
    lines = []
    rdir = os.path.join(bundle, "receipts")
    for name in sorted(os.listdir(rdir)):
        with open(os.path.join(rdir, name)) as f:
            r = json.load(f)
        case = r["case"]["name"]
        for tensor, t in sorted((r.get("inputs") or {}).items()):
            lines.append("%s input %s %s" % (case, tensor, t["sha256"]))
        ref = r.get("reference") or {}
        if "sha256" in ref:
            lines.append("%s reference %s" % (case, ref["sha256"]))
        for impl in r.get("impls") or []:
            if "output_sha256" in impl:
                lines.append("%s output %s %s" % (case, impl["name"], impl["output_sha256"]))
    for line in sorted(lines):
        print(line)

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: bundle-digests.py BUNDLE")
    main(sys.argv[1])
