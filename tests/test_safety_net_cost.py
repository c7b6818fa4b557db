"""benchmarks/safety_net_cost.py swaps parts of the engine out (the parse guard, the net) to
time them; when the engine's signatures move, the swap breaks. Its three set-ups, on a small
generated tree: each runs every file, and the engine is whole again afterwards."""

from __future__ import annotations

from pathlib import Path

from script_module import load_script

from gpu2tpu.rewrite.core import net, source

ROOT = Path(__file__).resolve().parent.parent


def test_each_setup_rewrites_the_files_and_puts_the_engine_back(tmp_path: Path) -> None:
    bench = load_script(ROOT / "benchmarks" / "safety_net_cost.py", "safety_net_cost")
    bench.build_tree(tmp_path, 30)
    texts = bench.read_all(sorted(tmp_path.rglob("*.py")))
    real = (source.prepare, net.verified)
    cuda = next(t for t in texts if "cuda" in t)
    for name in ("bare", "guard", "net"):
        with bench.setup(name):
            result = source.rewrite_source(cuda)
        assert result.new_text != cuda, name
        compile(result.new_text, name, "exec")
    assert (source.prepare, net.verified) == real
    spent = bench.measure(texts, fix=True)
    assert set(spent) == {"bare", "guard", "net"} and all(s > 0 for s in spent.values())
    assert bench.count_changed(texts) >= 1
