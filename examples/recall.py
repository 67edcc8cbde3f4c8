"""A small GPT trained on associative recall, with numba-flash's attention or torch's SDPA.

The task needs attention to solve: a sequence lists `pairs` key-value pairs, then asks for
the values of `queries` of its keys,

    k1 v1 k2 v2 ... kn vn  SEP  q1 a1 q2 a2 ... qm am        (a_i = the value paired with q_i)

and the model is scored on predicting each a_i from the tokens before it: it must find q_i
among the keys and copy the token after it (an induction head). Keys and values are drawn
from separate halves of the vocabulary, keys without repeats; nothing is downloaded.

    python examples/recall.py --attention both --steps 400 --json recall.json
    python examples/recall.py --attention both --steps 400 --dtype bfloat16 --json bf16.json

trains the same initial model with both attentions on the same batches, with a progress bar,
and prints the largest relative difference of the two loss curves, the final accuracies and
the time per step; --json keeps every step's losses (notebooks/08_training.py plots them).
Without a GPU numba-flash's kernels run on Numba's CUDA simulator, about 10 s a step at
--batch 4: `--steps 3 --batch 4` is a smoke test there.
"""

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Task:
    pairs: int = 4           # key-value pairs listed
    queries: int = 4         # keys asked for afterwards
    keys: int = 16           # distinct key tokens (values as many)

    @property
    def vocab(self):
        return 2 * self.keys + 1            # keys, values, SEP

    @property
    def length(self):
        return 2 * self.pairs + 1 + 2 * self.queries

    def batch(self, batch_size, generator, device="cpu"):
        """(tokens (B, length), targets (B, length) with -100 where nothing is scored)."""
        B, n, m = batch_size, self.pairs, self.queries
        keys = torch.argsort(torch.rand(B, self.keys, generator=generator), dim=1)[:, :n]
        values = torch.randint(self.keys, 2 * self.keys, (B, n), generator=generator)
        asked = torch.randint(0, n, (B, m), generator=generator)
        q_keys, answers = keys.gather(1, asked), values.gather(1, asked)
        sep = torch.full((B, 1), 2 * self.keys)
        tokens = torch.cat([torch.stack([keys, values], 2).flatten(1), sep,
                            torch.stack([q_keys, answers], 2).flatten(1)], 1)
        targets = torch.full_like(tokens, -100)
        first = 2 * n + 1                       # position of q_1; a_i follows q_i
        targets[:, first:-1:2] = answers      # predicted at q_i's position
        return tokens.to(device), targets.to(device)


def sdpa(q, k, v):
    """torch's scaled_dot_product_attention, causal."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def resolved_kernel(kernel, d, dtype):
    """The name of the registered pair that numba-flash runs for `kernel` ("auto" or a name)
    at head dim d on q, k, v of torch `dtype`, on this process's device."""
    import numpy as np
    from numba_flash import arrays, registry
    np_dtype = arrays.BFLOAT16 if dtype == torch.bfloat16 else str(dtype).replace("torch.", "")
    return registry.resolve(kernel, d, np.dtype(np_dtype)).name


