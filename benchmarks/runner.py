"""The one benchmark runner: a benchmark is its cases and its measurement; this does the rest.

``main(Benchmark(...))`` gives every benchmark the same command line (``--repeats``, ``--cases``, ``--quick``,
``--report``, ``--out``, ``--docs``, ``--add``), the repeat loop with a progress line per repeat, every repeat
kept in the JSON (saved after each, so a run stopped midway keeps what it measured), the same-run baseline as a
ratio (``ratio``), the docs section (``splice`` between the benchmark's markers) and the PNG (``figure``: the one
matplotlib setup). The project's rules for a benchmark: compare against the baseline measured in the same run, as
a ratio; report every repeat, not only the median; save the JSON and a PNG; long steps show progress.

The library's counters are read here only, each in one small function, through the library's public names (each
client's, handler's and store's ``stats``: ``kube_rendezvous.Counters``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from benchmarks.report import new_report, save_report, splice

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DOCS = REPO / "docs"
Context = TypeVar("Context")
Run = dict[str, Any]
Report = dict[str, Any]


def log(message: str) -> None:
    """One progress line, with the time of day (long steps show progress)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def markers(name: str) -> tuple[str, str]:
    """The begin and end markers of benchmark ``name``'s section of a page."""
    slug = name.replace("_", "-")
    return f"<!-- {slug}:begin (python -m benchmarks.{name}) -->", f"<!-- {slug}:end -->"


# --- what a table shows: every repeat, and the ratio to the same run's baseline ---------------------------------


def stamp(report: Report) -> str:
    """When and where a report was measured, as its section says it first."""
    return f"Measured {report['date']} on {report['machine']}"


def arguments(*names: str) -> Callable[[argparse.Namespace], dict[str, Any]]:
    """``fields`` of a report that are the run's own arguments, in this order."""
    return lambda args: {name: getattr(args, name) for name in names}


def invocation(name: str, report: Report) -> str:
    """The command line that measured ``report`` (its ``argv``), as a section quotes it."""
    return " ".join([f"python -m benchmarks.{name}", *report["argv"]])


def table_head(*columns: str) -> list[str]:
    """A Markdown table's first two lines."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def values(runs: Iterable[Run], key: str, **match: Any) -> list[Any]:
    """``run.get(key)`` of every run whose fields equal ``match``, in order (None where it has none)."""
    return [run.get(key) for run in runs if all(run.get(name) == value for name, value in match.items())]


def found(runs: Iterable[Run], key: str, **match: Any) -> list[float]:
    """The values of ``key`` that were measured (see ``values``)."""
    return [value for value in values(runs, key, **match) if value is not None]


def shown(items: Iterable[float | None], digits: int = 1, none: str = "none") -> str:
    """Every repeat's value, in order: ``none`` where a repeat did not get there."""
    return ", ".join(none if value is None else f"{value:.{digits}f}" for value in items)


def median(items: Sequence[float]) -> float | None:
    return statistics.median(items) if items else None


def ratio(mine: Sequence[float], base: Sequence[float]) -> float | None:
    """The median of ``mine`` over the median of the same run's baseline ``base`` (None if either is empty)."""
    return statistics.median(mine) / statistics.median(base) if mine and base else None


