#!/usr/bin/env python3
"""Exports a full-size LLM architecture with seeded random weights through ExecuTorch's
own LLM exporter (``export_llama``, pinned executorch 1.5.1), for speed measurements
only: the weights are noise, so the tokens mean nothing, but every tensor has the real
shape, so a forward moves the real number of bytes.

Architectures (``--arch``), their ``params.json`` as upstream ships it in
``examples/models/<family>/config`` (not in the wheel, so written here):

* ``qwen3-0.6b``: Qwen3-0.6B (28 layers, dim 1024, GQA 16/8, head 128, QK norm,
  vocab 151936).
* ``qwen3.5-0.8b``: Qwen3.5-0.8B (24 layers, 18 Gated DeltaNet and 6 gated full
  attention, dim 1024, vocab 248320), as upstream's ``0_8b_config.json``.

Recipes (``--recipe``): ``8da4w`` (default; int8 dynamic activations x int4 group-32
weights through XNNPACK, int8 embedding: ``-X --xnnpack-extended-ops -qmode 8da4w
-G 32 -E 8,0``), as ``tools/models/smollm2.py`` builds SmolLM2; ``fp32-static`` (fp32
through XNNPACK with static shapes, upstream's Qwen3.5 recipe: ``-X
--xnnpack-extended-ops --disable_dynamic_shape``).

Usage:
    tools/fixtures/.venv/bin/python tools/models/random_llm.py --arch qwen3-0.6b \\
        [--recipe 8da4w] [--out models/qwen3-0.6b-random] [--force]
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_SEQ_LEN = 256
MAX_CONTEXT_LEN = 1024

ARCHS = {
    "qwen3-0.6b": {
        "label": "qwen3_0_6b",
        "metadata": {"get_bos_id": 151643, "get_eos_ids": [151645]},
        "params": {
            "dim": 1024,
            "ffn_dim_multiplier": 1,
            "hidden_dim": 3072,
            "n_heads": 16,
            "head_dim": 128,
            "n_kv_heads": 8,
            "n_layers": 28,
            "norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "use_scaled_rope": False,
            "vocab_size": 151936,
            "use_hf_rope": True,
            "attention_qkv_bias": False,
            "use_qk_norm": True,
            "qk_norm_before_rope": True,
        },
    },
    "qwen3.5-0.8b": {
        "label": "qwen3_5_0_8b",
        "metadata": {"get_bos_id": 248045, "get_eos_ids": [248046, 248044]},
        # upstream's examples/models/qwen3_5/config/0_8b_config.json
        "params": {
            "dim": 1024,
            "hidden_dim": 3584,
            "n_heads": 8,
            "head_dim": 256,
            "n_kv_heads": 2,
            "n_layers": 24,
            "norm_eps": 1e-06,
            "rope_theta": 10000000.0,
            "use_scaled_rope": False,
            "vocab_size": 248320,
            "use_hf_rope": True,
            "partial_rotary_factor": 0.25,
            "attention_qkv_bias": False,
            "use_qk_norm": True,
            "qk_norm_before_rope": True,
            "attention_type": "mha",
            "use_q_gate": True,
            "rms_norm_add_unit_offset": True,
            "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 16,
            "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 6,
        },
    },
}

RECIPES = {
    "8da4w": ["-X", "--xnnpack-extended-ops", "-qmode", "8da4w", "-G", "32", "-E", "8,0"],
    # upstream's Qwen3.5 recipe (examples/models/qwen3_5/config/qwen3_5_xnnpack_fp32.yaml)
    "fp32-static": ["-X", "--xnnpack-extended-ops", "--disable_dynamic_shape"],
}


def random_checkpoint(params: dict, dest: Path, seed: int) -> None:
    """A state dict of ExecuTorch's Llama transformer with N(0, 0.02) weights (norms 1)."""
    import torch
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    torch.manual_seed(seed)
    args = ModelArgs(max_seq_len=MAX_SEQ_LEN, max_context_len=MAX_CONTEXT_LEN, use_kv_cache=False, **params)
    model = construct_transformer(args)
    state = {}
    with torch.no_grad():
        for name, p in model.state_dict().items():
            if name.endswith(("conv_state", "recurrent_state")):
                state[name] = torch.zeros_like(p)  # Gated DeltaNet state buffers
            elif "norm" in name:
                state[name] = torch.ones_like(p)
            elif p.dtype.is_floating_point and p.dim() >= 2:
                state[name] = torch.randn_like(p) * 0.02
            else:
                state[name] = p.clone()
    torch.save(state, dest)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=sorted(ARCHS), default="qwen3-0.6b")
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="8da4w")
    ap.add_argument("--out", type=Path, help="output folder (default: models/<arch>-random)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="rebuild an existing program")
    a = ap.parse_args()
    arch = ARCHS[a.arch]
    out = a.out or ROOT / "models" / f"{a.arch}-random"
    out.mkdir(parents=True, exist_ok=True)
    pte = out / f"model_{a.recipe}.pte"
    if pte.exists() and not a.force:
        print(f"{pte} exists (--force rebuilds it)")
        return
    (out / "params.json").write_text(json.dumps(arch["params"], indent=1) + "\n")
    with tempfile.TemporaryDirectory(prefix="random-llm-", dir=out) as tmp:
        tmp = Path(tmp)
        # No "int8"/"8da4w" in the checkpoint's name: the loader switches on it.
        ckpt = tmp / "random_fp32.pth"
        t0 = time.perf_counter()
        random_checkpoint(arch["params"], ckpt, a.seed)
        print(f"random checkpoint in {time.perf_counter() - t0:.0f} s")
        cmd = [
            sys.executable, "-m", "executorch.examples.models.llama.export_llama",
            "--model", arch["label"],  # a label: with -c nothing is downloaded
            "-c", str(ckpt), "-p", str(out / "params.json"),
            "-kv", "--use_sdpa_with_kv_cache", "-d", "fp32",
            "--max_seq_length", str(MAX_SEQ_LEN), "--max_context_length", str(MAX_CONTEXT_LEN),
            *RECIPES[a.recipe],
            "--metadata", json.dumps(arch["metadata"], separators=(",", ":")),
            "-o", str(tmp), "-n", str(tmp / "model.pte"),
        ]
        log = out / f"export_{a.recipe}.log"
        t0 = time.perf_counter()
        with open(log, "w") as lf:
            lf.write("$ " + " ".join(cmd) + "\n")
            lf.flush()
            rc = subprocess.run(cmd, cwd=tmp, stdout=lf, stderr=subprocess.STDOUT).returncode
        if rc != 0 or not (tmp / "model.pte").exists():
            tail = "\n".join(log.read_text().splitlines()[-30:])
            raise SystemExit(f"export_llama failed (rc {rc}), see {log}:\n{tail}")
        (tmp / "model.pte").replace(pte)
        secs = time.perf_counter() - t0
    (out / "build.json").write_text(json.dumps({
        "arch": a.arch, "recipe": a.recipe, "seed": a.seed, "export_seconds": round(secs, 1),
        "max_seq_length": MAX_SEQ_LEN, "max_context_length": MAX_CONTEXT_LEN,
    }, indent=1) + "\n")
    print(f"wrote {pte} ({pte.stat().st_size / 1e6:.1f} MB) in {secs:.0f} s")


if __name__ == "__main__":
    main()
