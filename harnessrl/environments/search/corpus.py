"""The search environment's corpus: passages built offline from the package metadata installed with Python.

    build_corpus(site_dirs=None, *, target_words=150) -> list[Passage]
    write_corpus(passages, path) -> CorpusInfo        JSONL, one passage a line, plus <path>.info.json
    read_corpus(path) -> list[Passage]
    default_site_dirs() -> list[Path]                 this interpreter's site-packages

Source: every `*.dist-info/METADATA` under the given site-packages directories (default: those on the running
interpreter's sys.path, i.e. the project venv's), read with the stdlib email parser. Each distribution gives

- one **card** passage (`<name>/card`): name, version, summary, license, required Python, author, home page,
  keywords, as "Field: value." sentences (the questions about fields are answered from it);
- its long description (the README it was uploaded with), cleaned of markup (HTML tags, image and link
  syntax, badge and directive lines, code fences kept as text) and cut into passages `<name>/<nnn>` of
  ~`target_words` words (paragraphs kept whole from 100 words on, longer ones split at 200), each titled
  with the package and the last heading above it.

Invariants: the output depends only on the installed distributions (sorted by normalized name; a name seen
in two directories is taken from the first); doc ids are unique; no passage is empty. The info file records
the distributions and versions and the SHA-256 of the JSONL, so a rebuild on another machine can be checked.
"""

from __future__ import annotations

import email.parser
import email.policy
import hashlib
import logging
import re
import sys
import sysconfig
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from harnessrl.io import atomic_write_json, read_jsonl, write_jsonl

log = logging.getLogger(__name__)

MIN_WORDS, TARGET_WORDS, MAX_WORDS = 100, 150, 200
CARD_FIELDS = (
    ("Summary", "Summary"),
    ("License", "License"),
    ("Requires-Python", "Requires Python"),
    ("Author", "Author"),
    ("Home-page", "Home page"),
    ("Keywords", "Keywords"),
)


class CorpusError(ValueError):
    """A corpus file that cannot be read back (the message names the file, the line and the field)."""


@dataclass(frozen=True)
class Passage:
    doc_id: str
    title: str
    text: str
    package: str  # the distribution's name as its METADATA spells it


@dataclass(frozen=True)
class PackageMeta:
    """The METADATA fields questions are made from (empty string: not declared)."""

    name: str
    key: str  # normalized name: lowercase, runs of -_. as "-"
    version: str
    summary: str
    license: str
    requires_python: str
    author: str
    home_page: str
    keywords: str
    description: str


@dataclass(frozen=True)
class CorpusInfo:
    path: str
    passages: int
    packages: int
    sha256: str
    distributions: dict[str, str]  # normalized name -> version


def default_site_dirs() -> list[Path]:
    """The directories this interpreter imports installed distributions from: every site-packages /
    dist-packages entry of sys.path, in order (the interpreter's own purelib when there is none)."""
    dirs: list[Path] = []
    for entry in sys.path:
        p = Path(entry)
        if p.name in ("site-packages", "dist-packages") and p.is_dir() and p.resolve() not in dirs:
            dirs.append(p.resolve())
    return dirs or [Path(sysconfig.get_paths()["purelib"]).resolve()]


def normalize_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_packages(site_dirs: Iterable[Path] | None = None) -> list[PackageMeta]:
    """Every distribution's metadata below `site_dirs`, sorted by normalized name, first directory wins."""
    seen: dict[str, PackageMeta] = {}
    parser = email.parser.BytesParser(policy=email.policy.compat32)
    for site in site_dirs if site_dirs is not None else default_site_dirs():
        for path in sorted(Path(site).glob("*.dist-info/METADATA")):
            msg = parser.parsebytes(path.read_bytes())
            name = _clean_field(msg.get("Name"))
            if not name or normalize_name(name) in seen:
                continue
            body = msg.get_payload()
            description = (
                body if isinstance(body, str) and body.strip() else str(msg.get("Description") or "")
            )
            license_ = _clean_field(msg.get("License-Expression")) or _short_license(msg.get("License"))
            seen[normalize_name(name)] = PackageMeta(
                name=name,
                key=normalize_name(name),
                version=_clean_field(msg.get("Version")),
                summary=_clean_field(msg.get("Summary")),
                license=license_,
                requires_python=_clean_field(msg.get("Requires-Python")).replace(" ", ""),
                author=_clean_field(msg.get("Author")) or _author_from_email(msg.get("Author-email")),
                home_page=_clean_field(msg.get("Home-page"))
                or _home_from_urls(msg.get_all("Project-URL") or []),
                keywords=_clean_field(msg.get("Keywords")),
                description=unicodedata.normalize("NFC", description),
            )
    return [seen[k] for k in sorted(seen)]


