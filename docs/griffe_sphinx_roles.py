"""A griffe extension for the docs site: the reST in docstrings, as Markdown.

commlib's docstrings are Google style, but cross-reference with Sphinx roles
(``:class:`~commlib.Communicator```, ``:meth:`Backend.device```) and now and
then end a line with ``::`` before an indented literal block, which
mkdocstrings would print as they are. Once the package is loaded this
extension rewrites, in every docstring:

* each role into code text that links to the object's entry in the API
  reference. The link is an *optional* autoref: a target the site does not
  render (a private module, a name that does not resolve) stays plain code
  text instead of failing the strict build;
* each ``::`` literal block into a fenced code block.

Examples:
    In ``mkdocs.yml``, under the python handler's options::

        extensions:
          - docs/griffe_sphinx_roles.py:SphinxRoles
"""

from __future__ import annotations

import re
from html import escape
from typing import Any

import griffe

# :class:`~commlib.errors.CommError`, :py:func:`init_dist`, :meth:`World.run()`
_ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`(?P<short>~?)(?P<target>[\w.]+)(?:\(\))?`"
)


def _identifier(obj: griffe.Object, target: str) -> str | None:
    """The full path ``target`` names where it is written, or ``None``."""
    if target.split(".", 1)[0] in ("commlib", "commlib_backends"):
        return target
    head, _, rest = target.partition(".")
    try:
        full = obj.resolve(head)
    except griffe.NameResolutionError:  # a name griffe cannot place: plain text
        return None
    return f"{full}.{rest}" if rest else full


def _rewrite_roles(obj: griffe.Object, text: str) -> str:
    def link(m: re.Match[str]) -> str:
        target = m["target"]
        shown = target.rsplit(".", 1)[-1] if m["short"] else target
        identifier = _identifier(obj, target)
        if identifier is None:
            return f"`{shown}`"
        return (
            f'<autoref identifier="{escape(identifier)}" optional>'
            f"<code>{escape(shown)}</code></autoref>"
        )

    return _ROLE.sub(link, text)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _fence_literal_blocks(text: str) -> str:
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        if not line.rstrip().endswith("::") or line.lstrip().startswith(">>>"):
            out.append(line)
            i += 1
            continue
        # the block is indented past the paragraph's text; in a bullet, past the marker
        start = i
        while start > 0 and lines[start - 1].strip():
            start -= 1
        bullet = re.match(r"\s*(?:[*+-]|\d+[.)])\s+", lines[start])
        base = bullet.end() if bullet and start == i else _indent(line)
        end = i + 1
        while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > base):
            end += 1
        block = lines[i + 1 : end]
        while block and not block[-1].strip():
            block.pop()
        while block and not block[0].strip():
            block.pop(0)
        if not any(b.strip() for b in block):
            out.append(line)
            i += 1
            continue
        head = line.rstrip()[:-2].rstrip()
        if head.strip():
            out.append(head + (":" if line.rstrip()[-3:-2] != " " else ""))
        depth = min(_indent(b) for b in block if b.strip())
        # Python-Markdown nests a block in a list item only at the item's indent + 4
        pad = " " * (_indent(lines[start]) + 4 if bullet else base)
        out += ["", pad + "```"]
        out += [pad + b[depth:] if b.strip() else "" for b in block]
        out += [pad + "```", ""]
        i = end
    return "\n".join(out)


def _walk(obj: griffe.Object) -> None:
    if obj.docstring is not None:
        text = _fence_literal_blocks(obj.docstring.value)
        obj.docstring.value = _rewrite_roles(obj, text)
    for member in obj.members.values():
        if not member.is_alias:  # an alias is rewritten where it is defined
            _walk(member)


class SphinxRoles(griffe.Extension):
    """Rewrite the roles and literal blocks of every docstring in a loaded package.

    Examples:
        >>> griffe.load("commlib", extensions=griffe.load_extensions(SphinxRoles))
    """

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Called by griffe 2 once a package and all its modules are loaded."""
        _walk(pkg)

    # griffe 1 names the same event differently
    on_package_loaded = on_package
