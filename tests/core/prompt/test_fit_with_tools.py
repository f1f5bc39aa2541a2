"""A chat whose tools' definitions do not leave room for the message: the refusal says the
tools take the room, not that a ten-word message is too long."""
import pytest

from core.errors import SettingsError
from core.prompt.prompting import fit_dialog
from tests.core.prompt.test_tool_format import WEATHER, fmt, meta3  # noqa: F401 (fixtures)


def test_the_refusal_counts_the_tools_definitions(fmt):
    msgs = [{"role": "user", "content": "Weather in Rome?"}]
    with_tools, bare = len(fmt.encode_dialog(msgs, tools=(WEATHER,))), len(fmt.encode_dialog(msgs))
    with pytest.raises(SettingsError) as e:
        fit_dialog(fmt, msgs, bare + 5, tools=(WEATHER,))
    assert str(e.value) == (f"the last message is {with_tools} tokens, {with_tools - bare} of them the tools' "
                            f"definitions, but only {bare + 5} fit in the prompt: turn some tools off, shorten the "
                            "message or lower max tokens")
    with pytest.raises(SettingsError) as e:  # without tools: as before
        fit_dialog(fmt, msgs, bare - 1)
    assert str(e.value) == (f"the last message is {bare} tokens, but only {bare - 1} fit in the prompt: shorten "
                            "the message or lower max tokens")