def build_corpus(
    site_dirs: Iterable[Path] | None = None, *, target_words: int = TARGET_WORDS
) -> list[Passage]:
    passages: list[Passage] = []
    packages = read_packages(site_dirs)
    for meta in packages:
        passages.append(card_passage(meta))
        for i, (heading, text) in enumerate(chunk_description(meta.description, target_words)):
            title = f"{meta.name}: {heading}" if heading else f"{meta.name}: description"
            passages.append(Passage(f"{meta.key}/{i:03d}", title, text, meta.name))
    log.info("corpus: %d passages from %d distributions", len(passages), len(packages))
    return passages


def card_passage(meta: PackageMeta) -> Passage:
    values = {
        "Summary": meta.summary,
        "License": meta.license,
        "Requires-Python": meta.requires_python,
        "Author": meta.author,
        "Home-page": meta.home_page,
        "Keywords": meta.keywords,
    }
    parts = [f"Package {meta.name}, version {meta.version}."]
    parts += [f"{label}: {values[key].rstrip('.')}." for key, label in CARD_FIELDS if values[key]]
    return Passage(
        f"{meta.key}/card", f"{meta.name} {meta.version} (package metadata)", " ".join(parts), meta.name
    )


def write_corpus(passages: Sequence[Passage], path: Path) -> CorpusInfo:
    ids = [p.doc_id for p in passages]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise CorpusError(f"{path}: doc id {dup!r} appears twice; doc ids must be unique")
    write_jsonl(path, (asdict(p) for p in passages))
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    packages: dict[str, str] = {}
    for p in passages:
        if p.doc_id.endswith("/card"):
            packages[p.doc_id.removesuffix("/card")] = p.title.split(" ")[1] if " " in p.title else ""
    info = CorpusInfo(str(path), len(passages), len(packages), digest, packages)
    atomic_write_json(Path(f"{path}.info.json"), asdict(info))
    return info


def read_corpus(path: Path) -> list[Passage]:
    out: list[Passage] = []
    for n, row in enumerate(read_jsonl(path), start=1):
        for key in ("doc_id", "title", "text", "package"):
            if not isinstance(row.get(key), str) or not row[key]:
                raise CorpusError(
                    f"{path}: line {n}: field {key!r} missing or empty; rebuild with write_corpus"
                )
        out.append(Passage(row["doc_id"], row["title"], row["text"], row["package"]))
    return out


# -- description cleaning and chunking --------------------------------------------------------------------
_HTML_TAG = re.compile(r"<[^>\n]{1,400}>")
_MD_IMAGE = re.compile(r"!\[[^\]\n]*\]\([^)\n]*\)")
_MD_LINK = re.compile(r"\[([^\]\n]+)\]\([^)\n]*\)")
_MD_REF_DEF = re.compile(r"^\s*\[[^\]]+\]:\s*\S+.*$", re.M)
_RST_DIRECTIVE = re.compile(r"^\s*\.\. .*$", re.M)  # .. image::, .. _target: url, comments
_RST_LINK = re.compile(r"`([^`<\n]+?)\s*<[^>\n]+>`_{1,2}")
_RST_SUBST = re.compile(r"\|[\w\- ]+\|_?")
_RST_OPTION = re.compile(r"^\s*:[\w-]+:.*$", re.M)  # :target: url, :alt: text (directive options)
_RST_ANON = re.compile(r"`([^`\n]+?)`_{1,2}")
_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+]{3,})\s*$")
_MD_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
_WORD = re.compile(r"\S+")


