"""
Train a small GPT on a character-level corpus, in the style of the popular single-file trainers.

Single GPU, mixed precision:
$ python train_gpt.py

Override any config value on the command line:
$ python train_gpt.py --batch_size=16 --max_iters=200 --compile=False

DDP on 4 GPUs of one node:
$ torchrun --standalone --nproc_per_node=4 train_gpt.py

The corpus is synthetic (a seeded stream of words over a small alphabet), so the script runs
without downloads; point `get_batch` at your own tokens for real training.
"""

import math
import os
import sys
import time
from ast import literal_eval
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

accel_device = torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")

# -----------------------------------------------------------------------------
# model


@dataclass
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    bias: bool = False


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


# -----------------------------------------------------------------------------
# data


def make_corpus(n_tokens, vocab_size, seed=1337):
    """A seeded stream of 'words': runs of consecutive token ids separated by token 0."""
    g = torch.Generator().manual_seed(seed)
    pieces = []
    total = 0
    while total < n_tokens:
        start = int(torch.randint(1, vocab_size - 8, (1,), generator=g))
        length = int(torch.randint(2, 8, (1,), generator=g))
        word = torch.arange(start, start + length)
        pieces.append(torch.cat([word, torch.zeros(1, dtype=torch.long)]))
        total += length + 1
    return torch.cat(pieces)[:n_tokens]


