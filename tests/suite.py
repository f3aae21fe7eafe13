#!/usr/bin/env python3
"""`make test`'s runner: builds every test binary once, then runs the binaries side by side,
longest first, and prints each one's output whole when it ends (cargo's "Running ..." and
"test result:" lines, so .ci/run's total still reads them).

    tests/suite.py                  # every binary, --jobs 3
    tests/suite.py --jobs 1         # one at a time, as `cargo test -- --test-threads=1` did
    tests/suite.py asap train       # only these binaries (names of tests/*.rs, or "lib")
    tests/suite.py --mpich          # also the MPICH subset (the Makefile's MPICH_* variables)
    tests/suite.py --ulfm           # also tests/ulfm.rs against the ULFM build (ULFM_ENV, ULFM_RUN_ENV)

Why side by side: most of a test's wall time is spent waiting, not computing: launchers
starting, ranks sleeping out an emulated link or a declared step, a stopped rank waited for
until --wait-timeout names it. One binary at a time left one of the two cores idle for much of
the 20 minutes the suite took on a quiet machine (the numbers are in docs/testing.md). Every
test already passes beside two CPU burners (its limits are hang guards, never speed claims), so
the other binaries are just more load of the same kind.

Each binary still runs its own tests one at a time (--test-threads=1): the tests of a binary
share scratch directories (parsers_fuzz's tests failed on two threads: one removed the /dev/shm
directory another was writing in), and a test that gains from running jobs side by side does it
itself (bad_input_table's cases, the silent-worker test's two jobs).

Exit status: 0 when every binary passed, 1 otherwise (all binaries run: --no-fail-fast).
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time

# Wall seconds of each binary in a whole-suite run at 3 at a time (2026-11-29, at load 7-12 with
# other work on the machine), used only to start the longest first: the suite lasts at least as
# long as its longest binary, so that one must not start last. A binary missing here (a new test
# file) counts as DEFAULT_SECONDS.
SECONDS = {
    "report": 289,
    "parsers_fuzz": 236,
    "python": 110,
    "slurm": 101,
    "async_mode": 96,
    "mpich": 77,
    "ulfm-ompi5": 65,
    "bosen": 75,
    "preempt": 73,
    "ssp": 60,
    "elastic": 58,
    "compress": 56,
    "asap": 52,
    "train": 42,
}
DEFAULT_SECONDS = 30



def build(cargo, env, extra):
    """`cargo test --no-run` with JSON messages: [(name, source, executable)] of every test
    binary. Compiler messages go to stderr as cargo renders them."""
    cmd = [cargo, "test", "--release", "--locked", "--no-run", "--message-format=json-render-diagnostics"] + extra
    out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, check=False)
    if out.returncode != 0:
        sys.exit(f"tests/suite.py: `{shlex.join(cmd)}` failed (exit {out.returncode}); the compiler's messages are above")
    found = []
    for line in out.stdout.decode().splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable") or not msg["profile"]["test"]:
            continue
        target = msg["target"]
        src = os.path.relpath(target["src_path"])
        name = target["name"] if "test" in target["kind"] else "lib" if "lib" in target["kind"] else f"bin-{target['name']}"
        found.append((name, src, msg["executable"]))
    return found


class Job:
    def __init__(self, name, title, argv, env):
        self.name, self.title, self.argv, self.env = name, title, argv, env
        self.seconds = None
        self.status = None

    def run(self, log):
        t = time.monotonic()
        # A session of its own: the kernel shares the CPU between sessions (autogroups), so each
        # binary gets an equal share whatever its number of ranks, and a bench script that raises
        # its session's priority (benches/priority.sh) raises only its own binary's.
        self.status = subprocess.run(
            self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        ).returncode
        self.seconds = time.monotonic() - t


def jobs_of(binaries, env, only):
    jobs = []
    for name, src, exe in binaries:
        if only and name not in only:
            continue
        title = src if src.startswith("tests/") else f"unittests {src}"
        argv = [exe, "--test-threads=1"]
        jobs.append(Job(name, f"{title} ({os.path.relpath(exe)})", argv, env))
    return jobs


def mpich_job(cargo, mpich_env, subset):
    """The MPICH subset: its binaries built against MPICH (a target directory of their own), run
    with the subset's test names, in one job (the Makefile's MPICH_SUBSET)."""
    env = dict(os.environ, **mpich_env)
    split = subset.index("--")
    built = build(cargo, env, subset[:split])
    names = subset[split + 1 :]
    script = "rc=0; " + " ".join(shlex.join([exe] + names) + " || rc=1;" for _, _, exe in built) + " exit $rc"
    return Job("mpich", "the MPICH subset (" + ", ".join(src for _, src, _ in built) + ")", ["bash", "-c", script], env)


def ulfm_job(cargo, build_env, run_env):
    """tests/ulfm.rs against the ULFM build (a target directory of its own, PyPI's Open MPI 5):
    the in-place tests that the Debian build's run of tests/ulfm.rs skips (the Makefile's
    ULFM_ENV to build, ULFM_RUN_ENV to run)."""
    built = build(cargo, dict(os.environ, **build_env), ["--test", "ulfm"])
    exe = [exe for name, _, exe in built if name == "ulfm"][0]
    env = dict(os.environ, **build_env, **run_env)
    return Job("ulfm-ompi5", f"tests/ulfm.rs against the ULFM build ({os.path.relpath(exe)})", [exe, "--test-threads=1"], env)


def env_pairs(name):
    """KEY=VALUE words of the environment variable `name` as a dict."""
    return dict(kv.split("=", 1) for kv in shlex.split(os.environ[name]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=3, help="binaries at a time (default 3)")
    ap.add_argument("--cargo", default=os.environ.get("CARGO", "cargo"))
    ap.add_argument("--mpich", action="store_true", help="also the MPICH subset (MPICH_ENV and MPICH_SUBSET from the environment)")
    ap.add_argument("--ulfm", action="store_true", help="also tests/ulfm.rs against the ULFM build (ULFM_ENV and ULFM_RUN_ENV from the environment)")
    ap.add_argument("only", nargs="*", help="binaries to run (default: all)")
    args = ap.parse_args()

    env = dict(os.environ)
    binaries = build(args.cargo, env, [])
    unknown = sorted(set(args.only) - {name for name, _, _ in binaries})
    if unknown:
        names = ", ".join(sorted(name for name, _, _ in binaries))
        sys.exit(f"tests/suite.py: no test binary named {', '.join(unknown)}; the binaries are: {names}")
    jobs = jobs_of(binaries, env, set(args.only))
    if args.mpich:
        jobs.append(mpich_job(args.cargo, env_pairs("MPICH_ENV"), shlex.split(os.environ["MPICH_SUBSET"])))
    if args.ulfm:
        jobs.append(ulfm_job(args.cargo, env_pairs("ULFM_ENV"), env_pairs("ULFM_RUN_ENV")))
    jobs.sort(key=lambda j: -SECONDS.get(j.name, DEFAULT_SECONDS))

    start = time.monotonic()
    lock = threading.Lock()
    queue = list(jobs)

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                job = queue.pop(0)
            with tempfile.TemporaryFile() as log:
                job.run(log)
                log.seek(0)
                text = log.read().decode(errors="replace")
            with lock:
                print(f"     Running {job.title}", flush=True)
                sys.stdout.write(text)
                print(f"     ({job.name}: {job.seconds:.0f} s, exit {job.status}, at {time.monotonic() - start:.0f} s)\n", flush=True)

    threads = [threading.Thread(target=worker) for _ in range(max(1, args.jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    failed = [j for j in jobs if j.status != 0]
    total = time.monotonic() - start
    print(f"tests/suite.py: {len(jobs)} binaries, {args.jobs} at a time, in {total:.0f} s")
    for j in sorted(jobs, key=lambda j: -j.seconds)[:8]:
        print(f"  {j.name:20} {j.seconds:6.0f} s")
    if failed:
        print("tests/suite.py: FAILED: " + ", ".join(j.name for j in failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