def figure(width: float, height: float, columns: int | None = None, rows: int = 1) -> tuple[Any, Any]:
    """A new figure (the one matplotlib setup): (the figure, its one axis; or, given ``columns``, the list of
    its ``rows`` x ``columns`` axes, row by row). The runner saves it (``save_figure``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made, axes = plt.subplots(rows, columns or 1, figsize=(width, height), squeeze=False)
    return made, (axes[0][0] if columns is None else list(axes.flat))


def save_figure(made: Any, path: Path, dpi: int = 110) -> None:
    import matplotlib.pyplot as plt

    made.tight_layout()
    made.savefig(path, dpi=dpi)
    plt.close(made)


def scatter_rows(axis: Any, rows: dict[str, list[float | None]], *, none_at: float | None = None, **style: Any) -> None:
    """One row of points per label, every repeat (``None`` drawn at ``none_at``, or left out)."""
    for index, xs in enumerate(rows.values()):
        shown_xs = [none_at if x is None else x for x in xs if x is not None or none_at is not None]
        axis.scatter(shown_xs, [index] * len(shown_xs), **style)
    axis.set_yticks(range(len(rows)), list(rows), fontsize=7)


def case_plot(
    report: Report, cases: Sequence[str], styles: Mapping[str, tuple[str, str, str | None]], xlabel: str, title: str,
    legend: str,
) -> Any:  # fmt: skip
    """A row per case, every repeat's measured ``key`` a point for each ``key: (marker, color, label)``; the title
    with the report's date, the legend at ``legend``."""
    made, axis = figure(9, 3.2)
    for index, case in enumerate(cases):
        for key, (marker, color, label) in styles.items():
            xs = found(report["runs"], key, case=case)
            axis.scatter(xs, [index] * len(xs), marker=marker, s=28, color=color, label=label if xs else None)
    unique_legend(axis, fontsize=7, loc=legend)
    label_rows(axis, cases, xlabel, f"{title} ({report['date']})", title_size=9)
    return made


def label_rows(
    axis: Any, labels: Sequence[str], xlabel: str, title: str, *, size: int = 8, title_size: int | None = None
) -> None:
    """A plot of one row per label, every repeat a point: its labels, its x label and its title; with
    ``title_size``, a small title and a grid of the seconds."""
    axis.set_yticks(range(len(labels)), list(labels), fontsize=size)
    axis.set_xlabel(xlabel)
    if title_size is None:
        axis.set_title(title)
    else:
        axis.set_title(title, fontsize=title_size)
        axis.grid(axis="x", alpha=0.3)


def ratios_to(runs: Sequence[Run], key: str, baselines: dict[str, str]) -> dict[str, float]:
    """Per case of ``baselines``: the median of its ``key`` over its baseline's (same run), to two decimals."""
    found_ratios = {
        case: ratio(found(runs, key, case=case), found(runs, key, case=base)) for case, base in baselines.items()
    }
    return {case: round(value, 2) for case, value in found_ratios.items() if value is not None}


def marker_handles(styles: dict[str, tuple[str, str]]) -> list[Any]:
    """Legend entries for ``{label: (color, marker)}``."""
    from matplotlib.lines import Line2D

    return [
        Line2D([], [], color=color, marker=marker, linestyle="", label=key) for key, (color, marker) in styles.items()
    ]


def unique_legend(axis: Any, **options: Any) -> None:
    """The axis' legend, each label once."""
    handles, labels = axis.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=False))
    axis.legend(unique.values(), unique.keys(), **options)


# --- the library's counters: the only private reads, each in one place ------------------------------------------


def handler_api(handler: Any) -> Any:
    """The API client a handler of ours sends through (``handler.api``; None for p10d's and c10d's handlers)."""
    return getattr(handler, "api", None)


def library_counters(handler: Any) -> tuple[dict[str, int], dict[str, int]] | None:
    """A handler of ours: its API client's counters, and its own and its store's (``store_`` prefixed); None
    for p10d's and c10d's handlers, which count nothing."""
    api, store = handler_api(handler), getattr(handler, "rendezvous_store", None)
    if not isinstance(getattr(handler, "stats", None), Mapping) or api is None or store is None:
        return None
    counts = dict(handler.stats)
    counts.update({f"store_{key}": value for key, value in store.stats.items()})
    return dict(api.stats), counts


def api_requests(handlers: Iterable[Any]) -> int:
    """API requests of ``handlers`` so far (handlers may share one client)."""
    clients = {id(api): api for api in map(handler_api, handlers) if api is not None}
    return sum(int(api.stats.get("requests", 0)) for api in clients.values())


