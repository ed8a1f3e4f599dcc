"""An engine's health: alive, hung or dead, and why (vLLM's `check_health` reads it).

A fault on purpose (`faults.engine_kills`, `faults.engine_hangs`) is recorded here and met by the step
loop after the step under way; a crash of the loop is recorded the same way, so that callers hear one
error whichever it was.
"""

from __future__ import annotations

from typing import Literal


class EngineDeadError(RuntimeError):
    """The engine's step loop broke (vLLM's name): its requests failed with the cause, and it takes no
    more (as a dead actor answers every call with an error)."""


class EngineHealth:
    def __init__(self, engine_id: str) -> None:
        self.engine_id = engine_id
        self.dead: EngineDeadError | None = None
        """Why the step loop broke (then nothing is taken)."""
        self.killed: EngineDeadError | None = None
        """A kill (`inject`) the step loop has yet to meet."""
        self.hung_why: str | None = None
        """Why the step loop takes no more steps (`inject`)."""

    def check(self) -> None:
        """Raise `EngineDeadError` if the step loop broke or was killed."""
        if self.dead is not None:
            raise self.dead

    def inject(self, fault: Literal["kill", "hang"], why: str) -> None:
        """kill: the step loop is to stop as if it broke; hang: it is to take no more steps."""
        if fault == "kill":
            self.killed = EngineDeadError(f"engine {self.engine_id} killed: {why}")
        else:
            self.hung_why = f"engine {self.engine_id} hung: {why}"

    def loop_broke(self, e: Exception) -> bool:
        """The step loop ended with `e`: the engine is dead; True if `e` is a kill (on purpose)."""
        killed = e is self.killed
        self.dead = (
            self.killed
            if killed
            else EngineDeadError(f"engine {self.engine_id} crashed: {type(e).__name__}: {e}")
        )
        return killed
