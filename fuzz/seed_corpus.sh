#!/bin/sh
# Copies the test fixtures into the fuzzing corpus of the load_program target.
# Run from the repository root: fuzz/seed_corpus.sh
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
corpus="$root/fuzz/corpus/load_program"
mkdir -p "$corpus"
for f in "$root"/tests/fixtures/*.pte "$root"/crates/format/tests/data/*.ptd; do
    [ -e "$f" ] && cp "$f" "$corpus/"
done
echo "seeded $(ls "$corpus" | wc -l) files into $corpus"
