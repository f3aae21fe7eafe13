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

# Jane Austen's six novels (r-cran-janeaustenr; public domain texts) as a UCI bag-of-words corpus
# for --model lda: a document is a paragraph (lines up to a blank line), lower-cased letters
# only, English stop words (the common 179-word list) and words seen fewer than 5 times dropped,
# paragraphs left with fewer than 10 tokens dropped. Writes docword.austen.txt + vocab.austen.txt.
if [ ! -s "$out/docword.austen.txt" ] || [ ! -s "$out/vocab.austen.txt" ]; then
    need r-cran-janeaustenr
    Rscript --vanilla - "$out" <<'RSCRIPT'
out <- commandArgs(trailingOnly = TRUE)[1]
stop <- strsplit("i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself yourselves he him his himself she she's her hers herself it it's its itself they them their theirs themselves what which who whom this that that'll these those am is are was were be been being have has had having do does did doing a an the and but if or because as until while of at by for with about against between into through during before after above below to from up down in out on off over under again further then once here there when where why how all any both each few more most other some such no nor not only own same so than too very s t can will just don don't should should've now d ll m o re ve y ain aren aren't couldn couldn't didn didn't doesn doesn't hadn hadn't hasn hasn't haven haven't isn isn't ma mightn mightn't mustn mustn't needn needn't shan shan't shouldn shouldn't wasn wasn't weren weren't won won't wouldn wouldn't mr mrs miss could would must much said", " ")[[1]]
b <- janeaustenr::austen_books()
blank <- trimws(b$text) == ""
para <- cumsum(blank | c(TRUE, b$book[-1] != b$book[-length(b$book)]))
txt <- tapply(b$text[!blank], para[!blank], paste, collapse = " ")
toks <- lapply(strsplit(tolower(txt), "[^a-z]+"), function(w) w[nchar(w) > 1 & !(w %in% stop)])
freq <- table(unlist(toks))
vocab <- sort(names(freq)[freq >= 5])
ids <- lapply(toks, function(w) { i <- match(w, vocab); i[!is.na(i)] })
ids <- ids[lengths(ids) >= 10]
lines <- unlist(lapply(seq_along(ids), function(d) { t <- table(ids[[d]]); sprintf("%d %s %d", d, names(t), as.integer(t)) }))
con <- file(file.path(out, "docword.austen.txt.tmp"), "w")
writeLines(c(as.character(length(ids)), as.character(length(vocab)), as.character(length(lines)), lines), con)
close(con)
writeLines(vocab, file.path(out, "vocab.austen.txt.tmp"))
cat(sprintf("datasets: Austen: %d paragraphs, %d words, %d tokens\n", length(ids), length(vocab), sum(lengths(ids))))
RSCRIPT
    mv "$out/vocab.austen.txt.tmp" "$out/vocab.austen.txt"
    mv "$out/docword.austen.txt.tmp" "$out/docword.austen.txt"
fi

# LIBSVM: heart_scale (270 x 13) from liblinear-tools.
if [ ! -s "$out/heart_scale.svm" ]; then
    need liblinear-tools
    cp /usr/share/doc/liblinear-tools/examples/heart_scale "$out/heart_scale.svm"
fi
# Fashion-MNIST (IDX) stays where dataset-fashion-mnist installs it.
need dataset-fashion-mnist
echo "datasets: ready in datasets/$out (Fashion-MNIST in /usr/share/datasets/fashion-mnist)"
