"""The benchmarks' shared report helpers (benchmarks/report.py): every benchmark writes its JSON and its
section of a page in docs/ through them, so a page keeps the other benchmarks' sections."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.report import new_report, save_report, splice

BEGIN, END = "<!-- x:begin -->", "<!-- x:end -->"


def test_splice_puts_a_new_section_after_the_first_heading_or_at_the_end(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Benchmarks\n\nintro\n")
    splice(page, "one\n", BEGIN, END)
    assert page.read_text() == f"# Benchmarks\n\n{BEGIN}\none\n{END}\n\nintro\n"
    other = tmp_path / "other.md"
    other.write_text("# Benchmarks\n\nintro\n\n")
    splice(other, "one", BEGIN, END, at_end=True)
    assert other.read_text() == f"# Benchmarks\n\nintro\n\n{BEGIN}\none\n{END}\n"


def test_splice_replaces_only_its_own_section(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"# B\n\n<!-- y:begin -->\nkept\n<!-- y:end -->\n\n{BEGIN}\nold\n{END}\n\ntail\n")
    splice(page, "\nnew\n", BEGIN, END, at_end=True)
    assert page.read_text() == f"# B\n\n<!-- y:begin -->\nkept\n<!-- y:end -->\n\n{BEGIN}\nnew\n{END}\n\ntail\n"


def test_splice_starts_a_missing_page(tmp_path: Path) -> None:
    page = tmp_path / "new.md"
    splice(page, "one", BEGIN, END, at_end=True)
    assert page.read_text() == f"# Benchmarks\n\n{BEGIN}\none\n{END}\n"


def test_a_report_starts_with_its_date_and_machine_then_its_fields_in_order(tmp_path: Path) -> None:
    report = new_report(repeats=3, previous="abc", runs=[])
    assert list(report) == ["date", "machine", "repeats", "previous", "runs"]
    assert report["machine"].endswith(" cores")
    out = tmp_path / "results" / "x.json"
    save_report(out, report)
    assert json.loads(out.read_text()) == report
