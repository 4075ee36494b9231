"""The README and docs/ stay true: what they show runs, and where they point exists.

- README.md is a front door: at most ``README_MAX_LINES`` lines, naming ``make demo`` and
  ``make test``, and linking every page of ``docs/``.
- Every relative link in README.md and ``docs/*.md`` resolves to a path inside the repository; a
  ``#anchor`` into a markdown page (or the page itself) names one of its headings, slugged as
  GitHub slugs them.
- Every ``tokentrail ...`` command shown, in a shell code block (```` ```bash ````, ``sh``,
  ``shell``, ``console`` or no language) or in inline code, parses against the real argparse
  parsers (``compose.cli.build_parser``), without running anything: its subcommand exists, its
  action does for the subcommands that have actions (``kafka up``, ``versions announce``,
  ``bench fold``), and every ``--flag`` (or ``-x``) it names is one that parser accepts, exactly
  (argparse would accept an unambiguous prefix; a doc must spell the flag). Commands in a code
  block's ``# comment`` count when they are in backticks or start with ``.venv/bin/tokentrail``.
- Every ``make TARGET`` shown names a rule of the Makefile.

The checkers are tested on inputs that must fail (a typo'd flag, a removed subcommand or action,
an unknown make target, a broken link or anchor), so the test cannot pass by checking nothing.
"""

from __future__ import annotations

import argparse
import functools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from compose.cli import SUBCOMMANDS, build_parser

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
README_MAX_LINES = 150
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
# Separators of shell commands (after quotes are read): a command starts after any of them.
SEPARATOR_CHARS = "();&|"
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
MAKE_RULE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*(?:[ \t]+[A-Za-z0-9][A-Za-z0-9_.-]*)*)[ \t]*:(?!=)")


# ---------------------------------------------------------------- reading a markdown page


@dataclass(frozen=True)
class Snippet:
    """A piece of a page that may hold commands: a shell line, or an inline code span."""

    page: str
    line: int
    text: str
    shell: bool  # a whole shell line (a command, separators, comments), not prose code


@dataclass(frozen=True)
class Page:
    name: str
    prose: list[tuple[int, str]]  # lines outside fenced code
    code: list[tuple[int, str, str]]  # (line, language, text) inside fenced code


def read_page(path: Path, text: str | None = None) -> Page:
    text = path.read_text() if text is None else text
    prose: list[tuple[int, str]] = []
    code: list[tuple[int, str, str]] = []
    fence: str | None = None
    language = ""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if fence is None and (stripped.startswith("```") or stripped.startswith("~~~")):
            fence = stripped[:3]
            language = stripped[3:].strip().split(" ")[0].lower()
        elif fence is not None and stripped.startswith(fence):
            fence = None
        elif fence is not None:
            code.append((number, language, line))
        else:
            prose.append((number, line))
    return Page(_name(path), prose, code)


