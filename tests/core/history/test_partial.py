"""core.history.partial: a streaming reply is in the store from its first piece, rewritten
as it grows (at most every every_chars / every_s) and made current when it ends."""
from core.history.partial import INCOMPLETE, PartialReply
from core.history.store import History


def test_a_partial_reply_is_saved_as_it_grows_and_finished_in_place():
    with History(":memory:") as h:
        c = h.create_conversation()
        q = h.add_message(c.id, role="user", text="hi")
        p = PartialReply(h, c.id, q.id, every_s=3600, every_chars=10, seed=7)
        assert p.msg_id is None
        p.append("Hel")  # the first piece creates the message at once
        first = h.message(p.msg_id)
        assert (first.text, first.stop_reason, first.seed, first.parent_id) == ("Hel", INCOMPLETE, 7, q.id)
        p.append("lo")  # under every_chars since the last save: not written yet
        assert h.message(p.msg_id).text == "Hel"
        p.append(" there, you")  # 10 or more characters more: written
        assert h.message(p.msg_id).text == "Hello there, you"
        h.set_current_leaf(c.id, q.id)
        done = p.finish("Hello there, you!", stop_reason="eos")
        assert done.id == p.msg_id and (done.text, done.stop_reason, done.seed) == ("Hello there, you!", "eos", 7)
        assert [m.id for m in h.current_path(c.id)] == [q.id, p.msg_id]
        assert len(h.messages(c.id)) == 2  # one reply, rewritten, never a second row


def test_a_reply_that_never_streamed_is_added_when_it_finishes():
    with History(":memory:") as h:
        c = h.create_conversation()
        q = h.add_message(c.id, role="user", text="hi")
        p = PartialReply(h, c.id, q.id)
        p.flush()  # nothing to save yet
        assert p.msg_id is None and h.messages(c.id) == [h.message(q.id)]
        m = p.finish("", stop_reason="cancelled")
        assert (m.text, m.stop_reason, m.parent_id) == ("", "cancelled", q.id)