def backend_api(backend: Any) -> Any:
    """The API client of a compare-and-swap backend (``create_backend``)."""
    return backend.api


def round_store(store: Any) -> Any:
    """The round's prefixed view of a backend's store, as a round's handler gives it to the agent (round 0)."""
    from kube_rendezvous import KubernetesPrefixStore

    return KubernetesPrefixStore("rdzv/none/0/", store, round_number=0)


def writer_lease(rendezvous: str) -> str:
    """The name of a Rendezvous' writer Lease."""
    from kube_rendezvous import writer_lease_name

    name: str = writer_lease_name(rendezvous)
    return name


def key_watch_caches(stores: Iterable[Any]) -> list[Any]:
    """The key caches of the stores' key watches (``store.key_watch``; stores without one left out)."""
    return [watch.cache for store in stores if (watch := store.key_watch) is not None]


def in_threads(target: Callable[[int], None], count: int) -> None:
    """``target(index)`` for every index below ``count``, each in a thread of its own, all at once; back when all
    returned (a worker process' agents)."""
    threads = [threading.Thread(target=target, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def quick_mode(parser: argparse.ArgumentParser, argv: Sequence[str] | None, **smoke: Any) -> None:
    """``--quick``: a smoke run, ``smoke`` the defaults it changes (explicit arguments still win). For the
    benchmarks with a command line of their own; ``Benchmark.quick`` is the same for the others."""
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: {smoke} unless given")
    if "--quick" in (sys.argv[1:] if argv is None else argv):
        parser.set_defaults(**smoke)


def page_under(where: Path, name: str = "benchmarks.md") -> Path:
    """The page ``name`` under ``where``: docs/'s own, or (``--out``) a copy of it, so that the section spliced
    into it is the one docs/ would get."""
    page = where / name
    if not page.exists():
        where.mkdir(parents=True, exist_ok=True)
        page.write_text((DOCS / name).read_text())
    return page


def repeated(
    what: str,
    repeats: int,
    measure: Callable[[], Run],
    errors: tuple[type[BaseException], ...] = (RuntimeError, AssertionError, TimeoutError),
) -> list[Run]:
    """``measure()`` ``repeats`` times, every run kept, a progress line for each; a repeat that raised ``errors``
    is kept as ``{"failed": why}`` and ends the repeats (within the limit or never: repeating only costs time).
    For the benchmarks whose report is several tables (``run``, ``scale``)."""
    runs: list[Run] = []
    for repeat in range(repeats):
        try:
            run = measure()
            log(f"{what} repeat {repeat + 1}/{repeats}: {json.dumps(run, default=str)[:300]}")
        except errors as exc:
            log(f"{what} repeat {repeat + 1}/{repeats}: FAILED {exc}")
            run = {"failed": str(exc)[:300]}
        runs.append(run)
        if "failed" in run:
            break
    return runs


# --- the benchmark and its run --------------------------------------------------------------------------------


#: The functions a benchmark module may define, which ``Benchmark.of`` takes from it.
HOOKS = ("cases", "schedule", "measure", "section", "plot", "setup", "options", "fields", "merge", "finish")
#: The constants a benchmark module may define, which ``Benchmark.of`` takes from it (as the lower-case setting).
CONSTANTS = ("TITLE", "IMAGE", "LABELS", "INTRO", "NOTES")
#: What a failed repeat of an agents-at-scale benchmark raises: recorded as ``failed``, and the case stops there.
AT_SCALE: dict[str, Any] = {
    "errors": (RuntimeError, AssertionError, TimeoutError),
    "error_key": "failed",
    "timed": False,
    "stop_on_failure": True,
}


@dataclass
class Benchmark(Generic[Context]):
    """A benchmark: its cases and its measurement. Everything else is ``main``'s.

    ``cases(args)`` is one repeat's plan: each case's identifying fields (``{"case": label}`` or, say,
    ``{"nodes": 128, "mode": ...}``), which head its run in the JSON. ``measure(context, case, repeat, args)``
    measures one case once and returns its fields; a raised ``errors`` exception is recorded in ``error_key``.
    ``setup(workdir, args)`` is the environment every case runs in (a control plane, real nodes), entered once.
    ``section(report)`` is the Markdown of the docs section, ``plot(report)`` the figure (see ``figure``)."""

    name: str
    doc: str
    measure: Callable[[Context, Run, int, argparse.Namespace], Run]
    section: Callable[[Report], list[str]]
    plot: Callable[[Report], Any]
    cases: Callable[[argparse.Namespace], list[Run]] = lambda args: []
    #: The environment every case runs in, entered once (default: none, the work folder).
    setup: Callable[[Path, argparse.Namespace], AbstractContextManager[Context]] = (
        lambda workdir, args: nullcontext(workdir)  # type: ignore[arg-type]
    )
    page: str = "benchmarks.md"
    #: The section's heading, and the alt text of its PNG, shown at its end.
    title: str | None = None
    image: str | None = None
    #: What was measured, how: the paragraph before the table, formatted with ``stamp`` (when, where) and
    #: ``command`` (the command line with its sizes and repeats) and the report's fields; white space folded.
    intro: str | None = None
    #: How to read the table: a paragraph after it (white space folded: write it as a triple-quoted string).
    notes: str | None = None
    at_end: bool = True
    repeats: int = 3
    #: The ``--cases`` choices (labels of the ``case`` field); empty: no ``--cases``.
    labels: Sequence[str] = ()
    #: The common arguments a benchmark takes, with its defaults (None: it does not take it): ``--sizes`` (N),
    #: ``--frameworks``, ``--limit`` (seconds before a repeat counts as failed), ``--previous`` (the previous
    #: release's commit, the same-run baseline of a release against the last) and ``--baseline-repeats``.
    #: A benchmark with a ``merge`` hook takes ``--keep``.
    sizes: Sequence[int] | None = None
    frameworks: Sequence[str] | None = None
    limit: float | None = None
    previous: str | None = None
    baseline_repeats: int | None = None
    #: Extra arguments, and what ``--quick`` sets (besides one repeat).
    options: Callable[[argparse.ArgumentParser], None] = lambda parser: None
    quick: dict[str, Any] = field(default_factory=dict)
    #: The report's fields besides date, machine and runs (``repeats`` after them unless placed among them).
    fields: Callable[[argparse.Namespace], dict[str, Any]] = lambda args: {}
    #: Merge the runs already in the JSON (a benchmark's ``--keep``; default ``--add``): (the JSON's report or
    #: None, this run's report, args).
    merge: Callable[[Report | None, Report, argparse.Namespace], None] | None = None
    errors: tuple[type[BaseException], ...] = (TimeoutError,)
    error_key: str = "error"
    error_chars: int = 300
    #: Record each repeat's own wall time in ``seconds`` (one decimal).
    timed: bool = True
    #: Every repeat of one case before the next case (else each repeat runs every case, interleaved, so a slow
    #: minute of the machine hits every case alike); and stop a case at its first failure.
    case_major: bool = False
    stop_on_failure: bool = False
    #: The report's list of runs; ``grouped``: one entry per case, ``{**case, "runs": [every repeat]}``, and
    #: ``summary(entry)``'s fields added to it after each repeat.
    table: str = "runs"
    grouped: bool = False
    summary: Callable[[Run], dict[str, Any]] = lambda entry: {}
    #: Head each run with its repeat (``repeat``) and the run's date (``measured``; runs merged from other runs
    #: keep theirs).
    numbered: bool = False
    dated: bool = False
    #: After the last repeat, before the page: what the report adds up (say, per-size summaries).
    finish: Callable[[Report], None] = lambda report: None
    #: The whole plan, (repeat, case) in order, where repeats differ by case (a baseline repeated less).
    schedule: Callable[[argparse.Namespace], list[tuple[int, Run]]] | None = None

    @classmethod
    def of(cls, namespace: dict[str, Any], **settings: Any) -> Benchmark[Any]:
        """The benchmark a module defines (pass ``globals()``): its name and help from the module, its hooks
        (``HOOKS``: ``measure``, ``section``, ``plot``, and any of the others) from the module's functions of
        those names, ``CONSTANTS`` likewise, the rest from ``settings``. With ``labels`` and no ``cases``, each
        label is a case."""
        spec = namespace.get("__spec__")
        settings.setdefault("name", (spec.name if spec is not None else namespace["__name__"]).rsplit(".", 1)[-1])
        settings.setdefault("doc", namespace.get("__doc__") or "")
        settings.update({hook: namespace[hook] for hook in HOOKS if hook in namespace and hook not in settings})
        settings.update({name.lower(): namespace[name] for name in CONSTANTS if name in namespace})
        if "cases" not in settings:
            labels = list(settings.get("labels", ()))
            settings["cases"] = lambda args: [{"case": label} for label in labels]
        return cls(**settings)

    @property
    def out(self) -> Path:
        return RESULTS / f"{self.name}.json"

    @property
    def png(self) -> str:
        return f"{self.name.replace('_', '-')}.png"


def write_outputs(benchmark: Benchmark[Any], report: Report, docs: Path = DOCS) -> None:
    """The docs section (between the benchmark's markers) and the PNG, from ``report``."""
    begin, end = markers(benchmark.name)
    docs.mkdir(parents=True, exist_ok=True)
    lines = benchmark.section(report)
    if benchmark.intro is not None:
        sizes = " ".join(map(str, report.get("sizes", [])))
        command = f"python -m benchmarks.{benchmark.name}" + (f" --sizes {sizes}" if sizes else "")
        command = f"`{command} --repeats {report['repeats']}`"
        intro = " ".join(benchmark.intro.split()).format_map({**report, "stamp": stamp(report), "command": command})
        lines = [intro, "", *lines]
    if benchmark.title is not None:
        lines = [f"## {benchmark.title}", "", *lines]
    if benchmark.notes is not None:
        lines += ["", " ".join(benchmark.notes.split())]
    if benchmark.image is not None:
        lines += ["", f"![{benchmark.image}]({benchmark.png})"]
    splice(docs / benchmark.page, "\n".join(lines), begin, end, at_end=benchmark.at_end)
    save_figure(benchmark.plot(report), docs / benchmark.png)


def parse(benchmark: Benchmark[Any], argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=benchmark.doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=benchmark.repeats, help="repeats of each case")
    if benchmark.labels:
        parser.add_argument("--cases", nargs="*", default=list(benchmark.labels), choices=list(benchmark.labels))
    parser.add_argument("--quick", action="store_true", help="one repeat of the smallest cases (a smoke run)")
    parser.add_argument("--report", action="store_true", help="only rewrite the page and plot from the JSON")
    parser.add_argument("--add", action="store_true", help="add this run's repeats to the JSON's")
    parser.add_argument("--out", type=Path, default=benchmark.out, help="the JSON (default: benchmarks/results)")
    parser.add_argument("--docs", type=Path, default=DOCS, help="where the page and the PNG go (default: docs)")
    if benchmark.sizes is not None:
        parser.add_argument("--sizes", type=int, nargs="+", default=list(benchmark.sizes), help="agents N")
    if benchmark.frameworks is not None:
        choices = ["tensorplay", "torch"]
        parser.add_argument("--frameworks", nargs="+", default=list(benchmark.frameworks), choices=choices)
    if benchmark.limit is not None:
        parser.add_argument("--limit", type=float, default=benchmark.limit, help="seconds before a repeat fails")
    if benchmark.previous is not None:
        parser.add_argument("--previous", default=benchmark.previous, help="the git commit of the previous release")
    if benchmark.baseline_repeats is not None:
        parser.add_argument("--baseline-repeats", type=int, default=benchmark.baseline_repeats)
    if benchmark.merge is not None:
        parser.add_argument("--keep", action="store_true", help="merge into the JSON, replacing these cases' runs")
    benchmark.options(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = 1
        for name, value in benchmark.quick.items():
            setattr(args, name, value)
    return args


def add(earlier: Report | None, report: Report, args: argparse.Namespace) -> None:
    """``--add``: the JSON's runs first, its repeats counted in, both dates."""
    if not args.add or earlier is None:
        return
    report["runs"] = earlier["runs"] + report["runs"]
    report["repeats"] += earlier["repeats"]
    report["date"] = f"{earlier['date']} and {report['date']}"


def plan(benchmark: Benchmark[Any], args: argparse.Namespace) -> Iterator[tuple[int, Run]]:
    if benchmark.schedule is not None:
        yield from benchmark.schedule(args)
        return
    cases = benchmark.cases(args)
    if benchmark.labels:
        cases = [case for case in cases if case.get("case") in args.cases]
    if benchmark.case_major:
        yield from ((repeat, case) for case in cases for repeat in range(args.repeats))
    else:
        yield from ((repeat, case) for repeat in range(args.repeats) for case in cases)


def run_all(benchmark: Benchmark[Context], context: Context, report: Report, args: argparse.Namespace) -> None:
    """Every case, every repeat, each kept and saved as it ends; a progress line for each."""
    failed: set[str] = set()
    entries: dict[str, Run] = {}
    for repeat, case in plan(benchmark, args):
        what = ", ".join(f"{value}" for value in case.values())
        if what in failed:
            continue
        log(f"{benchmark.name}: {what}, repeat {repeat + 1}/{args.repeats}")
        started = time.monotonic()
        head = {**case, **({"repeat": repeat} if benchmark.numbered else {})}
        head.update({"measured": report["date"]} if benchmark.dated else {})
        try:
            run: Run = {**head, **benchmark.measure(context, case, repeat, args)}
        except benchmark.errors as exc:
            log(f"  FAILED {exc}")
            run = {**head, benchmark.error_key: str(exc)[: benchmark.error_chars]}
        if benchmark.timed:
            run.setdefault("seconds", round(time.monotonic() - started, 1))
        log(f"  {json.dumps(run, default=str)[:400]}")
        if benchmark.grouped:
            if what not in entries:
                entries[what] = {**case, "runs": []}
                report[benchmark.table].append(entries[what])
            entry = entries[what]
            entry["runs"].append({key: value for key, value in run.items() if key not in case})
            entry.update(benchmark.summary(entry))
        else:
            report[benchmark.table].append(run)
        save_report(args.out, report)
        if benchmark.stop_on_failure and benchmark.error_key in run:
            failed.add(what)  # a case that did not get there within its limit is the result: repeating costs time


def main(benchmark: Benchmark[Context], argv: Sequence[str] | None = None) -> int:
    """The command line of ``benchmark``: measure (or ``--report`` only), save the JSON, write the page and plot."""
    args = parse(benchmark, argv)
    if args.report:
        write_outputs(benchmark, json.loads(args.out.read_text()), args.docs)
        return 0
    fields = benchmark.fields(args)
    fields.setdefault("repeats", args.repeats)
    report = new_report(**fields, **{benchmark.table: []})
    earlier = json.loads(args.out.read_text()) if args.out.exists() else None
    (benchmark.merge or add)(earlier, report, args)
    workdir = Path(tempfile.mkdtemp(prefix=f"kube-rendezvous-{benchmark.name.replace('_', '-')}-"))
    log(f"{benchmark.name}: setting up in {workdir}")
    with benchmark.setup(workdir, args) as context:
        run_all(benchmark, context, report, args)
    benchmark.finish(report)
    save_report(args.out, report)
    write_outputs(benchmark, report, args.docs)
    return 0
