"""fill_bitmasks in a process forked after a parallel fill (a pre-fork server, multiprocessing's
fork start method): llguidance's executor threads do not survive a fork, so the child needs its
own. Apart from tests/test_structured_output_spec.py because tools/mutate.py runs each mutant in
a forked process, where this test's own fork cannot tell a mutant from the original."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from edge_llm.engine.structured_output import GrammarCompiler, fill_bitmasks
from edge_llm.engine.tokenizer import load_tokenizer
from edge_llm.sampling_params import StructuredOutputsParams as SO
from tests.engine_fixtures import demo_dir  # noqa: F401

VOCAB = 49152


@pytest.fixture(scope="module")
def compiler(demo_dir):  # noqa: F811
    tok = load_tokenizer(demo_dir)
    return GrammarCompiler(tok, VOCAB, [tok.eos_token_id])


def test_a_forked_child_fills_masks_in_parallel(compiler):
    """A process forked after a parallel fill (a pre-fork server, multiprocessing's fork start)
    can still fill masks in parallel, with the same result."""
    matchers = [compiler.compile(SO(regex=r)).matcher() for r in ("[0-9]+", "a|b", ".+")]
    want = fill_bitmasks(matchers, VOCAB)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only when the masks came back equal, never return
        code = 1
        try:
            code = 0 if np.array_equal(fill_bitmasks(matchers, VOCAB), want) else 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's parallel fill hung")
