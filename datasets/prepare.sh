#!/usr/bin/env bash
# Prepares the real public data sets asap-train's examples, tests and benchmarks use, from Debian
# packages, into datasets/out/ (never committed: see datasets/README.md for the licences).
#   datasets/prepare.sh          prepare everything (installs the packages if missing, as root)
# Idempotent: a set that is already there is left alone.
set -euo pipefail
cd "$(dirname "$0")"
out=out
mkdir -p "$out"
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)

need() { # need PACKAGE...: install the Debian packages that are missing
    local missing=()
    for p in "$@"; do dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p"); done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "datasets: installing ${missing[*]}"
        $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

# MovieLens "latest-small" (100,004 ratings, 671 users, 9,066 movies), as shipped by r-cran-dslabs.
# R reads the package's data once here; training never needs R. Ids are made dense and 0-based
# (movie ids go up to 163,949, which would waste 16x the factors), rows are shuffled (seed 1) so
# every rank's byte-range shard is an IID sample, and 10 % are held out (seed 1).
if [ ! -s "$out/movielens-train.ratings" ] || [ ! -s "$out/movielens-test.ratings" ]; then
    need r-cran-dslabs
    Rscript --vanilla - "$out" <<'RSCRIPT'
out <- commandArgs(trailingOnly = TRUE)[1]
data("movielens", package = "dslabs")
m <- movielens
users <- match(m$userId, sort(unique(m$userId))) - 1L
items <- match(m$movieId, sort(unique(m$movieId))) - 1L
d <- data.frame(u = users, i = items, r = m$rating)
set.seed(1)
d <- d[sample.int(nrow(d)), ]
test <- seq_len(nrow(d)) <= round(0.1 * nrow(d))
write.table(d[!test, ], file.path(out, "movielens-train.ratings.tmp"), row.names = FALSE, col.names = FALSE, quote = FALSE)
write.table(d[test, ], file.path(out, "movielens-test.ratings.tmp"), row.names = FALSE, col.names = FALSE, quote = FALSE)
cat(sprintf("datasets: MovieLens: %d ratings (%d held out), %d users, %d items\n", nrow(d), sum(test), max(users) + 1, max(items) + 1))
RSCRIPT
    mv "$out/movielens-train.ratings.tmp" "$out/movielens-train.ratings"
    mv "$out/movielens-test.ratings.tmp" "$out/movielens-test.ratings"
fi

# LIBSVM: heart_scale (270 x 13) from liblinear-tools.
if [ ! -s "$out/heart_scale.svm" ]; then
    need liblinear-tools
    cp /usr/share/doc/liblinear-tools/examples/heart_scale "$out/heart_scale.svm"
fi
# Fashion-MNIST (IDX) stays where dataset-fashion-mnist installs it.
need dataset-fashion-mnist
echo "datasets: ready in datasets/$out (Fashion-MNIST in /usr/share/datasets/fashion-mnist)"
