#!/usr/bin/env python3
"""Hugging Face transformers' full prefill on the Llama-3.1-8B shape: the peer of ttft_bench's
FULL mode, run in the same device call so the two are compared side by side.

A LlamaForCausalLM with the Llama-3.1-8B configuration (32 layers, hidden 4096, 32 heads, 8 KV
heads, intermediate 14336, vocab 128256, llama3 RoPE scaling) and random bf16 weights on the
GPU, SDPA attention; one prompt of --tokens tokens (10,272 = 5 documents x 2048 + 32, as
ttft_bench), forward with logits for the last position only (as our FULL computes), then argmax
of those logits: the time to the first token. Median of --runs after --warmup.

usage: hf_prefill.py [--tokens 10272] [--runs 7] [--warmup 2] [--out PATH]
"""
import argparse
import json
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=10272)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("hf_prefill: no CUDA device", file=sys.stderr)
        return 1
    config = LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=a.layers, num_attention_heads=32, num_key_value_heads=8,
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        tie_word_embeddings=False, attn_implementation="sdpa")
    t0 = time.perf_counter()
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # build in bf16: no fp32 copy of 8B weights
    with torch.device(a.device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    torch.set_default_dtype(torch.float32)
    model.eval()
    init_s = time.perf_counter() - t0
    ids = torch.randint(0, config.vocab_size, (1, a.tokens), device=a.device)

    keep_kw = None
    for kw in ("logits_to_keep", "num_logits_to_keep"):
        try:
            with torch.inference_mode():
                model(ids[:, :16], use_cache=False, **{kw: 1})
            keep_kw = kw
            break
        except TypeError:
            continue

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def once():
        sync()
        t = time.perf_counter()
        with torch.inference_mode():
            kwargs = {keep_kw: 1} if keep_kw else {}
            out = model(ids, use_cache=False, **kwargs)
            tok = int(out.logits[0, -1].argmax())
        sync()
        return (time.perf_counter() - t) * 1e3, tok

    for _ in range(a.warmup):
        once()
    ms = [once()[0] for _ in range(a.runs)]
    res = {
        "bench": "hf_prefill", "torch": torch.__version__, "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu", "tokens": a.tokens, "layers": a.layers,
        "attn_implementation": "sdpa", "logits_kwarg": keep_kw, "init_s": init_s,
        "ttft_ms": {"median": statistics.median(ms), "min": min(ms), "max": max(ms), "all": ms},
    }
    print(f"hf_prefill: {a.tokens} tokens, {a.layers} layers, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, logits kwarg {keep_kw}: "
          f"median {res['ttft_ms']['median']:.1f} ms (min {min(ms):.1f}, max {max(ms):.1f})")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
