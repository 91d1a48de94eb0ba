"""``--help`` of ``edge-llm``, ``serve`` and ``quantize``: every flag explained, every default
stated once and truthfully, every environment variable listed where the README says."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from edge_llm.cli import build_parser
from edge_llm.flags import SERVE_OPTIONS

README = Path(__file__).resolve().parent.parent / "README.md"


def subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subs.choices[name]


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_top_level_help_lists_every_environment_variable():
    text = flat(build_parser().format_help())
    for opt in SERVE_OPTIONS:
        for env in opt.envs:
            assert re.search(rf"\b{env}\b", text), env
    for env in ("EDGE_LLM_MODEL", "EDGE_LLM_CACHE_DIR"):
        assert env in text
    # the README sends the reader there
    assert "`edge-llm --help` lists" in flat(README.read_text())


def test_serve_help_states_each_default_once_and_never_none():
    parser = subparser("serve")
    text = flat(parser.format_help())
    assert "default None" not in text and "default: None" not in text
    by_flag = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
    for opt in SERVE_OPTIONS:
        help_text = flat(by_flag[opt.flag].help or "")
        stated = help_text.count("(default") + help_text.count("; default ")
        assert stated >= 1, f"{opt.flag}: no default stated: {help_text}"
        if opt.default is None:  # said in words, not as a value
            assert "; default " not in help_text, help_text
    assert "--default-max-tokens" in by_flag and "--generation-config" in by_flag
    assert "1024" in by_flag["--default-max-tokens"].help


def test_quantize_help_explains_every_flag_with_its_default():
    parser = subparser("quantize")
    text = flat(parser.format_help())
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = action.option_strings[0] if action.option_strings else action.dest
        assert action.help and len(action.help) > 10, f"{name} has no help"
        if action.required or not action.option_strings:
            continue
        shown = flat(parser._get_formatter()._expand_help(action))
        assert f"(default: {action.default})" in shown, name
    assert "(default: None)" not in text


def test_chat_help_explains_every_flag():
    parser = subparser("chat")
    for action in parser._actions:
        assert action.help, action.dest
        if action.option_strings and action.default not in (None, argparse.SUPPRESS):
            assert f"(default: {action.default})" in action.help, action.dest


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"], ["quantize", "--help"]])
def test_help_exits_zero(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(argv)
    assert stop.value.code == 0 and capsys.readouterr().out.startswith("usage: edge-llm")