# -----------------------------------------------------------------------------
# default config values
batch_size = 8
block_size = 64
n_layer = 2
n_head = 4
n_embd = 64
vocab_size = 64
dropout = 0.0
max_iters = 30
eval_interval = 10
eval_iters = 2
log_interval = 1
learning_rate = 1e-3
min_lr = 1e-4
warmup_iters = 5
weight_decay = 0.1
beta1, beta2 = 0.9, 0.95
grad_clip = 1.0
gradient_accumulation_steps = 2
seed = 1337
backend = "nccl"  # 'nccl', 'gloo', etc.
device = (torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")).type  # 'cpu', 'cuda', 'cuda:0', 'cuda:1' etc.
dtype = "bfloat16" if torch.accelerator.is_available() and (torch.cuda.is_bf16_supported() if accel_device.type == "cuda" else accel_device.type != "cpu") else "float16"
compile = True  # use PyTorch 2.0 to compile the model to be faster
# -----------------------------------------------------------------------------


def apply_overrides(argv):
    """--key=value arguments override the config values above (literal_eval'd when possible)."""
    for arg in argv:
        assert arg.startswith("--") and "=" in arg, f"expected --key=value, got {arg}"
        key, val = arg[2:].split("=", 1)
        assert key in globals(), f"unknown config key: {key}"
        try:
            val = literal_eval(val)
        except (SyntaxError, ValueError):
            pass
        print(f"overriding: {key} = {val!r}")
        globals()[key] = val


def get_lr(it):
    """Linear warm-up, then cosine decay to min_lr."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    ratio = (it - warmup_iters) / max(1, max_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def main():
    global device
    apply_overrides(sys.argv[1:])

    # various inits, derived attributes, I/O setup
    ddp = int(os.environ.get("LOCAL_RANK", -1)) != -1  # is this a ddp run?
    if ddp:
        init_process_group(backend=backend)
        ddp_rank = int(os.environ["RANK"])
        ddp_local_rank = int(os.environ["LOCAL_RANK"])
        ddp_world_size = int(os.environ["WORLD_SIZE"])
        device = f"cuda:{ddp_local_rank}"
        if accel_device.type == "cuda":
            torch.accelerator.set_device_index(device)
        master_process = ddp_rank == 0  # this process will do logging, checkpointing etc.
        seed_offset = ddp_rank  # each process gets a different seed
    else:
        master_process = True
        seed_offset = 0
        ddp_world_size = 1
    tokens_per_iter = gradient_accumulation_steps * ddp_world_size * batch_size * block_size
    if master_process:
        print(f"tokens per iteration will be: {tokens_per_iter:,}")

    torch.manual_seed(seed + seed_offset)
    torch.backends.cuda.matmul.allow_tf32 = True  # allow tf32 on matmul
    torch.backends.cudnn.allow_tf32 = True  # allow tf32 on cudnn
    device_type = "cuda" if "cuda" in device else "cpu"  # for later use in torch.autocast
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
        dtype
    ]
    ctx = torch.amp.autocast(device_type=accel_device.type, enabled=dtype != "float32", dtype=ptdtype)

    data = make_corpus(20_000, vocab_size)
    n = int(0.9 * len(data))
    splits = {"train": data[:n], "val": data[n:]}
    g = torch.Generator().manual_seed(seed + seed_offset)

    def get_batch(split):
        source = splits[split]
        ix = torch.randint(len(source) - block_size, (batch_size,), generator=g)
        x = torch.stack([source[i : i + block_size] for i in ix])
        y = torch.stack([source[i + 1 : i + 1 + block_size] for i in ix])
        if device_type == "cuda":
            # pin arrays x,y, which allows us to move them to GPU asynchronously (non_blocking=True)
            x, y = x.pin_memory().to(device if accel_device.type == "cuda" else accel_device, non_blocking=True), y.pin_memory().to(device if accel_device.type == "cuda" else accel_device, non_blocking=True)
        else:
            x, y = x.to(device if accel_device.type == "cuda" else accel_device), y.to(device if accel_device.type == "cuda" else accel_device)
        return x, y

    config = GPTConfig(
        block_size=block_size,
        vocab_size=vocab_size,
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        dropout=dropout,
    )
    model = GPT(config)
    model.to(device if accel_device.type == "cuda" else accel_device)
    if master_process:
        print(f"number of parameters: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M")

    # initialize a GradScaler. If enabled=False scaler is a no-op
    scaler = torch.amp.GradScaler(accel_device.type, enabled=(dtype == "float16"))
    optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2))

    if compile:
        print("compiling the model... (takes a ~minute)")
        model = torch.compile(model)
    if ddp:
        model = DDP(model, device_ids=[ddp_local_rank] if accel_device.type == "cuda" else None)
    raw_model = model.module if ddp else model

    @torch.no_grad()
    def estimate_loss():
        out = {}
        model.eval()
        for split in ["train", "val"]:
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                X, Y = get_batch(split)
                with ctx:
                    _, loss = model(X, Y)
                losses[k] = loss.item()
            out[split] = losses.mean()
        model.train()
        return out

    X, Y = get_batch("train")
    t0 = time.time()
    for iter_num in range(max_iters + 1):
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr

        if iter_num % eval_interval == 0 and master_process:
            losses = estimate_loss()
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if iter_num == max_iters:
            break

        for micro_step in range(gradient_accumulation_steps):
            if ddp:
                # only sync gradients at the last micro step
                model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
            with ctx:
                _, loss = model(X, Y)
                loss = loss / gradient_accumulation_steps
            X, Y = get_batch("train")  # prefetch the next batch while the GPU works
            scaler.scale(loss).backward()
        if grad_clip != 0.0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

        if torch.accelerator.is_available():
            torch.accelerator.synchronize()
        t1 = time.time()
        dt, t0 = t1 - t0, t1
        if iter_num % log_interval == 0 and master_process:
            lossf = loss.item() * gradient_accumulation_steps
            mem = (torch.accelerator.memory.max_memory_allocated() if torch.accelerator.is_available() else 0) / 2**20
            print(
                f"iter {iter_num}: loss {lossf:.6f}, lr {lr:.2e}, time {dt * 1000:.2f}ms, "
                f"mem {mem:.1f}MiB"
            )

    if master_process:
        print(f"done: {max_iters} iterations, final model has {len(raw_model.state_dict())} tensors")
    if ddp:
        destroy_process_group()


if __name__ == "__main__":
    main()
