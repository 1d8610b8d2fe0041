"""orchestrator.foundation.sanitise: what a task or user wrote, made storable in either database."""
from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.foundation.sanitise import REPLACEMENT, clean, clean_text

# Any str Python can hold, surrogates included (hypothesis leaves them out unless asked).
any_text = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()))
json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | any_text | st.binary(),
    lambda children: st.lists(children) | st.dictionaries(any_text, children),
    max_leaves=20,
)


def storable(value) -> bool:
    """Encodable as UTF-8 (the driver's job) with no NUL (PostgreSQL's text and jsonb)."""
    text = json.dumps(value, ensure_ascii=False)
    text.encode("utf-8")
    return "\x00" not in text and "\\u0000" not in text


@given(any_text)
def test_clean_text_is_storable_and_says_when_it_changed(text):
    cleaned, changed = clean_text(text)
    assert storable(cleaned)
    assert len(cleaned) == len(text)
    assert changed == (cleaned != text)


@given(json_like)
def test_clean_makes_any_json_like_value_storable(value):
    cleaned, changed = clean(value)
    assert storable(cleaned)
    again, changed_again = clean(cleaned)
    assert again == cleaned
    assert not changed_again


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")))
def test_text_that_is_storable_is_left_alone(text):
    assert clean_text(text) == (text, False)


def test_it_replaces_nul_surrogates_and_invalid_utf8():
    assert clean("bad 'a\x00b'") == (f"bad 'a{REPLACEMENT}b'", True)
    assert clean("half \udcff") == (f"half {REPLACEMENT}", True)
    assert clean(b"ok \xff\xfe") == (f"ok {REPLACEMENT}{REPLACEMENT}", True)
    assert clean(b"plain") == ("plain", False)
    assert clean({"k\x00": ["v\x00", 1, None]}) == ({f"k{REPLACEMENT}": [f"v{REPLACEMENT}", 1, None]}, True)


@given(json_like)
def test_first_unstorable_finds_nothing_in_a_cleaned_value(value):
    from orchestrator.foundation.sanitise import first_unstorable

    assert first_unstorable(clean(value)[0]) is None


def test_first_unstorable_names_the_path():
    from orchestrator.foundation.sanitise import first_unstorable

    assert first_unstorable({"a": [1, {"b": "x\x00"}]}, "conf") == "conf.a[1].b"
    assert first_unstorable({"ok": "fine"}) is None


def test_error_text_names_the_error_clipped_and_storable():
    from orchestrator.foundation.sanitise import error_text

    assert error_text(ValueError("bad \x00 value")) == f"ValueError: bad {REPLACEMENT} value"
    assert error_text(ValueError("x" * 1000), limit=20) == "ValueError: " + "x" * 8
