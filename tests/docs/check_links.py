#!/usr/bin/env python3
"""Every relative link in the repository's Markdown files resolves.

    /usr/bin/python3 tests/docs/check_links.py [REPO_ROOT]

For each Markdown file git knows (tracked, or new and not ignored; without git: every *.md
outside build folders and node_modules), every link outside code, inline `[text](target)`,
image, reference definition `[name]: target` and HTML `href`/`src`, whose target has no URL
scheme must name a file or folder that exists in the repository, and its `#anchor`, when the
target is a Markdown file (or the file itself), must be the anchor GitHub makes of one of that
file's headings (lower case; punctuation but `-` and `_` dropped; each space a `-`; `-1`, `-2`
for repeats) or an explicit `<a name>`/`id`. Prints every broken link as FILE:LINE and exits 1;
exits 0 and prints the count when all resolve.
"""
import os
import re
import subprocess
import sys
import urllib.parse

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"
                    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HTML_LINK = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
HTML_ANCHOR = re.compile(r"""<a\s[^>]*\b(?:name|id)\s*=\s*["']([^"']+)["']""", re.IGNORECASE)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def markdown_files(root):
    """Repository-relative paths of the Markdown files to check."""
    try:
        out = subprocess.run(
            ["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard",
             "--", "*.md", "*.markdown"],
            check=True, capture_output=True).stdout.decode()
        files = sorted({f for f in out.split("\0") if f})
    except (OSError, subprocess.CalledProcessError):
        files = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if not d.startswith((".", "build")) and d != "node_modules"]
            files += [os.path.relpath(os.path.join(folder, n), root)
                      for n in names if n.endswith((".md", ".markdown"))]
        files.sort()
    return [f for f in files if os.path.isfile(os.path.join(root, f))]


def plain_text(heading):
    """A heading's text as GitHub renders it: no code ticks, links as their text, no tags."""
    text = CODE_SPAN.sub(lambda m: m.group(2).strip(), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return text


def slug(heading):
    """GitHub's anchor for a heading (github-slugger)."""
    text = plain_text(heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def scan(path):
    """(anchors, links) of one Markdown file: links as (line number, target)."""
    anchors, counts, links = set(), {}, []
    fence = None
    previous = ""  # the previous line, when it could be a setext heading's text

    def add_heading(text):
        base = slug(text)
        n = counts.get(base, 0)
        counts[base] = n + 1
        anchors.add(base if n == 0 else f"{base}-{n}")

    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for number, line in enumerate(lines, 1):
        opened = FENCE.match(line)
        if fence:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence) \
                    and not line.strip()[len(opened.group(1)):].strip():
                fence = None
            continue
        if opened:
            fence = opened.group(1)
            previous = ""
            continue
        heading = ATX.match(line)
        if heading:
            add_heading(heading.group(2) or "")
            previous = ""
        elif SETEXT.match(line) and previous and not previous.lstrip().startswith(
                ("-", "*", "+", ">", "|")) and not re.match(r"^\s*\d+[.)]\s", previous):
            add_heading(previous.strip())
            previous = ""
            continue
        else:
            previous = line if line.strip() and not line.startswith(("    ", "\t")) else ""
        anchors.update(HTML_ANCHOR.findall(line))
        text = CODE_SPAN.sub("code", line)
        for match in INLINE.finditer(text):
            links.append((number, match.group(1)))
        reference = REFERENCE.match(text)
        if reference:
            links.append((number, reference.group(1)))
        for target in HTML_LINK.findall(text):
            links.append((number, target))
    return anchors, links


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", ".."))
    files = markdown_files(root)
    if not files:
        print(f"check_links: no Markdown files found under {root}", file=sys.stderr)
        return 1
    scanned = {f: scan(os.path.join(root, f)) for f in files}
    anchors_of = {f: anchors for f, (anchors, _) in scanned.items()}

    def anchors(relative):
        if relative not in anchors_of:
            anchors_of[relative] = scan(os.path.join(root, relative))[0]
        return anchors_of[relative]

    broken, checked = [], 0
    for source, (_, links) in scanned.items():
        for number, raw in links:
            target = raw[1:-1] if raw.startswith("<") and raw.endswith(">") else raw
            if not target or SCHEME.match(target) or target.startswith("//"):
                continue
            checked += 1
            path, _, anchor = target.partition("#")
            path = urllib.parse.unquote(path)
            anchor = urllib.parse.unquote(anchor)
            where = f"{source}:{number}: link '{raw}'"
            if path:
                base = root if path.startswith("/") else os.path.dirname(os.path.join(root, source))
                resolved = os.path.normpath(os.path.join(base, path.lstrip("/")))
                relative = os.path.relpath(resolved, root)
                if relative.startswith(".."):
                    broken.append(f"{where}: leaves the repository ({relative})")
                    continue
                if not os.path.exists(resolved):
                    broken.append(f"{where}: no file or folder '{relative}'")
                    continue
            else:
                relative = source
            if anchor and relative.endswith((".md", ".markdown")) and os.path.isfile(
                    os.path.join(root, relative)):
                found = anchors(relative)
                if anchor not in found:
                    near = sorted(a for a in found if a[:4] == anchor[:4])[:5]
                    broken.append(f"{where}: '{relative}' has no heading with the anchor "
                                  f"'#{anchor}'" + (f" (similar: {', '.join(near)})" if near
                                                    else ""))
    for line in broken:
        print(line)
    if broken:
        print(f"check_links: {len(broken)} broken of {checked} relative links in "
              f"{len(files)} Markdown files", file=sys.stderr)
        return 1
    print(f"check_links: {checked} relative links in {len(files)} Markdown files resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
