"""A module with a CUDA idiom on every line, of any length: the codemod's cost per line.

Thirty kinds of line, repeated in turn (devices, `.cuda()`, memory queries, seeds, events,
streams, availability tests, `is_cuda`, autocast, ...): most are fixed, some reported. The
same lines stand at the module's top level, in a function and in a training loop, where
different rules look at them. `tests/test_linear_cost.py` counts the work at n and 2n lines;
`benchmarks/rewrite_speed.py` times 20,000 and 50,000 lines against libcst's own parse.
"""

from __future__ import annotations

LINES = (
    "x{i} = torch.randn(3).cuda()",
    'y{i} = torch.zeros(2, device="cuda")',
    "torch.cuda.synchronize()",
    "m{i} = torch.cuda.memory_allocated()",
    't{i} = y{i}.to("cuda:0")',
    "torch.cuda.manual_seed({i})",
    'd{i} = torch.device("cuda")',
    "n{i} = torch.cuda.device_count()",
    "torch.cuda.empty_cache()",
    "s{i} = torch.cuda.Stream()",
    "ok{i} = torch.cuda.is_available()",
    "p{i} = torch.randn(4).pin_memory().cuda(non_blocking=True)",
    "torch.cuda.init()",
    "torch.manual_seed(1)",
    "torch.cuda.manual_seed_all(1)",
    "if x{i}.is_cuda: z{i} = 1",
    "torch.backends.cudnn.benchmark = True",
    "torch.cuda.set_device(0)",
    "g{i} = torch.cuda.amp.GradScaler()",
    "with torch.cuda.amp.autocast(): a{i} = x{i} * 2",
    "name{i} = torch.cuda.get_device_name(0)",
    "peak{i} = torch.cuda.max_memory_allocated()",
    "torch.cuda.reset_peak_memory_stats()",
    "if torch.cuda.is_available(): torch.cuda.synchronize()",
    "e{i} = torch.cuda.Event(enable_timing=True)",
    "e{i}.record()",
    "ms{i} = e{i}.elapsed_time(e{i})",
    "q{i} = x{i}.cuda().item()",
    "dl{i} = torch.utils.data.DataLoader(ds, pin_memory=True)",
    'w{i} = torch.load("f.pt", map_location="cuda")',
)


def module_text(n: int, where: str = "module") -> str:
    """`n` lines of CUDA idioms after `import torch`, at the top level (`where="module"`), in
    a function ("function") or in a function's training loop ("loop")."""
    body = [LINES[i % len(LINES)].format(i=i) for i in range(n)]
    if where == "module":
        return "import torch\n\n" + "".join(f"{line}\n" for line in body)
    if where == "function":
        lines = "".join(f"    {line}\n" for line in body)
        return f"import torch\n\n\ndef main():\n{lines}\n\nmain()\n"
    if where == "loop":
        lines = "".join(f"        {line}\n" for line in body)
        return (
            "import torch\n\n\ndef main(loader, model, opt):\n    for batch in loader:\n"
            f"{lines}        loss = model(batch)\n        loss.backward()\n        opt.step()\n"
            "\n\nmain()\n"
        )
    raise ValueError(f"where: module, function or loop, not {where!r}")
