"""The answer grammar and parser, the prompt text, and run profiles (pure parts; no model)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from submission.reasoning.reply_grammar import CALL_OPEN, Reply, answer_grammar, parse_answer
from submission.reasoning.profile import EngineConfig
from submission.profiles import ProfileError, load_profile, to_toml
from submission.reasoning.prompt import grid_text, repair_text, task_text
from submission.tasks import load_tasks
from submission.views import reordered

CUE = EngineConfig().program_cue


def test_parse_a_complete_answer():
    text = ("some thinking</think>\n\n1 2 3\n4 5 6\n" + CUE + "\n    return [row[::-1] for row in grid]\n```"
            "<|im_end|>")
    parsed = parse_answer(text)
    assert parsed.grid == ((1, 2, 3), (4, 5, 6)) and parsed.error is None
    assert parsed.program == "def transform(grid):\n    return [row[::-1] for row in grid]\n"


def test_parse_failures_say_why():
    assert parse_answer("</think>\nno grid here").error == "no grid rows after </think>"
    assert "ragged" in parse_answer("</think>\n1 2\n3\n").error
    assert parse_answer("</think>\n1 2\n").program is None


def test_grammar_has_one_alternative_per_width_and_the_cue():
    grammar = answer_grammar(CUE, 500)
    assert len(re.findall(r"^row\d+ ::=", grammar, re.M)) == 30
    assert "```python\\ndef transform(grid):" in grammar
    assert grammar.count("row30 ::= d" + ' " " d' * 29) == 1
    assert '{0,500} "```"' in grammar


def test_parse_a_call_and_a_cut_call():
    body = "\n    return grid\n"
    parsed = parse_answer(f"thinking</think>\n{CALL_OPEN}{body}```<|im_end|>")
    assert parsed.call and parsed.closed and parsed.grid is None and parsed.program == "def transform(grid):" + body
    cut = parse_answer(f"</think>{CALL_OPEN}{body}")
    assert cut.call and not cut.closed
    assert not parse_answer(f"{CALL_OPEN}{body}```").call  # no </think>: thinking, not a call


def test_only_the_call_grammar_admits_a_call():
    """The grammars as the engines compile them (xgrammar): a tool agent's first turn calls (Algorithm 7 line 4), its
    later turns call or answer; others answer."""
    xgr = pytest.importorskip("xgrammar", reason="needs the engine environment (make engine-env)")
    info = xgr.TokenizerInfo([chr(c) for c in range(32, 127)] + ["\n", "<eot>"], stop_token_ids=[96])
    compiler = xgr.GrammarCompiler(info)
    call_text = f"\n{CALL_OPEN}\n    return grid\n```"
    answer_text = "\n1 2\n3 4\n" + CUE + "\n    return grid\n```"

    def accepts(grammar, text):
        matcher = xgr.GrammarMatcher(compiler.compile_grammar(grammar))
        return matcher.accept_string(text) and matcher.is_completed()

    assert accepts(answer_grammar(CUE, 500, Reply.CALL), call_text)
    assert not accepts(answer_grammar(CUE, 500, Reply.CALL), answer_text)
    assert accepts(answer_grammar(CUE, 500, Reply.EITHER), call_text)
    assert accepts(answer_grammar(CUE, 500, Reply.EITHER), answer_text)
    assert accepts(answer_grammar(CUE, 500), answer_text)
    assert not accepts(answer_grammar(CUE, 500), call_text)


def test_prompt_is_row_wise_with_sizes(arc_data):
    task = load_tasks(arc_data / "arc-agi-2" / "training" / "3c9b0459.json").tasks[0]
    text = task_text(task, 0, load_profile("cpu-tiny").prompt)
    assert "Example 4\nInput:\n3x3\n" in text and text.endswith("Test input:\n3x3\n" + grid_text(task.test_inputs[0]))
    shifted = task_text(task, 0, load_profile("cpu-tiny").prompt, reordered(len(task.train)))
    assert shifted != text and sorted(shifted.split("\n")) == sorted(text.split("\n"))


def test_repair_text_lists_differences():
    expected = ((1, 2), (3, 4))
    text = repair_text("def transform(grid):\n    return grid\n",
                       [(expected, expected, "right"), (expected, ((1, 2), (3, 5)), "wrong"),
                        (expected, ((1,),), "wrong"), (expected, None, "ZeroDivisionError")])
    assert "Example 1: correct." in text
    assert "Example 2: 1 cells differ (row, column): (1,1) expected 4 got 5." in text
    assert "Example 3: produced a 1x1 grid, expected 2x2." in text
    assert "Example 4: no grid (ZeroDivisionError)." in text


@pytest.mark.parametrize("name", ["cpu-tiny", "dense-27b-4xL4", "moe-4xL4", "moe-4xL4-direct"])
def test_shipped_profiles_load_and_round_trip(name, tmp_path):
    profile = load_profile(name)
    copy = tmp_path / "copy.toml"
    copy.write_text(to_toml(profile))
    assert load_profile(copy) == profile


def test_the_copied_profile_keeps_every_section(tmp_path):
    source = tmp_path / "agent.toml"
    source.write_text((Path(__file__).resolve().parents[1] / "profiles" / "cpu-tiny.toml").read_text()
                      + "\n[tool_agent]\nenabled = true\nchecks = 3\n")
    profile = load_profile(source)
    copy = tmp_path / "copy.toml"
    copy.write_text(to_toml(profile))
    assert load_profile(copy).tool_agent == profile.tool_agent and profile.tool_agent.checks == 3


def test_profile_errors_name_file_section_and_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[schedule]\nrate_tok_s = 8.0\ncap_frist = 3\n")
    with pytest.raises(ProfileError, match=r"bad.toml.schedule: unknown key\(s\) cap_frist"):
        load_profile(bad)
    bad.write_text("[engine]\nkind = 'tpu'\n")
    with pytest.raises(ProfileError, match="engine.kind must be hf, vllm or replay"):
        load_profile(bad)
    bad.write_text("[sandbox]\ncpu_s = 'ten'\n")
    with pytest.raises(ProfileError, match=r"sandbox.cpu_s: expected int"):
        load_profile(bad)
    with pytest.raises(ProfileError, match=r"shipped profiles: ([A-Za-z0-9-]+, )*cpu-tiny, "):
        load_profile("no-such-profile")
