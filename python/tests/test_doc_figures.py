"""Figures that cannot drift (issue 83 item 1): every measured figure in README.md and docs/*.md names the committed
result it comes from (a file under bench/results/) and says what that file says, and README's "Where it does not"
lists every loss of the results README cites.

The convention (docs/Contributing.md, "Figures and their sources"):

* **A figure** is a ratio (``1.23x``; a range ``0.45-0.87x`` or ``0.45–0.87x``), a time (``12.3 µs``, ``us``,
  ``ms``, ranges alike) or a spread in brackets (``[0.95, 1.12]``), outside code spans and code blocks. Seconds are
  not taken (in these pages they are mostly settings, timeouts and test times), nor a target or bound
  (``<= 10 us``) or a value the sentence computes (``... = 174 us``).
* **Its source** is a link to a file under bench/results/ (or that path written out) in the same *unit*: a
  paragraph, a list item or a table row. A list or a table also takes the sources of the paragraph right before it,
  a nested item those of the items above it. bench/results/README.md (the index) is not a source.
* **It matches** when its number occurs in one of the unit's sources as printed or rounded: a figure with d
  decimals matches a value v of the file with |v - figure| <= 0.5 * 10^-d (``9.1x`` stands for 9.06); a range
  when both its ends do. A time may stand for the file's value in another unit (``0.2 ms`` for ``200 us``, or for
  ``0.0002`` in a table of seconds). A figure computed from a file rather than printed in it is matched by the
  file's entry in ``DERIVED``, which computes it.
* **A superseded source** fails: ``<bench>-<YYYY-MM-DD>-<tag>.md`` when bench/results/ holds
  ``<bench>-<later date>-<tag>.md`` or a later run of the same day (``<tag>-2`` after ``<tag>``), unless each
  citation of it is followed, within 200 characters, by the marker ``older run: <why>``.
* **A figure without a source** fails, unless ``UNSOURCED`` names its page, its section or a phrase of its unit,
  with the reason (a unit it covers is not checked at all).
* **A loss** (a table row of a result below 1 against its strongest baseline) of a file README's opening list cites
  must be in "Where it does not", as its value or a range that holds it, before that file's link.

Each failure names the doc, the line, the figure and the file. The check reads text only (well under a second);
``python python/tests/test_doc_figures.py`` prints every problem.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))

# Figures that cite no file under bench/results/, and why: (doc relative to the root, where) -> reason; where is None
# (the whole page), a heading (its section) or a phrase of a paragraph, item or row (that unit). Keep it short: a
# measured figure belongs in a result file.
DESIGN = "timings taken while choosing a design, recorded with it: its reasons, not claims of the product's speed"
UNSOURCED: dict[tuple[str, str | None], str] = {
    ("docs/MoEDensePasses.md", None): "generated from include/MoE/Transforms/Passes.td (mlir-doc): the slowdown "
                                      "each pass avoids",
    ("docs/CPU.md", "Measurements"): DESIGN,
    ("docs/CPU.md", "at 16x eager's error"): "errors against float64 (test_similarity_symmetric.py), not times",
    ("docs/Pipelines.md", "Targets: AVX2 and AVX-512"): DESIGN,
    ("docs/Training.md", "Parallel regions at decode sizes"): DESIGN,
    ("docs/Training.md", "Two thread pools on the same cores"): DESIGN,
    ("docs/Training.md", "Subnormal numbers"): DESIGN,
    ("docs/Training.md", "Autograd in C++"): DESIGN,
    ("docs/Training.md", "Backward ops and kernels"): DESIGN,
    ("docs/ExpertParallel.md", "Cost model at 8-64 GPUs"): "the model's output for the parameters it states",
}

# The marker that lets a unit cite a run a newer one of the same bench and tag supersedes.
OLDER_RUN = "older run:"

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
BARE_PATH = re.compile(r"(?<![\w/.-])((?:\.\./)?bench/results/[\w.-]+\.(?:md|json|txt|png))")
CODE_SPAN = re.compile(r"`[^`]*`")
NUMBER = r"(\d+(?:\.\d+)?)"
RATIO = re.compile(rf"(?<![\w.]){NUMBER}(?:\s?[-–]\s?{NUMBER})?x\b")
TIME = re.compile(rf"(?<![\w.+-]){NUMBER}(?:\s?[-–]\s?{NUMBER})?\s?(µs|us|ms)\b")
SPREAD = re.compile(rf"\[{NUMBER},\s*{NUMBER}\]")
FILE_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")
FILE_TIME = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s?(µs|us|ms|s)\b")
DATED = re.compile(r"^(?P<bench>[a-z][a-z0-9_-]*?)-(?P<date>\d{4}-\d{2}-\d{2})(?:-(?P<tag>.+))?\.md$")
ITEM = re.compile(r"^(\s*)(?:[*+-]|\d+[.)])\s+")
NOT_MEASURED = re.compile(r"(<=|>=|≤|≥|<|>|=)\s*$")
SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}


@dataclass
class Unit:
    """A paragraph, list item or table row of a doc: its first line, its text, the heading it sits under, the
    sources it names and those it inherits (the paragraph before its list or table, the items above it)."""

    doc: Path
    line: int
    text: str
    heading: str | None
    sources: list[Path] = field(default_factory=list)
    inherited: list[Path] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def sources_in(doc: Path, text: str) -> list[Path]:
    """The files under bench/results/ that `text` links to or names (the index excluded)."""
    found = []
    for target in LINK.findall(text):
        path = (doc.parent / target.split("#")[0]).resolve()
        if path.parent == RESULTS and path.name != "README.md":
            found.append(path)
    for written in BARE_PATH.findall(text):
        base = doc.parent if written.startswith("..") else ROOT
        found.append((base / written).resolve())
    return [p for p in dict.fromkeys(found) if p.name != "README.md"]


def units(doc: Path) -> list[Unit]:
    """The doc's units outside code blocks, in order, with the sources each names and inherits."""
    blocks: list[Unit] = []
    heading: str | None = None
    fenced = False
    for number, line in enumerate(doc.read_text().split("\n"), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            blocks.append(Unit(doc, number, "", heading))  # a code block ends the unit before it
            continue
        if fenced:
            continue
        last = blocks[-1] if blocks else None
        if stripped.startswith("#"):
            heading = stripped.lstrip("#").strip()
            blocks.append(Unit(doc, number, "", heading))
        elif not stripped or stripped.startswith("|") or ITEM.match(line) or last is None or not last.text \
                or last.text.lstrip().startswith("|"):
            blocks.append(Unit(doc, number, line if stripped else "", heading))
        else:
            last.text += "\n" + line

    out: list[Unit] = []
    lead: list[Path] = []  # the sources of the paragraph before the current list or table
    items: list[tuple[int, list[Path]]] = []  # the open list items: indentation, sources
    heading = None
    for unit in blocks:
        if unit.heading != heading:
            heading, lead, items = unit.heading, [], []
        if not unit.text:
            continue
        unit.sources = sources_in(doc, unit.text)
        item = ITEM.match(unit.text)
        if item:
            indent = len(item.group(1))
            while items and items[-1][0] >= indent:
                items.pop()
            unit.inherited = lead + [p for _, ps in items for p in ps]
            items.append((indent, unit.sources))
        elif unit.text.lstrip().startswith("|"):
            unit.inherited = list(lead)
        elif unit.text.startswith(" ") and items:  # an item's second paragraph
            unit.inherited = lead + [p for _, ps in items for p in ps]
        else:
            lead, items = unit.sources, []
        out.append(unit)
    return out


@dataclass(frozen=True)
class Figure:
    text: str  # as printed: "1.23x", "0.45-0.87x", "12.3 µs", "[0.95, 1.12]"
    values: tuple[str, ...]  # the numbers to find
    unit: str | None  # a time's unit


def figures(text: str) -> list[Figure]:
    """The figures of `text` outside code spans, less targets and bounds (``<= 10 us``) and values the text
    computes itself (``... at 1.755 GHz = 174 us``)."""
    text = CODE_SPAN.sub("", text)
    found = []
    for regex, unit_group in ((RATIO, None), (TIME, 3), (SPREAD, None)):
        for m in regex.finditer(text):
            if NOT_MEASURED.search(text[max(0, m.start() - 4):m.start()]):
                continue
            values = tuple(v for v in (m.groups()[:2] if unit_group else m.groups()) if v)
            found.append(Figure(m.group(0), values, m.group(unit_group) if unit_group else None))
    return found


_TEXTS: dict[Path, str] = {}
_NUMBERS: dict[Path, list[float]] = {}
_TIMES: dict[Path, list[float]] = {}


def _text(path: Path) -> str:
    return _TEXTS.setdefault(path, path.read_text(errors="replace") if path.exists() else "")


def _numbers(path: Path) -> list[float]:
    if path not in _NUMBERS:
        _NUMBERS[path] = [float(v) for v in FILE_NUMBER.findall(_text(path))]
        _TIMES[path] = [float(v) * SECONDS[u] for v, u in FILE_TIME.findall(_text(path))]
    return _NUMBERS[path]


def _models_compile(text: str) -> list[float]:
    """bench.models' cold compile times ("compile s cold": inductor / moe): moe's as a ratio of inductor's."""
    return [float(moe) / float(inductor) for inductor, moe, _, _ in re.findall(
        r"\| ([\d.]+) / ([\d.]+) \| ([\d.]+) / ([\d.]+) \|\s*$", text, re.M)]


# Figures computed from a result rather than printed in it: file name -> the values it yields.
DERIVED: dict[str, Callable[[str], list[float]]] = {
    "models-2026-11-25-t2.md": _models_compile,
}


def matches(value: str, unit: str | None, path: Path) -> bool:
    """Whether `value` (as printed in a doc, with `unit` for a time) is a value of `path`, or rounds from one."""
    decimals = len(value.split(".")[1]) if "." in value else 0
    figure = float(value)
    tolerance = 0.5 * 10 ** -decimals + 1e-9
    candidates = list(_numbers(path))
    if unit is not None:  # the file's times in the figure's unit; a table's bare numbers in s, ms or us
        candidates += [t / SECONDS[unit] for t in _TIMES[path]]
        candidates += [v * scale for v in _numbers(path) for scale in (1e3, 1e-3)]
    if path.name in DERIVED:
        candidates += DERIVED[path.name](_text(path))
    return any(abs(v - figure) <= tolerance for v in candidates)


def _run(path: Path) -> tuple[str, str, str, int] | None:
    """(bench, tag, date, run) of a dated result: a tag's trailing -N numbers the day's runs (h200-2 after h200)."""
    named = DATED.match(path.name)
    if not named:
        return None
    tag, run = named["tag"] or "", 1
    counted = re.fullmatch(r"(.*)-(\d)", tag)
    if counted:
        tag, run = counted[1], int(counted[2])
    return named["bench"], tag, named["date"], run


def superseded_by(path: Path) -> Path | None:
    """The newest run of the same bench and tag after `path`'s, if any."""
    this = _run(path)
    if this is None:
        return None
    newer = [(o[2], o[3], other) for other in RESULTS.glob(f"{this[0]}-*.md")
             for o in [_run(other)] if o and o[:2] == this[:2] and (o[2], o[3]) > (this[2], this[3])]
    return max(newer)[2] if newer else None


def says_why(text: str, path: Path) -> bool:
    """Whether each citation of `path` in `text` is followed, within 200 characters, by the OLDER_RUN marker."""
    text = _flat(text)
    ends = [m.end() for m in re.finditer(re.escape(path.name), text)]
    return bool(ends) and all(OLDER_RUN in text[end:end + 200] for end in ends)


def _flat(text: str) -> str:
    return " ".join(text.split())


def exempt(unit: Unit) -> bool:
    """Whether an UNSOURCED entry covers `unit`: its page, its section, or a phrase of its text."""
    doc = str(unit.doc.relative_to(ROOT))
    return any(d == doc and (where is None or where == unit.heading or where in _flat(unit.text))
               for d, where in UNSOURCED)


ALL_UNITS = [u for doc in DOCS for u in units(doc)]


def problems() -> dict[str, list[str]]:
    """Every failure, by kind."""
    found: dict[str, list[str]] = {"missing": [], "superseded": [], "unsourced": [], "different": []}
    for unit in ALL_UNITS:
        for path in unit.sources:
            if not path.exists():
                found["missing"].append(f"{unit.where}: cites {path.relative_to(ROOT)}, which does not exist")
            newer = superseded_by(path)
            if newer is not None and not says_why(unit.text, path):
                found["superseded"].append(
                    f"{unit.where}: cites {path.name}, superseded by {newer.name} (cite the newer run, or say why "
                    f"right after the citation: '{OLDER_RUN} <why>')")
        figs = figures(unit.text)
        if not figs or exempt(unit):
            continue
        sources = [p for p in unit.sources + unit.inherited if p.suffix in (".md", ".txt", ".json")]
        if not sources:
            found["unsourced"].append(
                f"{unit.where}: {', '.join(f.text for f in figs)}: no bench/results file in this "
                f"{'row' if unit.text.lstrip().startswith('|') else 'paragraph or item'}")
            continue
        for fig in figs:
            missing = [v for v in fig.values if not any(matches(v, fig.unit, p) for p in sources)]
            if missing:
                names = ", ".join(p.name for p in dict.fromkeys(sources))
                found["different"].append(f"{unit.where}: {fig.text!r}: {' and '.join(missing)} not in {names}")
    return found


_PROBLEMS = problems()


@pytest.mark.parametrize("kind", ["missing", "superseded", "unsourced", "different"])
def test_figures(kind):
    """Each figure's source exists, is the newest of its bench (or says why not), and prints the figure."""
    assert not _PROBLEMS[kind], f"{len(_PROBLEMS[kind])} {kind}:\n" + "\n".join(_PROBLEMS[kind])


def test_unsourced_entries_are_used():
    """Every UNSOURCED entry still covers a unit with figures: the list cannot outlive its reasons."""
    used = {(d, where) for u in ALL_UNITS if figures(u.text) for d, where in UNSOURCED
            if d == str(u.doc.relative_to(ROOT))
            and (where is None or where == u.heading or where in _flat(u.text))}
    assert not [key for key in UNSOURCED if key not in used], "UNSOURCED entries that cover no figure"


# "Where it does not" (README) lists every loss of the results README's opening list cites: a table row whose ratio
# against its strongest baseline is below 1 (the "vs best" column where the table has one, else the least of its
# ratio columns: "x eager", "vs compile", "moe vs inductor"...; not the "(min ...)" ones) must be covered by a figure
# written before that file's link (its value, or a range holding it). Results README cites without taking them as
# results, and why:
NOT_A_RESULT = {
    "models-2026-11-25-t2-epyc.md": "run under load 4-7 (ratios from 0.03x): published with its load, not a result",
}
LOSS_COLUMN = re.compile(r"^(moe |moe backend )?(x|vs)( (eager|inductor|compile|sdpa))?( / x (eager|inductor))?$")
BEST_COLUMN = re.compile(r"^(moe )?vs best")
RATIO_IN_CELL = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)x?(?![\w.])")


