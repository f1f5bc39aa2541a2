"""The suite's own waiting helpers: a wait ends when its condition holds, not at its timeout."""
import threading
import time

from tests.helpers import Collector


def test_a_collector_wait_sees_state_that_no_event_announces():
    """A condition on state outside the events (a server's lane count) holds soon after the
    last event: the wait must notice it then, not sleep out its timeout and pass anyway."""
    col = Collector()
    state = {"lanes": 1}
    col("an event")
    threading.Timer(0.05, state.update, kwargs={"lanes": 0}).start()
    t = time.monotonic()
    assert col.wait(lambda evs: evs and state["lanes"] == 0, timeout=10)
    assert time.monotonic() - t < 2
