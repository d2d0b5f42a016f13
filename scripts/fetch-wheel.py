#!/usr/bin/env python3
"""fetch-wheel.py URL SHA256 PREFIX DEST: download a wheel, refuse it unless its SHA-256 is the pinned one, and unpack
its files under PREFIX (e.g. nvidia/curand/) into DEST, with the pin written to DEST/WHEEL. scripts/setup.sh uses it
for cuRAND when no CUDA toolkit is installed. DEST appears whole or not at all, so a run cut short is redone next time.
Standard library only: a wheel is a zip file, and Debian's python3 has no pip."""
import hashlib, os, shutil, sys, tempfile, urllib.request, zipfile


def main(url, sha256, prefix, dest):
    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".fetch-", dir=parent)  # beside DEST, so the final rename stays on one filesystem
    try:
        wheel = os.path.join(work, os.path.basename(url))
        digest = hashlib.sha256()
        try:
            with urllib.request.urlopen(url, timeout=60) as r, open(wheel, "wb") as f:
                for chunk in iter(lambda: r.read(1 << 20), b""):
                    digest.update(chunk)
                    f.write(chunk)
        except OSError as e:  # urllib's errors (no route, HTTP 404, TLS) are OSErrors
            print("fetch-wheel: could not download %s: %s (behind a proxy? set https_proxy, and SSL_CERT_FILE to its CA)"
                  % (url, e), file=sys.stderr)
            return 1
        if digest.hexdigest() != sha256:
            print("fetch-wheel: %s has SHA-256 %s, not the pinned %s; refused" % (url, digest.hexdigest(), sha256),
                  file=sys.stderr)
            return 1
        tree = os.path.join(work, "tree")
        with zipfile.ZipFile(wheel) as z:
            members = [m for m in z.namelist() if m.startswith(prefix) and not m.endswith(("/", "__init__.py"))]
            licences = [m for m in z.namelist() if m.endswith(".dist-info/License.txt")]
            if not members:
                print("fetch-wheel: %s holds nothing under %s" % (url, prefix), file=sys.stderr)
                return 1
            for m in members + licences:
                rel = m[len(prefix):] if m in members else "License.txt"
                if os.path.isabs(rel) or ".." in rel.split("/"):
                    print("fetch-wheel: %s: member %s would land outside %s; refused" % (url, m, dest), file=sys.stderr)
                    return 1
                out = os.path.join(tree, rel)
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with z.open(m) as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        with open(os.path.join(tree, "WHEEL"), "w") as f:
            f.write("%s sha256=%s\n" % (os.path.basename(url), sha256))
        shutil.rmtree(dest, ignore_errors=True)  # an older pin's files
        os.rename(tree, dest)
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__.split("\n")[0])
    sys.exit(main(*sys.argv[1:]))
