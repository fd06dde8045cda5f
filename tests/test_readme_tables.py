"""README.md quotes no bench number by hand: its headline tables are `python -m memr1.bench.table results/
--readme`, checked here against results/, so the README cannot drift from its evidence. Also: the README
stays one screenful per topic, and nothing in README.md or docs/ links outside the repository."""
import re
from pathlib import Path

from memr1.bench import table

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FIX = "render them again: python -m memr1.bench.table results/ --readme --update README.md"


def rendered_section(text: str) -> str:
    """What README.md holds between the table markers (the line break after BEGIN left out)."""
    assert text.count(table.BEGIN) == 1 and text.count(table.END) == 1, "README.md needs one pair of table markers"
    inside = text.split(table.BEGIN, 1)[1].split(table.END, 1)[0]
    assert inside.startswith("\n"), f"{table.BEGIN} must end its line"
    return inside[1:]


def test_readme_tables_are_the_rendered_results():
    """An empty results/ renders a present-but-empty section; with JSONs, every row of the README's tables."""
    assert rendered_section(README.read_text()) == table.readme_tables(ROOT / "results"), \
        f"README.md's headline tables differ from results/; {FIX}"


def test_readme_stays_short():
    assert len(README.read_text().splitlines()) <= 260, "README.md is for users; move detail to docs/"


def docs_files() -> list[Path]:
    return [README, ROOT / "results" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_docs_links_resolve_inside_the_repository():
    """Every relative link of README.md, results/README.md and docs/ names a file or folder of this
    checkout; none reaches the notes or data beside it, which a user's clone does not have."""
    for doc in docs_files():
        text = doc.read_text()
        outside = re.search(r"\.\./shared|DESIGN\.md|ENVIRONMENT\.md", text)
        assert not outside, f"{doc.name} points outside the repository: {outside.group(0)}"
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://|#", target):
                continue
            path = (doc.parent / target.split("#")[0]).resolve()
            assert path.exists() and ROOT in path.parents, f"{doc.relative_to(ROOT)}: link {target} leads nowhere"