def clean_markup(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\t", " ")
    text = _RST_LINK.sub(r"\1", text)  # before tags: `name <url>`_ would look like one
    text = _RST_ANON.sub(r"\1", text)
    text = _HTML_TAG.sub(" ", text)
    text = _MD_IMAGE.sub(" ", text)
    text = _MD_LINK.sub(r"\1", text)
    text = _MD_REF_DEF.sub("", text)
    text = _RST_DIRECTIVE.sub("", text)
    text = _RST_OPTION.sub("", text)
    text = _RST_SUBST.sub(" ", text)
    return text.replace("```", " ").replace("**", "").replace("``", "")


def paragraphs(text: str) -> list[tuple[str, str]]:
    """(heading above it, paragraph text collapsed to one line) for each paragraph with letters in it."""
    out: list[tuple[str, str]] = []
    heading = ""
    lines = clean_markup(text).split("\n")
    block: list[str] = []

    def flush() -> None:
        joined = " ".join(" ".join(block).split())
        if re.search(r"[A-Za-z]{2}", joined):
            out.append((heading, joined))
        block.clear()

    for i, line in enumerate(lines):
        md = _MD_HEADING.match(line)
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if md:
            flush()
            heading = md.group(1).strip()[:80]
        elif line.strip() and _RST_UNDERLINE.match(nxt) and len(nxt.strip()) >= len(line.strip()) - 2:
            flush()
            heading = line.strip()[:80]
        elif _RST_UNDERLINE.match(line):
            continue
        elif not line.strip():
            flush()
        else:
            block.append(line.strip())
    flush()
    return out


def chunk_description(text: str, target_words: int = TARGET_WORDS) -> list[tuple[str, str]]:
    """(heading, passage text) chunks of about `target_words` words, paragraphs kept whole when they fit."""
    chunks: list[tuple[str, str]] = []
    current: list[str] = []
    current_heading = ""
    for heading, para in paragraphs(text):
        words = _WORD.findall(para)
        if not current:
            current_heading = heading
        if len(words) > MAX_WORDS:
            if current:
                chunks.append((current_heading, " ".join(current)))
                current = []
            for start in range(0, len(words), target_words):
                piece = words[start : start + target_words]
                if len(piece) < MIN_WORDS // 2 and chunks and chunks[-1][0] == heading:
                    chunks[-1] = (heading, chunks[-1][1] + " " + " ".join(piece))
                else:
                    chunks.append((heading, " ".join(piece)))
            continue
        if current and len(current) + len(words) > MAX_WORDS:
            chunks.append((current_heading, " ".join(current)))
            current = []
            current_heading = heading
        current.extend(words)
        if len(current) >= MIN_WORDS:
            chunks.append((current_heading, " ".join(current)))
            current = []
    if current:
        if (
            chunks
            and len(current) < MIN_WORDS // 2
            and len(chunks[-1][1].split()) + len(current) <= MAX_WORDS
        ):
            chunks[-1] = (chunks[-1][0], chunks[-1][1] + " " + " ".join(current))
        else:
            chunks.append((current_heading, " ".join(current)))
    return chunks


# -- field cleaning ----------------------------------------------------------------------------------------
def _clean_field(value: object) -> str:
    if value is None:
        return ""
    text = " ".join(str(value).split())
    return "" if text.upper() == "UNKNOWN" else unicodedata.normalize("NFC", text)


def _short_license(value: object) -> str:
    """A License field is sometimes the whole license text: keep it only when it is a name (one line)."""
    raw = str(value or "")
    text = _clean_field(raw)
    return text if text and "\n" not in raw.strip() and len(text) <= 40 else ""


def _author_from_email(value: object) -> str:
    text = _clean_field(value)
    names = [part.split("<")[0].strip().strip('"') for part in text.split(",")]
    return ", ".join(n for n in names if n)


def _home_from_urls(urls: Sequence[str]) -> str:
    for entry in urls:
        label, _, url = str(entry).partition(",")
        if label.strip().lower() in ("homepage", "home", "home page", "source", "repository"):
            return url.strip()
    return ""