def losses(path: Path) -> list[tuple[str, float]]:
    """(row, ratio) for each table row of `path` below 1 against its strongest baseline."""
    found, header, columns = [], None, []
    for line in _text(path).split("\n"):
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = [c.lower() for c in cells]
            best = [i for i, h in enumerate(header) if BEST_COLUMN.match(h)]
            columns = best or [i for i, h in enumerate(header) if LOSS_COLUMN.match(h)]
            continue
        # a cell's ratios: "1.18x [1.12, 1.20]" (a median and its spread), "0.80 / 0.79" (two baselines)
        ratios = [float(v) for i in columns if i < len(cells)
                  for v in RATIO_IN_CELL.findall(cells[i].split("[")[0].replace("*", ""))]
        if ratios and min(ratios) < 0.995:
            found.append((" ".join(cells[:2]), min(ratios)))
    return found


def _where_it_does_not() -> list[Unit]:
    """README's "Where it does not" item and the items under it."""
    readme = [u for u in ALL_UNITS if u.doc.name == "README.md" and u.doc.parent == ROOT]
    start = next(i for i, u in enumerate(readme) if "**Where it does not**" in u.text)
    indent = len(ITEM.match(readme[start].text).group(1))
    out = [readme[start]]
    for unit in readme[start + 1:]:
        item = ITEM.match(unit.text)
        if not item or len(item.group(1)) <= indent:
            break
        out.append(unit)
    return out


