"""A beam-search reply's beams, kept as versions of the reply.

Beam search returns several hypotheses (``Done.beams``, best first). The best is the reply
as it streamed; the others are stored beside it as versions of the same reply, so ‹ ›
switches between them as between regenerated versions. Each version's stats say which
beam it is and its score.
"""
from __future__ import annotations

from core.engine.events import Done
from core.history.records import Message

from gui.chat.conversation import ConversationModel


def beam_stats(rank: int, count: int, score: float) -> dict:
    """What a beam's stats add: its rank among the ``count`` beams returned, and its score."""
    return {"beam": {"rank": rank, "of": count, "score": round(float(score), 6)}}


def store_beams(conversation: ConversationModel, best: Message, done: Done, *,
                model_id: str | None) -> tuple[Message, int]:
    """Store ``done.beams[1:]`` as versions beside ``best`` (the stored reply, its first beam),
    which stays on screen; returns the reply to show (``best`` as updated: its stats name
    its beam) and how many beams were not stored because a version already says them.

    Beam search has no seed: the same settings give the same beams. So regenerating one
    would add a copy of every version; a beam whose text a version of this reply already
    has is left out, and when that is the best beam, that version is shown instead."""
    n = len(done.beams)
    history = conversation.history
    had = {m.text: m for m in reversed(history.siblings(best.id)) if m.id != best.id}  # the oldest wins
    repeats = 0
    for rank, beam in enumerate(done.beams[1:], 2):
        if beam.text in had or beam.text == best.text:
            repeats += 1
            continue
        stats = {"generated_tokens": len(beam.tokens), **beam_stats(rank, n, beam.score)}
        history.add_message(best.conversation_id, role="assistant", text=beam.text, parent_id=best.parent_id,
                            settings=best.settings, seed=best.seed, model_id=model_id, stats=stats,
                            stop_reason=beam.stop_reason, meta={}, make_current=False)
    same = had.get(best.text)
    if same is not None:
        history.delete_message(best.id)
        history.select(same.id)
        return same, repeats + 1
    return history.update_message(best.id, stats={**(best.stats or {}), **beam_stats(1, n, done.beams[0].score)}), \
        repeats


def repeats_note(repeats: int, count: int) -> str:
    """What a beam search whose beams were (partly) there already says on the reply shown."""
    if repeats >= count:
        return (f"The same {count} beams again: beam search has no seed, so the same settings give the same "
                "beams (‹ › walks them). Change Beams, Length penalty or Max new tokens for others.")
    new = count - repeats
    return (f"{repeats} of the {count} beams were versions already; only the {new} new "
            f"{'one was' if new == 1 else 'ones were'} added (‹ ›).")
