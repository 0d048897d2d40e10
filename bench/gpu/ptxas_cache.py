"""A content-addressed cache of ptxas runs, so that PTX the lit GPU tests assemble again (the same PTX for the same
chip and flags: a chunk of the lowering tests that ptxas-sweep and ptxas-route-* both lower for sm_80, the default
options' kernels of ptxas-mma and sass-budget) goes through ptxas once.

  run_ptxas(ptxas, ["-v", "-arch=sm_90", "-O3"], "x.ptx", "x.cubin")   # what `ptxas -v ... x.ptx -o x.cubin` gives

The cache is on only where $MOE_PTXAS_CACHE names its folder (test/lit.cfg.py sets build/test/GPU/.ptxas-cache);
without it every call runs ptxas. An entry's key is the sha256 of everything the run's result depends on: the PTX
text, the flags, the output's kind (a file or /dev/null), and the ptxas binary (its `--version` text, its resolved
path, size and mtime): a different PTX, flag or toolkit is a different entry, never a stale one. The entry holds
what the run gave: its exit status, stdout and stderr (the -v report the tests read) and the output file's bytes,
so a failed run is a failure again from the cache (a cache hides no failure; it only skips recomputing it).
ptxas's output is a function of those inputs. Entries are written to a temporary file and renamed into place, so
lit's concurrent workers may share the folder: two that miss the same key both run ptxas and write the same entry.
"""

import functools
import hashlib
import json
import os
import subprocess
import tempfile

#: The version of the entries' layout: a change of it starts a new set of entries.
FORMAT = 2


@functools.lru_cache(maxsize=None)
def _ptxas_identity(ptxas):
    """The text that names the ptxas binary `ptxas` in a key: its --version and its resolved file's size and mtime."""
    real = os.path.realpath(ptxas)
    try:
        st = os.stat(real)
        version = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return None
    return f"{real}\0{st.st_size}\0{st.st_mtime_ns}\0{version}"


def cache_dir():
    """The cache's folder ($MOE_PTXAS_CACHE), or None where the cache is off."""
    return os.environ.get("MOE_PTXAS_CACHE") or None


def _key(ptxas, flags, ptx_text, to_file):
    identity = _ptxas_identity(ptxas)
    if identity is None:
        return None
    h = hashlib.sha256()
    for part in (f"format {FORMAT}", identity, json.dumps(list(flags)), "file" if to_file else "null", ptx_text):
        h.update(part.encode())
        h.update(b"\0\1\0")
    return h.hexdigest()


def run_ptxas(ptxas, flags, ptx_path, out_path=os.devnull):
    """`ptxas FLAGS ptx_path -o out_path` as a finished subprocess.CompletedProcess (text stdout and stderr), from
    the cache where $MOE_PTXAS_CACHE names one and it holds the run (out_path's bytes written from it)."""
    cmd = [ptxas, *flags, ptx_path, "-o", out_path]
    folder = cache_dir()
    if folder is None:
        return subprocess.run(cmd, capture_output=True, text=True)
    with open(ptx_path, encoding="utf-8", errors="surrogateescape") as f:
        ptx_text = f.read()
    to_file = out_path != os.devnull
    key = _key(ptxas, flags, ptx_text, to_file)
    if key is None:
        return subprocess.run(cmd, capture_output=True, text=True)
    entry = os.path.join(folder, key[:2], key + ".json")
    try:
        with open(entry) as f:
            rec = json.load(f)
        if to_file and rec["returncode"] == 0:
            with open(out_path, "wb") as f:
                f.write(bytes.fromhex(rec["output"]))
        # (ptxas's messages name the PTX file: this call's, not the one of the run that made the entry)
        stdout, stderr = (rec[k].replace(rec["ptx_path"], ptx_path) for k in ("stdout", "stderr"))
        return subprocess.CompletedProcess(cmd, rec["returncode"], stdout, stderr)
    except (OSError, ValueError, KeyError):
        pass
    proc = subprocess.run(cmd, capture_output=True, text=True)
    rec = {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr, "ptx_path": ptx_path}
    if to_file and proc.returncode == 0:
        with open(out_path, "rb") as f:
            rec["output"] = f.read().hex()
    os.makedirs(os.path.dirname(entry), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(entry), prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(rec, f)
        os.replace(tmp, entry)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return proc
