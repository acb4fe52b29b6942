"""etch.TextGenerator on the tiny llama fixture, with a one-token-per-byte tokenizer.

The fixture's decode inputs are the official runtime's greedy tokens after its prompt,
so greedy generation from that prompt must produce them.
"""

import numpy as np
import pytest

import etch
from conftest import FIXTURES, byte_tokenizer, manifest

TINY_LLAMA = FIXTURES / "tiny_llama_fp32.pte"
FIXTURE = next(f for f in manifest()["fixtures"] if f["name"] == "tiny_llama_fp32")


def official_greedy():
    """The prompt and the greedy continuation the official runtime produced."""
    calls = [c for c in FIXTURE["calls"] if c["method"] == "forward"]
    tokens = [np.load(FIXTURES / c["inputs"][0]["npy"]).reshape(-1).tolist() for c in calls]
    return tokens[0], [t for step in tokens[1:] for t in step]


@pytest.fixture(scope="module")
def generator(tmp_path_factory) -> etch.TextGenerator:
    tokenizer = byte_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")
    return etch.TextGenerator(TINY_LLAMA, tokenizer, threads=1, load_mode="read")


def test_greedy_tokens_match_the_official_runtime(generator: etch.TextGenerator) -> None:
    prompt, official = official_greedy()
    out = generator.generate(prompt, max_new_tokens=len(official) + 1, ignore_eos=True)
    assert out["prompt_token_ids"] == prompt
    # The fixture's last decode input is the official runtime's last greedy token.
    assert out["generated_token_ids"][: len(official)] == official
    assert out["stop_reason"] == "max_new_tokens"
    stats = out["stats"]
    for key in ("prompt_tokens", "generated_tokens", "prefill_ms", "decode_tokens_per_second", "threads"):
        assert key in stats, stats
    assert stats["generated_tokens"] == len(official) + 1
    assert isinstance(out["text"], str)


def test_each_call_starts_from_an_empty_context(generator: etch.TextGenerator) -> None:
    prompt, _ = official_greedy()
    first = generator.generate(prompt, max_new_tokens=4, ignore_eos=True)
    second = generator.generate(prompt, max_new_tokens=4, ignore_eos=True)
    assert first["generated_token_ids"] == second["generated_token_ids"]


def test_text_prompts_are_tokenised_as_given(generator: etch.TextGenerator) -> None:
    assert generator.encode("hi!") == [ord("h"), ord("i"), ord("!")]
    assert generator.decode([ord("o"), ord("k")]) == "ok"
    out = generator.generate("hello", max_new_tokens=3, ignore_eos=True)
    assert out["prompt_token_ids"] == list(b"hello")


def test_stream_yields_the_text_of_generate(generator: etch.TextGenerator) -> None:
    prompt, _ = official_greedy()
    whole = generator.generate(prompt, max_new_tokens=12, ignore_eos=True)
    stream = generator.stream(prompt, max_new_tokens=12, ignore_eos=True)
    assert stream.result is None
    pieces = list(stream)
    assert "".join(pieces) == whole["text"]
    assert stream.result is not None
    assert stream.result["generated_token_ids"] == whole["generated_token_ids"]
    assert list(stream) == []


def test_stream_dropped_early_leaves_the_generator_usable(generator: etch.TextGenerator) -> None:
    prompt, official = official_greedy()
    stream = generator.stream(prompt, max_new_tokens=8, ignore_eos=True)
    next(iter(stream), None)
    del stream
    out = generator.generate(prompt, max_new_tokens=len(official), ignore_eos=True)
    assert out["generated_token_ids"] == official


def test_generate_inside_a_stream_loop_does_not_deadlock(generator: etch.TextGenerator) -> None:
    prompt, official = official_greedy()
    whole = generator.generate(prompt, max_new_tokens=20, ignore_eos=True)
    pieces = []
    for piece in generator.stream(prompt, max_new_tokens=20, ignore_eos=True):
        pieces.append(piece)
        assert generator.metadata["vocab_size"] == 256
        inner = generator.generate(prompt, max_new_tokens=len(official), ignore_eos=True)
        assert inner["generated_token_ids"] == official
    assert "".join(pieces) == whole["text"]


def test_sampling_is_seeded(generator: etch.TextGenerator) -> None:
    prompt, _ = official_greedy()
    a = generator.generate(prompt, max_new_tokens=8, temperature=0.8, top_k=20, top_p=0.9, seed=7, ignore_eos=True)
    b = generator.generate(prompt, max_new_tokens=8, temperature=0.8, top_k=20, top_p=0.9, seed=7, ignore_eos=True)
    assert a["generated_token_ids"] == b["generated_token_ids"]


def test_metadata(generator: etch.TextGenerator) -> None:
    meta = generator.metadata
    assert meta["max_context_len"] == 64 and meta["vocab_size"] == 256


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"prompt": ""}, ValueError, "empty"),
        ({"prompt": "x" * 200}, ValueError, "context"),
        ({"prompt": [999]}, ValueError, "vocabulary"),
        ({"prompt": "hi", "temperature": -1.0}, ValueError, "temperature"),
        ({"prompt": "hi", "chat": True}, etch.EtchError, "chat_template"),
        ({"prompt": "hi", "chat": True, "chat_template": "nope"}, etch.EtchError, "nope"),
        ({"prompt": 3}, TypeError, "prompt"),
    ],
)
def test_bad_requests(generator: etch.TextGenerator, kwargs, error, words) -> None:
    with pytest.raises(error, match=words):
        generator.generate(**kwargs)
    with pytest.raises(error, match=words):
        list(generator.stream(**kwargs))


def test_bad_files(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        etch.TextGenerator(TINY_LLAMA, tmp_path / "missing.json")
    with pytest.raises(FileNotFoundError, match="model"):
        etch.TextGenerator(tmp_path / "missing.pte", tmp_path / "missing.json")
    big = byte_tokenizer(tmp_path / "big.json", extra=5000)
    with pytest.raises(etch.EtchError, match="does not match"):
        etch.TextGenerator(TINY_LLAMA, big)
