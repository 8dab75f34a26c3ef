#!/usr/bin/env python3
"""A tiny CPU "inference batch" that tells carbonsched what it did.

It answers `--prompts` made-up prompts (each answer is the prompt's words reversed) in
batches over about `--seconds`, and after every batch appends its running totals to the file
named by `$CARBONSCHED_METRICS_FILE`:

    prompts=1200
    input_tokens=14400
    output_tokens=14400

The last value of each key wins, so a job killed half-way still reports what it finished.
Tokens here are whitespace-separated words; a real job reports its tokenizer's counts (see
`vllm_batch.py`). On an emulated fleet with a truth (`carbonsched daemon --emulate FLEET --truth SPEC`) the
agent tells the job how long its work really takes there: with
`$CARBONSCHED_EMULATED_S_PER_PROMPT` set, the run lasts `--prompts` x that many seconds
(`--seconds` is ignored), as a real batch would on the GPUs the truth describes. Run it as a job:

    carbonsched submit --workload llm-inference --prompts 20000 -- \\
        python3 examples/jobs/tiny_batch.py --prompts 20000 --seconds 3
"""

from __future__ import annotations

import argparse
import os
import random
import time

WORDS = ("carbon", "grid", "joule", "token", "prompt", "watt", "batch", "zone", "forecast", "GPU")


def report(path: str | None, **totals: int) -> None:
    """Append the running totals to the metrics file (nothing when not run by carbonsched)."""
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(f"{key}={value}\n" for key, value in totals.items()))


def emulated_seconds(prompts: int, s_per_prompt: str | None, default_s: float) -> float:
    """How long the work takes: by the emulated truth's pace when the agent gives one."""
    try:
        pace = float(s_per_prompt) if s_per_prompt else None
    except ValueError:
        pace = None
    return prompts * pace if pace is not None and pace >= 0 else default_s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=1.0, help="spread the work over about this long "
                   "(on an emulated fleet with a truth: prompts x $CARBONSCHED_EMULATED_S_PER_PROMPT)")
    p.add_argument("--batches", type=int, default=4)
    args = p.parse_args(argv)
    metrics = os.environ.get("CARBONSCHED_METRICS_FILE")
    seconds = emulated_seconds(args.prompts, os.environ.get("CARBONSCHED_EMULATED_S_PER_PROMPT"), args.seconds)
    rng = random.Random(0)
    started = time.monotonic()
    done = tokens_in = tokens_out = 0
    per_batch = -(-args.prompts // args.batches)
    for b in range(args.batches):
        n = min(per_batch, args.prompts - done)
        for _ in range(n):
            prompt = [rng.choice(WORDS) for _ in range(rng.randint(4, 20))]
            answer = list(reversed(prompt))
            tokens_in += len(prompt)
            tokens_out += len(answer)
        done += n
        report(metrics, prompts=done, input_tokens=tokens_in, output_tokens=tokens_out)
        # paced by the clock, so the work's own CPU time does not add to the run
        time.sleep(max(0.0, started + seconds * (b + 1) / args.batches - time.monotonic()))
    print(f"served {done} prompts ({tokens_in} input, {tokens_out} output tokens)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
