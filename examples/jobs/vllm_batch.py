#!/usr/bin/env python3
"""Offline batch inference with vLLM that tells carbonsched what it did.

Reads prompts from a JSONL file (one `{"prompt": "..."}` per line), generates with vLLM's
offline API (`vllm.LLM.generate`) in chunks, writes `{"prompt", "completion"}` lines, and
after every chunk appends the running totals to `$CARBONSCHED_METRICS_FILE`: prompts, input
tokens (the prompt's token ids) and output tokens (the generated token ids), as counted by
the model's own tokenizer. Needs a GPU node with vLLM installed; not run in carbonsched's CI.

    carbonsched submit --workload llm-chat-8b --gpus 1 --gpu-mem 40 --prompts 5000 -- \\
        python3 examples/jobs/vllm_batch.py --model meta-llama/Llama-3.1-8B-Instruct \\
        --in prompts.jsonl --out answers.jsonl

The operating point, where carbonsched chose one, arrives in the environment
(`CARBONSCHED_MAX_BATCH`, `CARBONSCHED_PRECISION`, `CARBONSCHED_TP`); flags override it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def report(path: str | None, **totals: int) -> None:
    """Append the running totals to the metrics file (nothing when not run by carbonsched)."""
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(f"{key}={value}\n" for key, value in totals.items()))


def read_prompts(path: str) -> list[str]:
    prompts = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    prompts.append(str(json.loads(line)["prompt"]))
                except (ValueError, KeyError, TypeError):
                    raise SystemExit(f"{path}:{n}: expected a JSON object with a \"prompt\"") from None
    return prompts


def main(argv: list[str] | None = None) -> int:
    env = os.environ
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="Hugging Face model id or local path")
    p.add_argument("--in", dest="inp", required=True, help="prompts, JSONL")
    p.add_argument("--out", required=True, help="completions, JSONL")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--chunk", type=int, default=512, help="prompts per generate() call (progress granularity)")
    p.add_argument("--max-batch", type=int, default=int(env.get("CARBONSCHED_MAX_BATCH", 256)),
                   help="vLLM max_num_seqs")
    p.add_argument("--precision", default=env.get("CARBONSCHED_PRECISION", "bf16"), choices=("bf16", "fp8"))
    p.add_argument("--tp", type=int, default=int(env.get("CARBONSCHED_TP", 1)), help="tensor-parallel GPUs")
    args = p.parse_args(argv)

    from vllm import LLM, SamplingParams  # imported late: --help works without vLLM

    prompts = read_prompts(args.inp)
    llm = LLM(model=args.model, tensor_parallel_size=args.tp, max_num_seqs=args.max_batch, dtype="bfloat16",
              quantization="fp8" if args.precision == "fp8" else None)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature)
    metrics = env.get("CARBONSCHED_METRICS_FILE")
    done = tokens_in = tokens_out = 0
    with open(args.out, "w", encoding="utf-8") as out:
        for start in range(0, len(prompts), args.chunk):
            for result in llm.generate(prompts[start:start + args.chunk], params):
                completion = result.outputs[0]
                tokens_in += len(result.prompt_token_ids)
                tokens_out += len(completion.token_ids)
                out.write(json.dumps({"prompt": result.prompt, "completion": completion.text}) + "\n")
                done += 1
            out.flush()
            report(metrics, prompts=done, input_tokens=tokens_in, output_tokens=tokens_out)
    print(f"served {done} prompts ({tokens_in} input, {tokens_out} output tokens)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
