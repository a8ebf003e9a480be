"""Whether an engine can be used here: one vocabulary, from the compatibility rule to a test-load.

Each step adds its words to the one before it:

- the rule (`Backend.compatibility`, decided from a host's fingerprint, which a worker's routing
  asks too: `service.jobs.routing.can_run`): COMPATIBLE or INCOMPATIBLE, UNKNOWN where there is no
  engine to decide on (not READY, its blob missing);
- checking the blob (`engine check`, every load): CORRUPT, its bytes no longer match its digest;
- checking its signed statement (`core.signing`, where trusted keys are configured): TAMPERED, a
  signature or statement that does not match the row, its bytes or the request; UNTRUSTED, no
  signature by a key trusted here;
- loading it: INCOMPATIBLE (the backend's own validity test refuses it), ERROR (the runtime could
  not load it, or the run could not be made);
- a test-load's run: PASS or FAIL, its outputs within the precision's tolerances or not.

The rule's answers are written as the value (lower case: `engine check`, host profiles, coverage);
a load's and a test-load's as `outcome` (upper case: the catalog's load runs, `EngineRejectedError`,
the CLI's test-load).
"""

from __future__ import annotations

from enum import StrEnum


class Verdict(StrEnum):
    COMPATIBLE = "compatible"
    INCOMPATIBLE = "incompatible"
    UNKNOWN = "unknown"
    CORRUPT = "corrupt"
    TAMPERED = "tampered"
    UNTRUSTED = "untrusted"
    ERROR = "error"
    PASS = "pass"
    FAIL = "fail"

    @property
    def outcome(self) -> str:
        """The word as a load or test-load writes it: "INCOMPATIBLE"."""
        return self.value.upper()

    @classmethod
    def of_outcome(cls, word: str) -> Verdict:
        """The verdict a load or test-load wrote as `word` ("PASS"); ValueError for another word."""
        return cls(word.lower())


LOAD_OUTCOMES: tuple[Verdict, ...] = (Verdict.PASS, Verdict.FAIL, Verdict.INCOMPATIBLE, Verdict.CORRUPT, Verdict.ERROR)
"""What a test-load's run comes to (the catalog's load runs)."""
