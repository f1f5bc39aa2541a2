"""The writer the SIGKILL loop kills (tests/robustness/test_history_failures.py): it adds a
question, streams a reply into a PartialReply and finishes it, turn after turn, printing
what is committed ("C id text") and how far each reply has streamed ("P turn chars")."""
import time

from core.history.partial import PartialReply
from core.history.store import History


def write_until_killed(path: str, run: int) -> int:
    h = History(path)
    c = h.create_conversation(f"run {run}")
    parent = None
    for turn in range(1000):
        text = f"run {run} turn {turn} question"
        parent = h.add_message(c.id, role="user", text=text, parent_id=parent).id
        print("C", parent, text, flush=True)
        p = PartialReply(h, c.id, parent, every_s=0.25, every_chars=400)
        reply = ""
        for j in range(150):
            piece = f"w{j} "
            reply += piece
            p.append(piece)
            print("P", turn, len(reply), flush=True)
            time.sleep(0.002)
        m = p.finish(reply, stop_reason="length")
        parent = m.id
        print("C", m.id, reply, flush=True)
    return 0
