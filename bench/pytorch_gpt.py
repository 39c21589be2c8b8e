#!/usr/bin/env python3
"""The same GPT as a stepcast model file, trained in PyTorch for tokens/s side by side with
`stepcast run --backend cuda` (bench/gpu-check.sh). GPT-2 architecture: learned positions,
pre-LayerNorm blocks, GeLU (tanh, "gelu_new") 4h MLP, biases, tied embeddings, dense causal
attention through F.scaled_dot_product_attention(is_causal=True); bf16 autocast over fp32
parameters (so fp32 master weights and gradients, as stepcast's mixed precision);
torch.optim.AdamW(fused=True); no torch.compile. Prints one JSON line with tokens/s (median
step after warm-up), step time and peak memory (torch.cuda.max_memory_allocated)."""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def config_of(path, seq_length):
    with open(path) as f:
        m = json.load(f)
    hidden = m.get("hidden_size", m.get("n_embd"))
    heads = m.get("num_attention_heads", m.get("n_head"))
    return {
        "hidden": hidden,
        "layers": m.get("num_hidden_layers", m.get("n_layer")),
        "heads": heads,
        "ffn": m.get("intermediate_size", m.get("n_inner")) or 4 * hidden,
        "vocab": m["vocab_size"],
        "positions": m.get("max_position_embeddings", m.get("n_positions")),
        "seq": seq_length or m["seq_length"],
        "eps": m.get("layer_norm_epsilon", 1e-5),
    }


class Block(nn.Module):
    def __init__(self, c, dropout):
        super().__init__()
        self.heads = c["heads"]
        self.ln1 = nn.LayerNorm(c["hidden"], eps=c["eps"])
        self.qkv = nn.Linear(c["hidden"], 3 * c["hidden"])
        self.attn_out = nn.Linear(c["hidden"], c["hidden"])
        self.ln2 = nn.LayerNorm(c["hidden"], eps=c["eps"])
        self.up = nn.Linear(c["hidden"], c["ffn"])
        self.down = nn.Linear(c["ffn"], c["hidden"])
        self.dropout = dropout

    def forward(self, x):
        b, t, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q, k, v = (z.view(b, t, self.heads, h // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(b, t, h)
        x = x + F.dropout(self.attn_out(y), self.dropout, self.training)
        m = self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))
        return x + F.dropout(m, self.dropout, self.training)


class GPT(nn.Module):
    def __init__(self, c, dropout):
        super().__init__()
        self.wte = nn.Embedding(c["vocab"], c["hidden"])
        self.wpe = nn.Embedding(c["positions"], c["hidden"])
        self.blocks = nn.ModuleList(Block(c, dropout) for _ in range(c["layers"]))
        self.ln_f = nn.LayerNorm(c["hidden"], eps=c["eps"])
        self.dropout = dropout
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        x = F.dropout(x, self.dropout, self.training)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied output
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True, help="stepcast model JSON")
    ap.add_argument("--seq", type=int, default=0, help="sequence length (default: the model's)")
    ap.add_argument("--micro-batch", type=int, required=True)
    ap.add_argument("--microbatches", type=int, default=1, help="gradient accumulation steps")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=1e-4)
    args = ap.parse_args()

    torch.manual_seed(1234)
    c = config_of(args.model, args.seq)
    dev = torch.device("cuda")
    model = GPT(c, args.dropout).to(dev)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)
    b, t = args.micro_batch, c["seq"]
    data = torch.randint(0, c["vocab"], (args.microbatches, b, t + 1), device=dev)
    times, losses = [], []
    torch.cuda.reset_peak_memory_stats()
    for step in range(args.steps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for mb in range(args.microbatches):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(data[mb, :, :-1], data[mb, :, 1:]) / args.microbatches
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(loss.item() * args.microbatches)
    timed = times[args.warmup:] or times
    step_s = statistics.median(timed)
    tokens = b * t * args.microbatches
    print(json.dumps({
        "framework": "pytorch " + torch.__version__,
        "model": args.model, "parameters": params, "micro_batch": b, "seq": t,
        "microbatches": args.microbatches, "steps": args.steps,
        "step_time_s": step_s, "tokens_per_s": tokens / step_s,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(),
        "first_loss": losses[0], "last_loss": losses[-1],
        "finite": all(math.isfinite(x) for x in losses),
    }))


if __name__ == "__main__":
    main()
