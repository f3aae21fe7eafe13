# Shared by benches/claim-asap.sh and claim-gaia.sh: hold BENCH_LOCK over whole rows, and keep
# finished runs on RESUME=1.
# row_lock/row_unlock: hold BENCH_LOCK (fd 9, closed in the ranks) over whole rows, released after
# the row that passes HOLD_S [150] seconds of holding (about one run of the 32-rank benches that
# shared the lock on 2026-11-28: one wait a run made each row wait minutes) and at the end
# (`row_unlock final`).
HOLD_S=${HOLD_S:-150}
lock_since=
row_lock() { if [ -n "${BENCH_LOCK:-}" ] && [ -z "$lock_since" ]; then exec 9>>"$BENCH_LOCK"; flock 9; lock_since=$SECONDS; fi; }
row_unlock() {
    if [ -n "$lock_since" ] && { [ "${1:-}" = final ] || [ $((SECONDS - lock_since)) -ge "$HOLD_S" ]; }; then
        flock -u 9; exec 9>&-; lock_since=
    fi
}
# A run whose metrics already hold a summary is kept (RESUME=1 keeps OUTDIR's runs: a session cut
# short can be continued into the same directory).
have_run() { [ "${RESUME:-0}" = 1 ] && [ -s "$1.jsonl" ] && grep -q '"event":"summary"' "$1.jsonl"; }
