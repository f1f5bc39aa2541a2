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


def store_beams(conversation: ConversationModel, best: Message, done: Done, *, model_id: str | None) -> Message:
    """Store ``done.beams[1:]`` as versions beside ``best`` (the stored reply, its first beam),
    which stays on screen; returns ``best`` as updated (its stats name its beam)."""
    n = len(done.beams)
    history = conversation.history
    for rank, beam in enumerate(done.beams[1:], 2):
        stats = {"generated_tokens": len(beam.tokens), **beam_stats(rank, n, beam.score)}
        history.add_message(best.conversation_id, role="assistant", text=beam.text, parent_id=best.parent_id,
                            settings=best.settings, seed=best.seed, model_id=model_id, stats=stats,
                            stop_reason=beam.stop_reason, meta={}, make_current=False)
    return history.update_message(best.id, stats={**(best.stats or {}), **beam_stats(1, n, done.beams[0].score)})