def figures_citing(text: str, path: Path) -> list[Figure]:
    """The figures of a unit's `text` that go with its citations of `path`: those between the citation before (or the
    start) and that citation, and those after it where it is the unit's last."""
    text = _flat(text)
    links = [(m.start(), m.end(), m.group(1)) for m in LINK.finditer(text)]
    bare = [(m.start(), m.end(), m.group(1)) for m in BARE_PATH.finditer(text)
            if not any(a <= m.start() < b for a, b, _ in links)]
    cites = sorted((a, b, Path(target.split("#")[0]).name) for a, b, target in links + bare
                   if "bench/results/" in target and (RESULTS / Path(target.split("#")[0]).name).exists())
    out, start = [], 0
    for i, (_, end, name) in enumerate(cites):
        if name == path.name:
            out += figures(text[start:len(text) if i == len(cites) - 1 else end])
        start = end
    return out


def _covers(fig: Figure, value: float) -> bool:
    tolerance = max(0.5 * 10 ** -(len(v.split(".")[1]) if "." in v else 0) for v in fig.values) + 1e-9
    low, high = float(fig.values[0]), float(fig.values[-1])
    return low - tolerance <= value <= high + tolerance


def test_where_it_does_not_lists_every_loss():
    """Every loss of a result README's opening list cites is in its "Where it does not" list, with the file."""
    readme = [u for u in ALL_UNITS if u.doc.name == "README.md" and u.doc.parent == ROOT]
    opening = readme[:next(i for i, u in enumerate(readme) if u.heading != readme[0].heading)]
    cited = dict.fromkeys(p for u in opening for p in u.sources if p.suffix == ".md" and p.name not in NOT_A_RESULT)
    listed = _where_it_does_not()
    missing = []
    for path in cited:
        figs = [f for u in listed for f in figures_citing(u.text, path) if f.text.endswith("x")]
        missing += [f"{path.name}: {row}: {ratio}x" for row, ratio in losses(path)
                    if not any(_covers(f, ratio) for f in figs)]
    assert not missing, "losses missing from README's 'Where it does not' (with their file):\n" + "\n".join(missing)


def test_checker_reads_figures():
    """The parser finds the figures and sources it is meant to (a guard against a regex that matches nothing)."""
    figs = figures("DeepSeek-V3 9.1x eager, 0.45–0.87x, 1.04x [0.95, 1.12], 12.3 µs, `2.0x` in code, x86-64-v3, "
                   "a target of <= 50 ms, a bound of 32 x 2 / 4 = 16 us")
    assert [f.text for f in figs] == ["9.1x", "0.45–0.87x", "1.04x", "12.3 µs", "[0.95, 1.12]"]
    assert sum(len(figures(u.text)) for u in ALL_UNITS if u.sources or u.inherited) > 300
    assert _run(Path("torch-ops-cuda-2026-11-27-h200-2.md")) == ("torch-ops-cuda", "h200", "2026-11-27", 2)


if __name__ == "__main__":  # python python/tests/test_doc_figures.py: every problem, by kind
    for kind, lines in _PROBLEMS.items():
        print(f"== {kind}: {len(lines)}")
        print("\n".join(lines))