def _name(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def _split_comment(line: str) -> tuple[str, str]:
    """A shell line's code and its ``#`` comment (a ``#`` that starts a word, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i + 1:]
    return line, ""


def snippets(page: Page) -> list[Snippet]:
    """Every shell line (continuations joined) and every inline code span that may hold a command."""
    found: list[Snippet] = []
    pending = ""
    pending_line = 0
    for number, language, line in page.code:
        if language not in SHELL_LANGUAGES:
            continue
        code, comment = _split_comment(line)
        if language == "console":
            code = re.sub(r"^\s*\$\s", "", code)
        if not pending:
            pending_line = number
        if code.rstrip().endswith("\\"):
            pending += code.rstrip()[:-1] + " "
            found.extend(_comment_snippets(page.name, number, comment))
            continue
        found.append(Snippet(page.name, pending_line, pending + code, shell=True))
        found.extend(_comment_snippets(page.name, number, comment))
        pending = ""
    for number, line in page.prose:
        found.extend(_inline_snippets(page.name, number, line))
    return found


def _inline_snippets(page: str, number: int, text: str) -> list[Snippet]:
    return [Snippet(page, number, m.group(2).strip(), shell=False) for m in INLINE_CODE.finditer(text)]


def _comment_snippets(page: str, number: int, comment: str) -> list[Snippet]:
    """Commands in a shell comment: inline code spans, and ``.venv/bin/tokentrail ...`` up to a ``(``."""
    found = _inline_snippets(page, number, comment)
    without_spans = INLINE_CODE.sub(" ", comment)
    for m in re.finditer(r"\S*/tokentrail\b[^(]*", without_spans):
        found.append(Snippet(page, number, m.group(0).strip(), shell=False))
    return found


# ---------------------------------------------------------------- commands


def commands(snippet: Snippet) -> list[list[str]]:
    """The simple commands of a snippet, as argument lists (environment assignments dropped)."""
    lexer = shlex.shlex(snippet.text, posix=True, punctuation_chars=SEPARATOR_CHARS)
    lexer.commenters = ""  # comments were split off already; a '#' inside a word is the word's
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote: prose in backticks, not a command
        return []
    found: list[list[str]] = []
    current: list[str] = []
    for token in [*tokens, ";"]:
        if token and all(ch in SEPARATOR_CHARS for ch in token):
            while current and ASSIGNMENT.match(current[0]):
                current.pop(0)
            if current:
                found.append(current)
            current = []
        else:
            current.append(token)
    return found


def is_tokentrail(word: str) -> bool:
    return word == "tokentrail" or word.endswith("/tokentrail")


@functools.cache
def subcommand_parser(name: str) -> argparse.ArgumentParser:
    """The parser of one subcommand, built as `tokentrail NAME` builds it (only its module imported)."""
    subcommands = _subparsers(build_parser([name]))
    assert subcommands is not None, "compose.cli.build_parser made no subcommands"
    return subcommands.choices[name]


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _clean(word: str) -> str:
    """A word of a shown command with its optional-part brackets removed (``[--engine``, ``URL]``)."""
    return word.strip("[]")


def check_tokentrail(args: list[str]) -> list[str]:
    """What is wrong with `tokentrail ARGS` as shown: an unknown subcommand, action or flag."""
    words = [w for w in (_clean(a) for a in args) if w and w not in ("...", "…")]
    if not words:
        return []  # the bare name, in prose
    if words[0].startswith("-"):
        return [] if words[0] in ("-h", "--help") else [f"`tokentrail {words[0]}`: not a flag of tokentrail itself"]
    name, rest = words[0], words[1:]
    if name not in SUBCOMMANDS:
        return [f"`tokentrail {name}`: no such subcommand (there are: {', '.join(SUBCOMMANDS)})"]
    parser = subcommand_parser(name)
    shown = f"tokentrail {name}"
    actions = _subparsers(parser)
    if actions is not None and rest and not rest[0].startswith("-"):
        if rest[0] not in actions.choices:
            return [f"`{shown} {rest[0]}`: no such action (there are: {', '.join(actions.choices)})"]
        shown = f"{shown} {rest[0]}"
        parser, rest = actions.choices[rest[0]], rest[1:]
    problems = []
    for word in rest:
        if not re.match(r"^(--[A-Za-z0-9]|-[A-Za-z]$)", word.split("=", 1)[0]):
            continue  # a value, a positional, a placeholder
        flag = word.split("=", 1)[0]
        if flag not in parser._option_string_actions:
            known = sorted(o for o in parser._option_string_actions if o.startswith("--"))
            problems.append(f"`{shown} {flag}`: no such flag (it takes: {', '.join(known)})")
    return problems


@functools.cache
def make_targets() -> frozenset[str]:
    targets: set[str] = set()
    for line in (REPO / "Makefile").read_text().splitlines():
        m = MAKE_RULE.match(line)
        if m:
            targets.update(m.group(1).split())
    return frozenset(targets)


def check_make(args: list[str]) -> list[str]:
    wanted = [a for a in args if not a.startswith("-") and "=" not in a and not a.startswith("<")]  # <target>
    return [f"`make {t}`: the Makefile has no such target" for t in wanted if t not in make_targets()]


def check_snippet(snippet: Snippet) -> list[str]:
    problems = []
    for words in commands(snippet):
        if is_tokentrail(words[0]):
            problems += check_tokentrail(words[1:])
        elif words[0] == "make" and (snippet.shell or len(words) > 1):
            problems += check_make(words[1:])
    return [f"{snippet.page}:{snippet.line}: {p}" for p in problems]


# ---------------------------------------------------------------- links


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text only
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for _, line in read_page(path).prose:
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Page) -> list[tuple[int, str]]:
    found = []
    for number, line in page.prose:
        for m in LINK.finditer(INLINE_CODE.sub(" ", line)):
            found.append((number, m.group(1)))
    return found


def check_link(source: Path, target: str) -> str | None:
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
        return None
    path_part, _, anchor = target.partition("#")
    path = (source.parent / path_part).resolve() if path_part else source
    if not path.is_relative_to(REPO):
        return f"({target}) leaves the repository"
    if not path.exists():
        return f"({target}) resolves to {path.relative_to(REPO)}, which does not exist"
    if anchor and path.suffix == ".md" and anchor not in anchors(path):
        return f"({target}): {path.relative_to(REPO)} has no heading with the anchor #{anchor}"
    return None


# ---------------------------------------------------------------- the pages


def test_the_readme_is_a_front_door():
    text = README.read_text()
    lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; at most {README_MAX_LINES}: move detail into docs/"
    for command in ("make demo", "make test"):
        assert command in text, f"README.md must show `{command}`"
    linked = {
        (README.parent / target.partition("#")[0]).resolve() for _, target in links(read_page(README))
    }
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not unlinked, f"README.md links no page {unlinked} of docs/"


@pytest.mark.parametrize("path", PAGES, ids=_name)
def test_every_relative_link_resolves(path):
    page = read_page(path)
    problems = [f"{page.name}:{n}: {p}" for n, t in links(page) if (p := check_link(path, t))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", PAGES, ids=_name)
def test_every_command_shown_parses(path):
    shown = snippets(read_page(path))
    problems = [p for s in shown for p in check_snippet(s)]
    assert not problems, "\n".join(problems)


def test_the_pages_show_commands_at_all():
    """The checkers see the commands: each reader's page shows some, and README shows its two."""
    shown = {path.name: [c for s in snippets(read_page(path)) for c in commands(s)] for path in PAGES}
    assert ["make", "demo"] in shown["README.md"] and ["make", "test"] in shown["README.md"]
    for name in ("deploying.md", "harness-authors.md", "trainer-authors.md", "diagnosing.md", "contributing.md"):
        assert any(is_tokentrail(c[0]) for c in shown[name]), f"docs/{name} shows no tokentrail command"


# ---------------------------------------------------------------- the checkers can fail


def _problems(markdown: str) -> list[str]:
    page = read_page(REPO / "docs" / "scratch.md", markdown)
    return [p for s in snippets(page) for p in check_snippet(s)]


@pytest.mark.parametrize("markdown, expected", [
    ("```bash\ntokentrail consume --bootstrap B --sinkk jsonl\n```", "`tokentrail consume --sinkk`: no such flag"),
    ("```bash\nBS=$(.venv/bin/tokentrail kafka statuss | cut -d' ' -f1)\n```", "`tokentrail kafka statuss`: no such action"),
    ("```\ntokentrail versions announce v1 --step 1 --bootstrap B --engin http://e\n```",
     "`tokentrail versions announce --engin`: no such flag"),
    ("```bash\ntokentrail topics --bootstrap B \\\n    --partition 3\n```", "`tokentrail topics --partition`: no such flag"),
    ("Run `tokentrail compose up` first.", "`tokentrail compose`: no such subcommand"),
    ("Run `tokentrail bench fold --worker` first.", "`tokentrail bench fold --worker`: no such flag"),
    ("```bash\nX=1 tokentrail replay --bootstrap B --summary --htm r.html & echo\n```",
     "`tokentrail replay --htm`: no such flag"),
    ("```bash\nmake demo   # = .venv/bin/tokentrail replay --last-demoo\n```", "`tokentrail replay --last-demoo`"),
    ("```bash\nmake dmeo\n```", "`make dmeo`: the Makefile has no such target"),
    ("Run `make test bench-all`.", "`make bench-all`"),
])
def test_the_command_checker_fails_on_what_does_not_exist(markdown, expected):
    problems = _problems(markdown)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize("markdown", [
    "```bash\ntokentrail kafka up --dir /tmp/k && tokentrail versions show --json --bootstrap B\n```",
    "```bash\ntokentrail replay --bootstrap $BS --rollout ID [--from 2h] [--format json]\n```",
    "```text\nmake sure the tokentrail --nonsense output is not read as a command\n```",
    "```python\nsubprocess.run(['tokentrail', '--nope'])\n```",
    "The topic `tokentrail.rollout-events` and the name `tokentrail` are not commands; `--sinkk` alone is no command.",
    "```bash\nmake chaos CHAOS_ARGS=\"--rollouts 16 --faults broker\"   # (the args go to tokentrail chaos)\n```",
])
def test_the_command_checker_passes_what_exists_and_what_is_no_command(markdown):
    assert _problems(markdown) == []


def test_the_link_checker_fails_on_a_missing_page_a_missing_anchor_and_a_path_outside():
    docs = REPO / "docs" / "scratch.md"
    assert "does not exist" in check_link(docs, "nope.md")
    assert "no heading with the anchor #nope" in check_link(docs, "ARCHITECTURE.md#nope")
    assert "leaves the repository" in check_link(docs, "../../shared/ARCHITECTURE.md")
    assert check_link(docs, "ARCHITECTURE.md#8-performance-budgets-2-cores-loopback-broker") is None
    assert check_link(docs, "../compose/docker-compose.yml") is None
    assert check_link(docs, "https://example.com/x#y") is None


@pytest.mark.parametrize("heading, anchor", [
    ("What `make demo` prints", "what-make-demo-prints"),
    ("5.2 processors — the fold", "52-processors--the-fold"),
    ("In-process: `rollout_stream`", "in-process-rollout_stream"),
    ("Asynchronous RL: policy versions across weight updates", "asynchronous-rl-policy-versions-across-weight-updates"),
])
def test_anchors_are_slugged_as_github_slugs_them(heading, anchor):
    assert slug(heading) == anchor