def numba_flash_attention(kernel="auto"):
    """numba-flash's attention, causal (the same mask as SDPA's is_causal for Nq = Nk)."""
    from numba_flash.torch import flash_attention

    def attend(q, k, v):
        return flash_attention(q, k, v, causal=True, kernel=kernel)
    return attend


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)          # fused projection: q, k, v are views
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x, attend):
        B, N, W = x.shape
        qkv = self.qkv(self.ln1(x)).view(B, N, 3, self.heads, W // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)             # each (B, H, N, d), not contiguous
        y = attend(q, k, v).transpose(1, 2).reshape(B, N, W)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and learned position embeddings, pre-LayerNorm blocks, a linear head."""

    def __init__(self, vocab, length, width=64, heads=4, layers=2):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(length, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, tokens, attend):
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x, attend)
        return self.head(self.ln(x))


def train(model, task, attend, steps, batch_size, lr=3e-3, seed=0, device="cpu",
          progress=False, desc=None, autocast=None):
    """Train with AdamW on batches drawn from `seed` (the same batches for the same seed);
    autocast: None, or a half dtype the forward runs in under torch.autocast (mixed
    precision: float32 weights, q, k, v and the attention in that dtype).
    Returns dict(loss=[per step], accuracy=[per step], step_seconds=[per step],
    seconds_per_step, first_step_seconds, plans) where accuracy is the fraction of answers
    predicted right (argmax) in that step's batch, and seconds_per_step is the median step
    after the first: the first compiles the kernels (or loads them from the cache) and is kept
    apart. Each step ends in loss.item(), which waits for the GPU, so a step's time is its
    own. plans: numba-flash calls in these steps replayed from a plan and plans made
    (numba_flash.replay: a call like two earlier ones, on tensors of the same shapes, dtypes
    and layout, replays)."""
    import contextlib
    from tqdm import tqdm
    from numba_flash import replay
    generator = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses, accuracies, step_seconds = [], [], []
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    bar = tqdm(range(steps), desc=desc, disable=not progress, file=sys.stderr)
    sync()
    before = dict(replay.counts)
    for _ in bar:
        t0 = time.perf_counter()
        tokens, targets = task.batch(batch_size, generator, device)
        with (torch.autocast(torch.device(device).type, dtype=autocast) if autocast
              else contextlib.nullcontext()):
            logits = model(tokens, attend).float()
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        scored = targets != -100
        accuracies.append((logits.argmax(-1)[scored] == targets[scored]).float().mean().item())
        losses.append(loss.item())
        step_seconds.append(time.perf_counter() - t0)
        bar.set_postfix(loss=f"{losses[-1]:.3f}", acc=f"{accuracies[-1]:.2f}")
    steady = step_seconds[1:] or step_seconds
    return dict(loss=losses, accuracy=accuracies, step_seconds=step_seconds,
                seconds_per_step=statistics.median(steady) if steady else float("nan"),
                first_step_seconds=step_seconds[0] if step_seconds else float("nan"),
                plans={k: replay.counts[k] - before.get(k, 0) for k in ("replayed", "made")})


def compare(task, steps, batch_size, width=64, heads=4, layers=2, lr=3e-3, seed=0,
            device="cpu", dtype=torch.float32, kernel="auto", progress=False):
    """The same initial model (seed) trained with SDPA and with numba-flash on the same
    batches; dtype: float32 or float64 (the model in it), or bfloat16 / float16 (float32
    weights, the forward under torch.autocast in that dtype: mixed precision, q, k, v and
    the attention in half). Returns a dict: per-step losses and accuracies of both, the
    largest relative difference of the losses, seconds per step of both, the settings and
    the pair that ran (`resolved`, for kernel="auto")."""
    half = dtype in (torch.bfloat16, torch.float16)
    torch.manual_seed(seed)
    first = GPT(task.vocab, task.length, width, heads, layers).to(
        device, torch.float32 if half else dtype)
    second = GPT(task.vocab, task.length, width, heads, layers).to(
        device, torch.float32 if half else dtype)
    second.load_state_dict(first.state_dict())
    runs = {}
    for name, model, attend in (("sdpa", first, sdpa),
                                ("numba-flash", second, numba_flash_attention(kernel))):
        runs[name] = train(model, task, attend, steps, batch_size, lr, seed, device, progress,
                           desc=name, autocast=dtype if half else None)
    a, b = runs["sdpa"]["loss"], runs["numba-flash"]["loss"]
    rel = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    return dict(task=asdict(task), steps=steps, batch_size=batch_size, width=width,
                heads=heads, layers=layers, lr=lr, seed=seed, device=str(device),
                dtype=str(dtype).replace("torch.", ""), kernel=kernel,
                resolved=resolved_kernel(kernel, width // heads, dtype),
                max_relative_loss_difference=rel, runs=runs)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attention", choices=("numba-flash", "sdpa", "both"), default="both")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--pairs", type=int, default=Task.pairs)
    parser.add_argument("--queries", type=int, default=Task.queries)
    parser.add_argument("--keys", type=int, default=Task.keys)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kernel", default="auto", help="numba-flash kernel name")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="half: float32 weights, the forward under torch.autocast")
    parser.add_argument("--json", help="write every step's losses and accuracies here")
    args = parser.parse_args(argv)
    task = Task(args.pairs, args.queries, args.keys)
    import numba_flash
    if numba_flash.SIMULATOR and args.attention != "sdpa":
        print("numba-flash runs on Numba's CUDA simulator here (no GPU): about 10 s a training "
              "step at --batch 4 on 2 cores, far more at the default --batch 64; a smoke test "
              "is --steps 3 --batch 4", file=sys.stderr)
    if args.attention == "both":
        result = compare(task, args.steps, args.batch, args.width, args.heads, args.layers,
                         seed=args.seed, device=args.device, kernel=args.kernel, progress=True,
                         dtype=getattr(torch, args.dtype))
        for name, run in result["runs"].items():
            print(f"{name:12} final loss {run['loss'][-1]:.4f}  accuracy (last 10 steps) "
                  f"{sum(run['accuracy'][-10:]) / len(run['accuracy'][-10:]):.3f}  "
                  f"{1e3 * run['seconds_per_step']:.1f} ms/step (median; first step "
                  f"{run['first_step_seconds']:.2f} s)")
        print(f"numba-flash ran kernel {result['resolved']!r}; its calls replayed from plans "
              f"and plans made: {result['runs']['numba-flash']['plans']}")
        print(f"largest relative difference of the loss curves: "
              f"{result['max_relative_loss_difference']:.2e} over {args.steps} steps")
    else:
        torch.manual_seed(args.seed)
        model = GPT(task.vocab, task.length, args.width, args.heads, args.layers).to(args.device)
        attend = sdpa if args.attention == "sdpa" else numba_flash_attention(args.kernel)
        run = train(model, task, attend, args.steps, args.batch, seed=args.seed,
                    device=args.device, progress=True, desc=args.attention,
                    autocast=None if args.dtype == "float32" else getattr(torch, args.dtype))
        result = dict(task=asdict(task), runs={args.attention: run})
        print(f"final loss {run['loss'][-1]:.4f}, accuracy {run['accuracy'][-1]:.3f}, "
              f"{1e3 * run['seconds_per_step']:.1f} ms/step (median; first step "
              f"{run['first_step_seconds']:.2f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
