#!/usr/bin/env bash
# Times the whole `make test` (issue 44 item 4), optionally beside CPU burners.
#
#   benches/suite-time.sh                 # quiet: make test once, timed
#   BURNERS=2 benches/suite-time.sh       # beside two `yes > /dev/null`, each in a session of its own
#   TEST_JOBS=4 benches/suite-time.sh     # the runner's binaries at a time (default 3)
#
# Run it twice for "after the build": the first run compiles what is missing. Each burner gets
# a session of its own (setsid) so the kernel's autogroups weigh it like one more test binary;
# two burners from one shell would share one group and weigh half as much. The log goes to
# LOG [runs/suite-time-DATE.log]; the last lines printed are the runner's slowest binaries, its
# total, cargo's summed test counts and /usr/bin/time's wall and CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
BURNERS=${BURNERS:-0}
mkdir -p runs
LOG=${LOG:-runs/suite-time-$(date -u +%Y%m%d-%H%M%S).log}
pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop EXIT
for _ in $(seq 1 "$BURNERS"); do setsid yes > /dev/null & pids+=($!); done
echo "# make test, TEST_JOBS=${TEST_JOBS:-3}, $BURNERS burner(s), load $(cut -d' ' -f1-3 /proc/loadavg) at the start; log $LOG"
status=0
/usr/bin/time -v make test > "$LOG" 2>&1 || status=$?
echo "# load $(cut -d' ' -f1-3 /proc/loadavg) at the end; make test exit $status"
grep -A9 '^tests/suite.py: [0-9]* binaries' "$LOG" || true
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "%d passed, %d failed\n", p, f }' "$LOG"
grep -E 'Elapsed|User time|System time' "$LOG" || true
exit "$status"
