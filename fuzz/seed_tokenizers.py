"""Writes small tokenizer files of each format etch reads, as seeds for the tokenizer
fuzz target. Each file is prefixed by the selector byte the target reads first
(0: tokenizer.json, 1: tiktoken, 2: llama2.c tokenizer.bin, 3: detect)."""

import base64
import json
import pathlib
import struct
import sys

out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
text = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you today?",
    "ünïcödé 你好 emoji 🙂 tabs\tand\nnewlines",
]


def write(name: str, selector: int, body: bytes) -> None:
    (out / name).write_bytes(bytes([selector]) + body)


# tiktoken: lines of "base64(token) rank".
tokens = [bytes([b]) for b in range(256)] + [b"th", b"the", b" the", b"he", b"llo", b"ello"]
tiktoken = b"".join(base64.b64encode(t) + b" %d\n" % i for i, t in enumerate(tokens))
write("tiktoken.txt", 1, tiktoken)
write("tiktoken.detect.txt", 3, tiktoken)

# llama2.c: u32 max_token_length, then per token: f32 score, i32 length, bytes.
vocab = [b"<unk>", b"<s>", b"</s>"] + [b"<0x%02X>" % b for b in range(256)] + [
    b" the", b"he", b"llo", b"\xe2\x96\x81t", b"o"]
body = struct.pack("<I", max(len(v) for v in vocab))
for i, v in enumerate(vocab):
    body += struct.pack("<fi", -float(i), len(v)) + v
write("llama2c.bin", 2, body)
write("llama2c.detect.bin", 3, body)

# tokenizer.json: a byte-level BPE trained on the sample text, and a hand-written
# minimal WordLevel one.
minimal = {
    "version": "1.0",
    "added_tokens": [{"id": 0, "content": "<|endoftext|>", "special": True,
                      "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False}],
    "normalizer": None,
    "pre_tokenizer": {"type": "Whitespace"},
    "post_processor": None,
    "decoder": None,
    "model": {"type": "WordLevel", "vocab": {"<|endoftext|>": 0, "hello": 1, "world": 2,
                                              "[UNK]": 3}, "unk_token": "[UNK]"},
}
write("wordlevel.json", 0, json.dumps(minimal).encode())
try:
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
except ImportError:
    print("tokenizer: `tokenizers` not installed, byte-level BPE seed skipped")
else:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text * 20, trainer)
    body = tok.to_str().encode()
    write("bytelevel_bpe.json", 0, body)
    write("bytelevel_bpe.detect.json", 3, body)
