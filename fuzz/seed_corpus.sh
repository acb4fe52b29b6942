#!/bin/sh
# Seeds the fuzzing corpora from the test fixtures. Run from anywhere:
#   fuzz/seed_corpus.sh
# load_program: every fixture .pte and the sample .ptd.
# bundled_program: the fixture bundled programs (.bpte).
# xnnpack_payload: the delegate payloads (XH00 header onwards) inside the XNNPACK fixtures.
# npy: the fixtures' recorded inputs and outputs (one per distinct size).
# tokenizer: small tokenizer files of each format written by seed_tokenizers.py (needs
#   python3; the `tokenizers` package for the tokenizer.json seed, else that one is skipped).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
corpus="$root/fuzz/corpus"
mkdir -p "$corpus/load_program" "$corpus/bundled_program" "$corpus/xnnpack_payload" "$corpus/npy" "$corpus/tokenizer"
for f in "$root"/tests/fixtures/*.pte "$root"/crates/format/tests/data/*.pte "$root"/crates/format/tests/data/*.ptd; do
    [ -e "$f" ] && cp "$f" "$corpus/load_program/"
done
for f in "$root"/tests/fixtures/*.bpte; do
    [ -e "$f" ] && cp "$f" "$corpus/bundled_program/"
done
python3 - "$root/tests/fixtures" "$corpus/xnnpack_payload" <<'PY'
import pathlib, struct, sys
src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
n = 0
for pte in sorted(src.glob("*.pte")):
    data = pte.read_bytes()
    at = data.find(b"XH00")
    k = 0
    while at >= 4:
        start = at - 4
        fb_off, fb_size, c_off = struct.unpack_from("<III", data, at + 6)
        (c_size,) = struct.unpack_from("<Q", data, at + 18)
        end = start + max(fb_off + fb_size, c_off + c_size)
        if end <= len(data) and end - start <= 1 << 20:
            (dst / f"{pte.stem}.{k}.bin").write_bytes(data[start:end])
            n += 1
            k += 1
        at = data.find(b"XH00", at + 4)
print(f"xnnpack_payload: {n} payloads")
PY
seen=""
for f in "$root"/tests/fixtures/*/*.npy; do
    size=$(wc -c < "$f")
    case " $seen " in *" $size "*) continue ;; esac
    seen="$seen $size"
    [ "$size" -le 65536 ] && cp "$f" "$corpus/npy/$(basename "$(dirname "$f")").$(basename "$f")"
done
python3 "$root/fuzz/seed_tokenizers.py" "$corpus/tokenizer"
for t in load_program bundled_program xnnpack_payload npy tokenizer; do
    echo "$t: $(ls "$corpus/$t" | wc -l) seeds"
done
