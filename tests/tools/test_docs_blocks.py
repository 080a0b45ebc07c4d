"""Every code block of the README and docs/: run by a test, or marked with why not.

The marker convention is in :mod:`tests.tools.docs_blocks`. Blocks marked
``run`` run here, each on fresh processes (``N ranks``: the variables torchrun
sets, so ``init_dist("pytorch")`` works as written); ``run by`` names the file
that runs them; ``not run`` gives the reason.
"""

from __future__ import annotations

import pytest

from tests.tools.docs_blocks import ROOT, Block, blocks, pages, run_block

ALL = [block for page in pages() for block in blocks(page)]
RUN = [block for block in ALL if block.mode == "run"]


def test_every_block_is_run_or_says_why_not():
    unmarked = [b.where for b in ALL if not b.mode]
    assert not unmarked, (
        "code blocks with no marker: put '<!-- run: 2 ranks -->' (or '1 process'), "
        "'<!-- run by: PATH -->' or '<!-- not run: REASON -->' above each of "
        f"{unmarked} (see tests/tools/docs_blocks.py)"
    )
    assert not [b.where for b in ALL if b.mode == "not run" and not b.argument]
    assert [b.ranks for b in RUN]  # each says how many processes


@pytest.mark.parametrize("block", [b for b in ALL if b.mode == "run by"], ids=lambda b: b.where)
def test_a_block_run_elsewhere_names_a_file_that_runs_it(block: Block):
    runner = ROOT / block.argument
    assert runner.is_file(), f"{block.where}: 'run by: {block.argument}' is not a file"
    text = runner.read_text()
    if runner.suffix == ".py":  # a test: it reads the page's blocks itself
        assert block.page.name in text, f"{block.argument} never reads {block.page.name}"
    else:  # a script (CI's): it runs the block's commands as they are
        missing = [line for line in block.code.splitlines() if line.strip() not in text]
        assert not missing, f"{block.where}: {block.argument} does not run {missing}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block", RUN, ids=lambda b: b.where)
def test_the_block_runs(block: Block, tmp_path):
    run_block(block, tmp_path)
