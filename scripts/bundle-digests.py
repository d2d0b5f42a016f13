#!/usr/bin/env python3
"""bundle-digests.py [--checks] BUNDLE: one line per digest a bundle's receipts record of the data itself (each
case's inputs, its reference and each impl's output), sorted, so two bundles of the same config can be
compared with diff whatever else changed (binaries, timings, receipt layout).
--checks adds what the run concluded: the bundle's verdict and exit code, each case's result, and per check its
kind, impl, result, summary and the SHA-256 of its findings (canonical JSON), so a refactor that must change no
verdict, summary or finding can be held to a committed copy (the plain build's gate_* tests do, tests/golden/)."""
import hashlib, json, os, sys

def checks_lines(bundle, r, case):
    lines = ["%s result %s" % (case, r.get("result"))]
    for i, c in enumerate(r.get("checks") or []):
        findings = json.dumps(c.get("findings"), sort_keys=True, separators=(",", ":"))
        lines.append("%s check %02d %s %s %s findings %s :: %s" % (
            case, i, c.get("check"), c.get("impl"), c.get("result"),
            hashlib.sha256(findings.encode()).hexdigest()[:16], c.get("summary", "")))
    return lines

def main(bundle, with_checks):
    lines = []
    rdir = os.path.join(bundle, "receipts")
    for name in sorted(os.listdir(rdir)):
        with open(os.path.join(rdir, name)) as f:
            r = json.load(f)
        case = r["case"]["name"]
        if with_checks:
            lines.extend(checks_lines(bundle, r, case))
        for tensor, t in sorted((r.get("inputs") or {}).items()):
            lines.append("%s input %s %s" % (case, tensor, t["sha256"]))
        ref = r.get("reference") or {}
        if "sha256" in ref:
            lines.append("%s reference %s" % (case, ref["sha256"]))
        for impl in r.get("impls") or []:
            if "output_sha256" in impl:
                lines.append("%s output %s %s" % (case, impl["name"], impl["output_sha256"]))
    if with_checks:
        with open(os.path.join(bundle, "bundle.json")) as f:
            b = json.load(f)
        lines.append("bundle verdict %s exit %s" % (b.get("verdict"), b.get("exit_code")))
    for line in sorted(lines):
        print(line)

if __name__ == "__main__":
    args = sys.argv[1:]
    with_checks = bool(args) and args[0] == "--checks"
    if with_checks:
        args = args[1:]
    if len(args) != 1:
        sys.exit("usage: bundle-digests.py [--checks] BUNDLE")
    main(args[0], with_checks)
