"""The advisories docs/security.md accepts, read from its "Known-vulnerable pins" table, the one list of them.

    python buildtools/known_advisories.py docs/security.md > .trivyignore

writes the image scan's ignore file (Trivy's format: one advisory id a line, `#` comments), every CVE and
GHSA id of the table's advisory column, under a comment naming the row's package. A page with no such table,
or a row that names no id, stops it with one line and exit status 2.
"""

import re
import sys
from pathlib import Path

HEADING = "## Known-vulnerable pins"
ADVISORY_ID = re.compile(r"\b(CVE-\d{4}-\d{4,}|GHSA(?:-[2-9cfghjmpqrvwx]{4}){3})\b")


class TableError(ValueError):
    pass


def table_rows(text):
    """The cells of each body row of the first table under HEADING."""
    section = text.split(f"\n{HEADING}\n", 1)
    if len(section) < 2:
        raise TableError(f'no "{HEADING}" section')
    section = re.split(r"\n## ", section[1], maxsplit=1)[0]
    lines = [line.strip() for line in section.splitlines()]
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        raise TableError(f'no table under "{HEADING}"')
    rows = []
    for line in lines[start + 2 :]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def known_advisories(text):
    """[(package, [advisory ids])] in the table's order; the advisory is the second column."""
    known = []
    for cells in table_rows(text):
        ids = list(dict.fromkeys(ADVISORY_ID.findall(cells[1] if len(cells) > 1 else "")))
        if not ids:
            raise TableError(f"the row of {cells[0]!r} names no CVE or GHSA id in its advisory column")
        known.append((cells[0], ids))
    return known


def ignore_file(text, source):
    lines = [f"# The advisories {source} lists under {HEADING[3:]!r}, written by buildtools/known_advisories.py."]
    for package, ids in known_advisories(text):
        lines += [f"# {package}", *ids]
    return "\n".join(lines) + "\n"


def main(argv):
    if len(argv) != 1:
        sys.exit("usage: python buildtools/known_advisories.py docs/security.md > IGNORE_FILE")
    try:
        sys.stdout.write(ignore_file(Path(argv[0]).read_text(encoding="utf-8"), argv[0]))
    except (OSError, TableError) as error:
        print(
            f"known_advisories: {argv[0]}: {error}; expected a table of package | advisory (CVE or GHSA ids) | ...",
            file=sys.stderr,
        )
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
