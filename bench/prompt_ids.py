#!/usr/bin/env python3
"""The fixed benchmark prompt: N deterministic token ids (default 128), shared by
the etch and official sides. Prints them comma-separated."""
import sys


def prompt_ids(n: int = 128):
    return [(i * 7919) % 49000 + 100 for i in range(n)]


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    print(",".join(map(str, prompt_ids(n))))
